#include "image_loader.h"

#include <string.h>

#include "checksum.h"
#include "ranks.h"
#include "tensor_table.h"
#include "weights.h"

static const uint8_t image_magic[8] = {'C', 'O', 'L', 'I', 'B', 'R', 'I', 'W'};
static const uint8_t end_magic[4] = {'C', 'E', 'N', 'D'};

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const uint8_t *p)
{
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

/* a + b without wrapping; returns 0 on overflow. */
static int add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b) {
        return 0;
    }
    *out = a + b;
    return 1;
}

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a) {
        return 0;
    }
    *out = a * b;
    return 1;
}

/* CRC-32 of len bytes, fed at most 1 MiB at a time so size_t stays in range on 32-bit targets. */
static uint32_t crc32_chunked(const uint8_t *data, uint64_t len)
{
    uint32_t crc = 0;
    for (uint64_t done = 0; done < len;) {
        uint64_t chunk = len - done > (1u << 20) ? (1u << 20) : len - done;
        crc = crc32_update(crc, data + done, (size_t)chunk);
        done += chunk;
    }
    return crc;
}

const char *colibri_status_message(int status)
{
    switch (status) {
    case COLIBRI_OK: return "ok";
    case COLIBRI_ERR_NO_IMAGE: return "no weight image";
    case COLIBRI_ERR_TRUNCATED: return "weight image is truncated";
    case COLIBRI_ERR_MAGIC: return "not a Colibri weight image";
    case COLIBRI_ERR_VERSION: return "unsupported weight image format version (regenerate it with ./colibri build)";
    case COLIBRI_ERR_HEADER: return "weight image header is malformed";
    case COLIBRI_ERR_LENGTH: return "weight image length does not match its header";
    case COLIBRI_ERR_CHECKSUM: return "weight image is corrupted (CRC-32 of its header and directory mismatch)";
    case COLIBRI_ERR_TENSOR_COUNT: return "weight image has a different number of tensors than this firmware";
    case COLIBRI_ERR_DIRECTORY_RANGE: return "weight image directory lies outside the image";
    case COLIBRI_ERR_DATA_RANGE: return "weight image data region lies outside the image";
    case COLIBRI_ERR_ALIGNMENT: return "weight image data is not 64-byte aligned";
    case COLIBRI_ERR_QUANT: return "weight image quantization differs from this firmware's";
    case COLIBRI_ERR_MODEL_HASH: return "weight image is for another model (model hash differs)";
    case COLIBRI_ERR_TENSOR: return "weight image tensor directory differs from this firmware's plan";
    case COLIBRI_ERR_OVERFLOW: return "weight image sizes overflow";
    case COLIBRI_ERR_WEIGHTS_SHA256: return "weight image is not the one this firmware was built for (SHA-256 differs)";
    case COLIBRI_ERR_TENSOR_CHECKSUM: return "weight image tensor data is corrupted (a tensor's CRC-32 mismatch)";
    case COLIBRI_ERR_READ: return "reading an expert from the weight image file failed";
    case COLIBRI_ERR_RANKS: return "the weight images were made for another number of ranks than run (rebuild for as many ranks as --hosts gives)";
    case COLIBRI_ERR_RANK: return "weight image is another rank's: each rank needs its own (weights.rankN.img)";
    default: return "unknown error";
    }
}

uint64_t colibri_image_length_in_region(const uint8_t *region, uint64_t region_bytes)
{
    if (region == NULL || region_bytes < COLIBRI_IMAGE_HEADER_BYTES) {
        return region_bytes;
    }
    uint64_t declared = rd_u64(region + COLIBRI_IMAGE_IMAGE_BYTES_AT);
    return declared < region_bytes ? declared : region_bytes;
}

int colibri_image_open(const uint8_t *image, uint64_t image_len, ColibriWeights *weights)
{
    return colibri_image_open_checking(image, image_len, weights, COLIBRI_CHECK_ALL);
}

int colibri_image_check_length(const uint8_t *header, uint64_t image_len)
{
    if (header == NULL) {
        return COLIBRI_ERR_NO_IMAGE;
    }
    if (image_len < (uint64_t)COLIBRI_IMAGE_HEADER_BYTES + COLIBRI_IMAGE_TRAILER_BYTES) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (memcmp(header + COLIBRI_IMAGE_MAGIC_AT, image_magic, sizeof image_magic) != 0) {
        return COLIBRI_ERR_MAGIC;
    }
    if (rd_u32(header + COLIBRI_IMAGE_VERSION_AT) != COLIBRI_IMAGE_FORMAT_VERSION) {
        return COLIBRI_ERR_VERSION;
    }
    if (rd_u32(header + COLIBRI_IMAGE_HEADER_BYTES_AT) != COLIBRI_IMAGE_HEADER_BYTES ||
        rd_u32(header + COLIBRI_IMAGE_DIR_ENTRY_BYTES_AT) != COLIBRI_IMAGE_DIR_ENTRY_BYTES) {
        return COLIBRI_ERR_HEADER;
    }
    uint64_t declared_len = rd_u64(header + COLIBRI_IMAGE_IMAGE_BYTES_AT);
    if (declared_len > image_len) {
        return COLIBRI_ERR_TRUNCATED;
    }
    if (declared_len != image_len) {
        return COLIBRI_ERR_LENGTH;
    }
    return COLIBRI_OK;
}

int colibri_image_open_checking(const uint8_t *image, uint64_t image_len, ColibriWeights *weights, colibri_check check)
{
    if (image == NULL || weights == NULL) {
        return COLIBRI_ERR_NO_IMAGE;
    }
    const int length = colibri_image_check_length(image, image_len);
    if (length != COLIBRI_OK) {
        return length;
    }
    uint64_t crc_at = image_len - COLIBRI_IMAGE_TRAILER_BYTES;
    if (memcmp(image + crc_at + 4, end_magic, sizeof end_magic) != 0) {
        return COLIBRI_ERR_TRUNCATED;
    }
    /* The trailer's CRC covers the header and directory: every byte before the data region. */
    uint64_t data_offset = rd_u64(image + COLIBRI_IMAGE_DATA_OFFSET_AT);
    if (data_offset < COLIBRI_IMAGE_HEADER_BYTES || data_offset > crc_at) {
        return COLIBRI_ERR_DATA_RANGE;
    }
    uint32_t crc = crc32_chunked(image, data_offset);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* fuzzing: let mutated images past the CRC */
    if (crc != rd_u32(image + crc_at)) {
        return COLIBRI_ERR_CHECKSUM;
    }
#else
    (void)crc;
#endif

    uint32_t tensor_count = rd_u32(image + COLIBRI_IMAGE_TENSOR_COUNT_AT);
    if (tensor_count != COLIBRI_IMAGE_TENSOR_COUNT) {
        return COLIBRI_ERR_TENSOR_COUNT;
    }
    uint64_t dir_offset = rd_u64(image + COLIBRI_IMAGE_DIR_OFFSET_AT);
    uint64_t dir_bytes, dir_end;
    if (!mul_u64(tensor_count, COLIBRI_IMAGE_DIR_ENTRY_BYTES, &dir_bytes) || !add_u64(dir_offset, dir_bytes, &dir_end)) {
        return COLIBRI_ERR_OVERFLOW;
    }
    if (dir_offset < COLIBRI_IMAGE_HEADER_BYTES || dir_end > crc_at) {
        return COLIBRI_ERR_DIRECTORY_RANGE;
    }
    uint64_t data_bytes = rd_u64(image + COLIBRI_IMAGE_DATA_BYTES_AT);
    uint64_t data_end;
    if (!add_u64(data_offset, data_bytes, &data_end)) {
        return COLIBRI_ERR_OVERFLOW;
    }
    if (data_offset < dir_end || data_end > crc_at) {
        return COLIBRI_ERR_DATA_RANGE;
    }
    if (data_offset % COLIBRI_IMAGE_ALIGN != 0 || ((uintptr_t)image % COLIBRI_IMAGE_ALIGN) != 0) {
        return COLIBRI_ERR_ALIGNMENT;
    }
    if (rd_u32(image + COLIBRI_IMAGE_QUANT_AT) != COLIBRI_QUANT_CODE) {
        return COLIBRI_ERR_QUANT;
    }
    if (memcmp(image + COLIBRI_IMAGE_MODEL_HASH_AT, colibri_model_hash, 32) != 0) {
        return COLIBRI_ERR_MODEL_HASH;
    }
    /* A rank's image names its rank and the rank count; a single board's whole image, neither. */
    if (ranks_count() != COLIBRI_IMAGE_RANKS) {
        return COLIBRI_ERR_RANKS;
    }
    const uint32_t own_rank = COLIBRI_IMAGE_RANKS > 1 ? (uint32_t)ranks_rank() : 0u;
    if (rd_u32(image + COLIBRI_IMAGE_RANK_AT) != own_rank ||
        rd_u32(image + COLIBRI_IMAGE_RANKS_AT) != (COLIBRI_IMAGE_RANKS > 1 ? (uint32_t)COLIBRI_IMAGE_RANKS : 0u)) {
        return COLIBRI_ERR_RANK;
    }
    const ColibriRankImage *held = colibri_rank_image();
    if (data_offset != COLIBRI_IMAGE_DATA_OFFSET || data_bytes != held->data_bytes) {
        return COLIBRI_ERR_TENSOR;
    }
    for (uint32_t i = 0; i < tensor_count; i++) {
        const uint8_t *e = image + dir_offset + (uint64_t)i * COLIBRI_IMAGE_DIR_ENTRY_BYTES;
        ColibriTensorEntry want;
        colibri_expected_tensor(i, &want);
        uint64_t offset = rd_u64(e + COLIBRI_ENTRY_OFFSET_AT), bytes = rd_u64(e + COLIBRI_ENTRY_BYTES_AT), end;
        if (memcmp(e + COLIBRI_ENTRY_NAME_AT, want.name, COLIBRI_IMAGE_NAME_BYTES) != 0 ||
            rd_u32(e + COLIBRI_ENTRY_DTYPE_AT) != want.dtype || rd_u32(e + COLIBRI_ENTRY_ROWS_AT) != want.rows ||
            rd_u32(e + COLIBRI_ENTRY_COLS_AT) != want.cols ||
            offset != want.offset || bytes != want.bytes) {
            return COLIBRI_ERR_TENSOR;
        }
        if (!add_u64(offset, bytes, &end)) {
            return COLIBRI_ERR_OVERFLOW;
        }
        if (end > data_bytes) {
            return COLIBRI_ERR_DATA_RANGE;
        }
    }
    /* The header and directory must be those this firmware was generated with, not just claim its
     * model hash: they hold the model hash over all data and every tensor's CRC-32. */
    Sha256 sha;
    uint8_t digest[32];
    sha256_init(&sha);
    for (uint64_t done = 0; done < data_offset;) {
        uint64_t chunk = data_offset - done > 65536u ? 65536u : data_offset - done;
        sha256_update(&sha, image + done, (size_t)chunk);
        done += chunk;
    }
    sha256_final(&sha, digest);
    if (memcmp(digest, held->weights_sha256, 32) != 0) {
        return COLIBRI_ERR_WEIGHTS_SHA256;
    }
    for (uint32_t i = 0; i < tensor_count; i++) {
        if (check == COLIBRI_CHECK_RESIDENT && colibri_tensor_is_expert(i)) {
            continue; /* checked when first brought in */
        }
        int status = colibri_image_check_tensor(image, i);
        if (status != COLIBRI_OK) {
            return status;
        }
    }
    colibri_bind_weights(image + data_offset, weights);
    return COLIBRI_OK;
}

int colibri_image_check_tensor(const uint8_t *image, uint32_t index)
{
    /* The directory and the plan agree (colibri_image_open checked), so the plan's offsets are the
     * image's. */
    ColibriTensorEntry t;
    colibri_expected_tensor(index, &t);
    return colibri_image_check_tensor_copy(image, index, image + COLIBRI_IMAGE_DATA_OFFSET + t.offset);
}

int colibri_image_check_tensor_copy(const uint8_t *image, uint32_t index, const uint8_t *bytes)
{
    ColibriTensorEntry t;
    colibri_expected_tensor(index, &t);
    const uint8_t *entry = image + COLIBRI_IMAGE_DIR_OFFSET + (uint64_t)index * COLIBRI_IMAGE_DIR_ENTRY_BYTES;
    /* Its bytes and its padding up to the next tensor, so that no byte of the data region goes unchecked. */
    uint64_t extent = (t.bytes + COLIBRI_IMAGE_ALIGN - 1) / COLIBRI_IMAGE_ALIGN * COLIBRI_IMAGE_ALIGN;
    uint32_t crc = crc32_chunked(bytes, extent);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    if (crc != rd_u32(entry + COLIBRI_ENTRY_CRC32_AT)) {
        return COLIBRI_ERR_TENSOR_CHECKSUM;
    }
#else
    (void)crc;
    (void)entry;
#endif
    return COLIBRI_OK;
}
