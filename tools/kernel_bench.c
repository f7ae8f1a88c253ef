/* The host's batched products alone: what a pass of 1 to 16 tokens costs against a pass of one
 * (docs/performance.md, "What a pass of n tokens costs"), the kernel set the host board links,
 * random weights from memory (a set of matrices larger than the caches), thread CPU time, the best
 * of five passes over the set for each token count.
 *
 *   RT=firmware_src/runtime
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -ffp-contract=off -fno-math-errno -I$RT tools/kernel_bench.c $RT/ops.c \
 *       $RT/kernels/scalar.c $RT/kernels/x86_avx2/[a-z]*.c -lm -o /tmp/kernel_bench
 *   /tmp/kernel_bench [q4_1|q4_0|q8_0] [rows 1536] [cols 576] [matrices 60]
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

#define MAX_TOKENS 16

static double thread_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint32_t rng = 1;
static uint32_t next_random(void)
{
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
}

int main(int argc, char **argv)
{
    const char *type = argc > 1 ? argv[1] : "q4_1";
    const int rows = argc > 2 ? atoi(argv[2]) : 1536, cols = argc > 3 ? atoi(argv[3]) : 576;
    const int matrices = argc > 4 ? atoi(argv[4]) : 60;
    const int q8 = strcmp(type, "q8_0") == 0, q4_1 = strcmp(type, "q4_1") == 0;
    if ((!q8 && !q4_1 && strcmp(type, "q4_0") != 0) || rows <= 0 || cols <= 0 || cols % 32 || matrices <= 0) {
        fprintf(stderr, "usage: kernel_bench [q4_1|q4_0|q8_0] [rows] [cols, a multiple of 32] [matrices]\n");
        return 2;
    }
    const int nb = cols / 32;
    const size_t row_bytes = q8 ? (size_t)cols : (size_t)cols / 2, scales = (size_t)rows * nb;
    uint8_t *w = malloc(row_bytes * rows * matrices);
    KernelHalf *d = malloc(sizeof(KernelHalf) * scales * matrices), *m = malloc(sizeof(KernelHalf) * scales * matrices);
    int8_t *x = malloc((size_t)MAX_TOKENS * cols);
    float *x_d = malloc(sizeof(float) * MAX_TOKENS * nb), *out = malloc(sizeof(float) * MAX_TOKENS * rows);
    if (!w || !d || !m || !x || !x_d || !out) {
        fprintf(stderr, "kernel_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < row_bytes * rows * matrices; i++) {
        w[i] = (uint8_t)next_random();
    }
    for (size_t i = 0; i < scales * matrices; i++) {
        d[i] = (KernelHalf)(0x2000 + (next_random() & 0xff)); /* small positive binary16 scales */
        m[i] = (KernelHalf)(0xa000 + (next_random() & 0xff)); /* and negative minimums */
    }
    for (int i = 0; i < MAX_TOKENS * cols; i++) {
        x[i] = (int8_t)next_random();
    }
    for (int i = 0; i < MAX_TOKENS * nb; i++) {
        x_d[i] = 0.01f * (float)(i + 1);
    }
    printf("%s, %d x %d, %d matrices (%.1f MB), host kernel set %s\n", type, rows, cols, matrices,
           (double)(row_bytes * rows + 4.0 * scales) * matrices / 1e6, kernel_set());
    double one = 0;
    for (int n = 1; n <= MAX_TOKENS; n++) {
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            const double start = thread_seconds();
            for (int k = 0; k < matrices; k++) {
                const uint8_t *wk = w + row_bytes * rows * k;
                const KernelHalf *dk = d + scales * k, *mk = m + scales * k;
                if (q8) {
                    kernel_matmul_q8_0(out, rows, (const int8_t *)wk, dk, x, x_d, n, rows, cols);
                } else if (q4_1) {
                    kernel_matmul_q4_1(out, rows, wk, dk, mk, x, x_d, n, rows, cols);
                } else {
                    kernel_matmul_q4_0(out, rows, wk, dk, x, x_d, n, rows, cols);
                }
            }
            const double t = thread_seconds() - start;
            best = t < best ? t : best;
        }
        one = n == 1 ? best : one;
        printf("%d token(s): %.3f ms, %.2f single-token passes\n", n, best * 1e3, best / one);
    }
    return 0;
}
