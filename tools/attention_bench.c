/* The host's decode attention alone over a binary16 KV cache (docs/performance.md, "At 4,096
 * positions"): one token's scores, softmax and value sums for every layer and KV head of a
 * SmolLM2-135M-shaped model (30 layers, 3 KV heads shared by 3 query heads each, heads of 64),
 * with a stream of "weights" read between layers as a decode reads them, so that each KV head's
 * keys and values start cold as they do in the firmware. The median of 7 tokens, wall time.
 *
 *   RT=firmware_src/runtime
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -ffp-contract=off -fno-math-errno -I$RT tools/attention_bench.c $RT/ops.c \
 *       $RT/kernels/scalar.c $RT/kernels/x86_avx2/[a-z]*.c -lm -o /tmp/attention_bench
 *   /tmp/attention_bench [positions 4096] [weight MB read between the layers 143] [huge: 1 = the
 *       cache in 2 MiB pages, as the Linux firmware asks for it; 0 = 4 KiB pages]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/kernels.h"

enum { LAYERS = 30, KV_HEADS = 3, GROUP = 3, HEAD_DIM = 64, TOKENS = 7 };

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* n bytes at a 2 MiB boundary, in 2 MiB pages if huge (transparent huge pages on request). */
static void *arena(size_t n, int huge)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, n) != 0) {
        return NULL;
    }
    if (huge) {
        madvise(p, n, MADV_HUGEPAGE);
    }
    return p;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v)
{
    qsort(v, TOKENS, sizeof *v, by_value);
    return v[TOKENS / 2];
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 4096;
    const int weight_mb = argc > 2 ? atoi(argv[2]) : 143;
    const int huge = argc > 3 ? atoi(argv[3]) : 1;
    if (n <= 0 || weight_mb < 0 || (huge != 0 && huge != 1)) {
        fprintf(stderr, "usage: attention_bench [positions > 0] [weight MB >= 0] [huge 0|1]\n");
        return 2;
    }
    const size_t head_values = (size_t)n * HEAD_DIM, values = head_values * LAYERS * KV_HEADS;
    KernelHalf *keys = arena(values * sizeof(KernelHalf), huge), *vals = arena(values * sizeof(KernelHalf), huge);
    const size_t weight_bytes = (size_t)weight_mb << 20;
    unsigned char *weights = weight_bytes ? malloc(weight_bytes) : NULL;
    float *q = malloc(sizeof(float) * GROUP * HEAD_DIM), *att = malloc(sizeof(float) * GROUP * (size_t)n);
    float *out = malloc(sizeof(float) * GROUP * HEAD_DIM), *tile = malloc(sizeof(float) * 64 * HEAD_DIM);
    if (!keys || !vals || (weight_bytes && !weights) || !q || !att || !out || !tile) {
        fprintf(stderr, "attention_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < values; i++) { /* binary16 values in [0.125, 0.25): no overflow anywhere */
        keys[i] = (KernelHalf)(0x3000 + (i * 7919u % 1024u));
        vals[i] = (KernelHalf)(0x3000 + (i * 104729u % 1024u));
    }
    if (weights) {
        memset(weights, 1, weight_bytes);
    }
    for (int i = 0; i < GROUP * HEAD_DIM; i++) {
        q[i] = 0.01f * (float)(i % 17);
    }
    double total[TOKENS], scores[TOKENS], softmax[TOKENS], mix[TOKENS];
    unsigned long read = 0;
    for (int t = 0; t < TOKENS; t++) {
        const double start = seconds();
        scores[t] = softmax[t] = mix[t] = 0;
        for (int l = 0; l < LAYERS; l++) {
            const size_t share = weight_bytes / LAYERS;
            for (size_t i = 0; i < share; i += 64) { /* one read a line, as a matvec streams its rows */
                read += weights[share * l + i];
            }
            for (int g = 0; g < KV_HEADS; g++) {
                const size_t at = ((size_t)l * KV_HEADS + g) * head_values;
                const double a = seconds();
                kernel_attention_scores_f16(att, n, q, HEAD_DIM, GROUP, keys + at, HEAD_DIM, n, HEAD_DIM, 0.125f, tile, 64);
                const double b = seconds();
                kernel_softmax_rows(att, n, GROUP, n);
                for (int i = 0; i < GROUP * HEAD_DIM; i++) {
                    out[i] = -0.0f;
                }
                const double c = seconds();
                kernel_attention_mix_f16(out, HEAD_DIM, att, n, GROUP, vals + at, HEAD_DIM, n, HEAD_DIM, tile, 64);
                const double d = seconds();
                scores[t] += b - a;
                softmax[t] += c - b;
                mix[t] += d - c;
            }
        }
        total[t] = seconds() - start;
    }
    const double kv_mb = 2.0 * (double)values * sizeof(KernelHalf) / 1e6;
    const double s = median(scores), m = median(mix);
    printf("%d positions, %.1f MB of keys and values, %d MB of weights between layers, %s pages, host kernel set "
           "%s\n",
           n, kv_mb, weight_mb, huge ? "2 MiB" : "4 KiB", kernel_set());
    printf("a token: %.2f ms; scores %.2f ms (%.1f GB/s), softmax %.2f ms, value sums %.2f ms (%.1f GB/s)\n",
           median(total) * 1e3, s * 1e3, kv_mb / 2 / 1e3 / s, median(softmax) * 1e3, m * 1e3, kv_mb / 2 / 1e3 / m);
    return read == 1 ? 3 : 0; /* the weights' reads kept */
}
