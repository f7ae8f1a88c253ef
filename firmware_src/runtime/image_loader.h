/* Weight image loader: validates an image in a caller-owned buffer against the plan compiled into
 * this firmware (model_def.h) and binds the weight pointers. It never asserts on its input: every
 * problem is an error code. All size arithmetic is 64-bit and checked (size_t is 32-bit on MCUs). */
#ifndef COLIBRI_IMAGE_LOADER_H
#define COLIBRI_IMAGE_LOADER_H

#include <stdint.h>

#include "model_def.h"

typedef enum {
    COLIBRI_OK = 0,
    COLIBRI_ERR_NO_IMAGE = 1,        /* null buffer */
    COLIBRI_ERR_TRUNCATED = 2,       /* shorter than header + trailer, or than the header says */
    COLIBRI_ERR_MAGIC = 3,           /* not a Colibri weight image */
    COLIBRI_ERR_VERSION = 4,         /* image format version not supported */
    COLIBRI_ERR_HEADER = 5,          /* header or directory entry size wrong */
    COLIBRI_ERR_LENGTH = 6,          /* image length field differs from the buffer length */
    COLIBRI_ERR_CHECKSUM = 7,        /* CRC-32 of the header and directory mismatch: corrupted image */
    COLIBRI_ERR_TENSOR_COUNT = 8,    /* tensor count differs from this firmware's plan */
    COLIBRI_ERR_DIRECTORY_RANGE = 9, /* directory outside the image */
    COLIBRI_ERR_DATA_RANGE = 10,     /* data region outside the image or overlapping the directory */
    COLIBRI_ERR_ALIGNMENT = 11,      /* data or buffer not 64-byte aligned */
    COLIBRI_ERR_QUANT = 12,          /* quantization differs from this firmware's */
    COLIBRI_ERR_MODEL_HASH = 13,     /* a valid image of another model */
    COLIBRI_ERR_TENSOR = 14,         /* a directory entry differs from this firmware's plan */
    COLIBRI_ERR_OVERFLOW = 15,       /* a size computation overflows 64 bits */
    COLIBRI_ERR_WEIGHTS_SHA256 = 16, /* well-formed, but not the image this firmware was built for */
    COLIBRI_ERR_TENSOR_CHECKSUM = 17, /* a tensor's bytes differ from its CRC-32 in the directory */
    COLIBRI_ERR_READ = 18,           /* reading an expert from the image file failed or came up short */
    COLIBRI_ERR_RANKS = 19,          /* the firmware runs as another number of ranks than its images were made for */
    COLIBRI_ERR_RANK = 20,           /* this build's image, but another rank's (or the whole one on a rank) */
} colibri_status;

const char *colibri_status_message(int status);

/* Which tensors colibri_image_open_checking checks against their CRC-32 at open. */
typedef enum {
    COLIBRI_CHECK_ALL = 0,      /* every tensor (MCU boards: weights in flash, read in place) */
    COLIBRI_CHECK_RESIDENT = 1, /* all but the routed experts' matrices (colibri_expert_groups): a
                                 * mapped image's start-up does not grow with its experts; each expert
                                 * is checked when first brought in (runtime/expert_cache.c) */
} colibri_check;

/* The header's first checks (magic, version, sizes) and the length it declares against the
 * image's: COLIBRI_OK, COLIBRI_ERR_TRUNCATED (shorter) or COLIBRI_ERR_LENGTH (longer), reading only
 * the first COLIBRI_IMAGE_HEADER_BYTES at `header` (all of them when image_len holds a header). A
 * file is checked so before anything reads the rest of it: a valid image padded to gigabytes is
 * refused unread. colibri_image_open starts with it. */
int colibri_image_check_length(const uint8_t *header, uint64_t image_len);

/* Checks the header, the directory and every tensor's CRC-32, then binds the weight pointers. */
int colibri_image_open(const uint8_t *image, uint64_t image_len, ColibriWeights *weights);

/* The same, checking the tensors `check` names. */
int colibri_image_open_checking(const uint8_t *image, uint64_t image_len, ColibriWeights *weights, colibri_check check);

/* Directory entry `index` (runtime/tensor_table.h) of an image that colibri_image_open accepted, against its
 * CRC-32 in the directory: COLIBRI_OK or COLIBRI_ERR_TENSOR_CHECKSUM. */
int colibri_image_check_tensor(const uint8_t *image, uint32_t index);

/* The same for a copy of the tensor's extent (its bytes and padding to COLIBRI_IMAGE_ALIGN) at `bytes`,
 * e.g. read into an expert slot; the CRC-32 comes from the image's directory. index below
 * COLIBRI_IMAGE_TENSOR_COUNT (the caller's table says so). */
int colibri_image_check_tensor_copy(const uint8_t *image, uint32_t index, const uint8_t *bytes);

/* For an image stored at the start of a larger region (flash, a partition): the length to give
 * colibri_image_open — the length its header declares, bounded by the region. */
uint64_t colibri_image_length_in_region(const uint8_t *region, uint64_t region_bytes);

#endif
