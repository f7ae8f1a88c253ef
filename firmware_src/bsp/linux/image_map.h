/* The weight image file in this process's memory: mapped read-only from a 2 MiB boundary (or copied
 * whole: --copy-weights), read into private memory in 2 MiB pages in its place (the whole image
 * where it fits, or under a budget its resident part, locked), the KV arenas advised into 2 MiB
 * pages, and the SIGBUS handler that turns a fault on the mapping into an error frame. */
#ifndef COLIBRI_BSP_LINUX_IMAGE_MAP_H
#define COLIBRI_BSP_LINUX_IMAGE_MAP_H

#include <stddef.h>
#include <stdint.h>

/* The whole image read into one 64-byte aligned buffer (free() it), or NULL: how the firmware held
 * its weights before it mapped them (--copy-weights keeps it for comparisons). Its header is read
 * and checked first (colibri_image_check_length): a file of another length than the header says is
 * not read, NULL with *refused set to the loader's status (left as it was otherwise). */
uint8_t *copy_image(const char *path, uint64_t *len, int *refused);

/* The image mapped read-only (private: nothing is ever written), or NULL; the mapping starts on a
 * huge page's boundary, so that the image's bytes keep their offsets within huge pages. The file
 * stays open, to tell whether it changes (image_changed). */
uint8_t *map_image(const char *path, uint64_t *len);

/* Whether the file this firmware mapped was truncated or written since (a rename over its path
 * leaves it as it was: this firmware keeps it). 0 once the image is read into memory. */
int image_changed(void);

/* From now on a fault on the mapped image [image, image + len) ends the run with an error frame
 * saying where (which layer's experts, or the resident weights) instead of a crash. */
void catch_mapping_faults(const uint8_t *image, uint64_t len);

/* The whole mapped image read into memory in 2 MiB pages in its place, and the file closed (nothing
 * reads it afterwards): 0, or -1 when the file cannot be read. */
int read_image_into_memory(uint8_t *image, uint64_t len);

/* Under a budget: the resident part (everything but the routed experts and Gemma 4's per-layer
 * input table) read into private memory in place of its mapped pages, and locked. Returns the bytes
 * held, or -1 when the file cannot be read; *refused says whether mlock refused any of it. */
int64_t hold_resident(uint8_t *image, uint64_t len, int *refused);

/* The mapping undone and the file closed. */
void unmap_image(uint8_t *image, uint64_t len);

/* The KV cache's arena asked for in 2 MiB pages, before a key is written. */
void kv_cache_in_huge_pages(void *arena, size_t bytes);

#endif
