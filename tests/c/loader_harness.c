/* Test harness for the weight-image loader, built with sanitizers, 32-bit, or for fuzzing:
 *
 *   loader_harness IMAGE...          print the loader's status code for each image
 *   loader_harness --resident IMAGE...  open each checking the resident tensors only (a mapped image
 *                                    on a Linux board), then check every routed expert's tensors as
 *                                    bringing them in does: print "OPEN FIRST_EXPERT_ERROR" (0 0: clean)
 *   loader_harness IMAGE truncations every prefix of IMAGE: print how many got each status
 *   loader_harness IMAGE bitflips    IMAGE with one bit flipped in each byte: the same
 *
 * Each image is handed over in a buffer of exactly its size (64-byte aligned, as a board maps it),
 * so a sanitizer sees any read past its end. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_loader.h"
#include "tensor_table.h"

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(3);
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(*len ? *len : 1);
    if (data == NULL || fread(data, 1, *len, f) != *len) {
        perror(path);
        exit(3);
    }
    fclose(f);
    return data;
}

/* Load `len` bytes of `data` from a fresh aligned buffer of exactly that size. */
static int load(const uint8_t *data, size_t len)
{
    ColibriWeights weights;
    if (len == 0) {
        return colibri_image_open(NULL, 0, &weights);
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 64, len) != 0) {
        exit(4);
    }
    memcpy(buf, data, len);
    int status = colibri_image_open(buf, len, &weights);
    free(buf);
    return status;
}

/* Open checking the resident tensors, then every routed expert's: "open expert" statuses. */
static void load_resident(const uint8_t *data, size_t len, int *open_status, int *expert_status)
{
    ColibriWeights weights;
    *expert_status = 0;
    if (len == 0) {
        *open_status = colibri_image_open_checking(NULL, 0, &weights, COLIBRI_CHECK_RESIDENT);
        return;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, 64, len) != 0) {
        exit(4);
    }
    memcpy(buf, data, len);
    *open_status = colibri_image_open_checking(buf, len, &weights, COLIBRI_CHECK_RESIDENT);
    for (uint32_t i = 0; *open_status == 0 && *expert_status == 0 && i < COLIBRI_IMAGE_TENSOR_COUNT; i++) {
        if (colibri_tensor_is_expert(i)) {
            *expert_status = colibri_image_check_tensor(buf, i);
        }
    }
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: loader_harness IMAGE... | IMAGE truncations | IMAGE bitflips\n");
        return 2;
    }
    if (strcmp(argv[1], "--resident") == 0) {
        for (int i = 2; i < argc; i++) {
            size_t len;
            uint8_t *data = read_file(argv[i], &len);
            int open_status, expert_status;
            load_resident(data, len, &open_status, &expert_status);
            printf("%d %d\n", open_status, expert_status);
            free(data);
        }
        return 0;
    }
    if (argc == 3 && (strcmp(argv[2], "truncations") == 0 || strcmp(argv[2], "bitflips") == 0)) {
        size_t len;
        uint8_t *data = read_file(argv[1], &len);
        long counts[256] = {0};
        if (argv[2][0] == 't') {
            for (size_t n = 0; n < len; n++) {
                counts[load(data, n) & 255]++;
            }
        } else {
            for (size_t i = 0; i < len; i++) {
                data[i] ^= (uint8_t)(1u << (i % 8));
                counts[load(data, len) & 255]++;
                data[i] ^= (uint8_t)(1u << (i % 8));
            }
        }
        for (int s = 0; s < 256; s++) {
            if (counts[s]) {
                printf("%d %ld\n", s, counts[s]);
            }
        }
        free(data);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        size_t len;
        uint8_t *data = read_file(argv[i], &len);
        printf("%d\n", load(data, len));
        free(data);
    }
    return 0;
}
