/* libFuzzer target for every kept GGUF block type's C decoders (firmware_src/runtime/kernels):
 * any bytes, read as rows of a type's blocks, go through kernel_<type>_unpack for every 32-value
 * group and kernel_unpacked_value for every value, through the scalar reference matvec and through
 * the AVX2 set's matvec (when this CPU runs it). ASan and UBSan watch every read (the rows are an
 * exact-size copy of the input) and every operation; for blocks whose scales are all finite (the
 * only ones a weight image holds: the others are refused when it is built) the two matvecs must
 * give the same bits, NaN for NaN (docs/numerics.md: one definition on every kernel set). Input: byte 0 picks the type,
 * byte 1 the row count (1..4), byte 2 seeds the activation; the rest are the rows' blocks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
int x86_avx2_usable(void); /* kernels/x86_avx2/cpu.c: this CPU runs the AVX2 set */

typedef void (*Matvec)(float *, const uint8_t *, const int8_t *, const float *, int, int);
typedef void (*Unpack)(const uint8_t *, int, KernelUnpacked *);

typedef struct {
    int values, bytes, affine;
    Unpack unpack;
    Matvec scalar, kernel;
    int halves[2]; /* byte offsets of the block's binary16 fields (-1: none) */
} BlockType;

static const BlockType TYPES[] = {
    {KERNEL_Q5_0_VALUES, KERNEL_Q5_0_BYTES, 0, kernel_q5_0_unpack, kernel_scalar_matvec_q5_0, kernel_matvec_q5_0, {0, -1}},
    {KERNEL_Q5_1_VALUES, KERNEL_Q5_1_BYTES, 1, kernel_q5_1_unpack, kernel_scalar_matvec_q5_1, kernel_matvec_q5_1, {0, 2}},
    {KERNEL_Q4_K_VALUES, KERNEL_Q4_K_BYTES, 1, kernel_q4_k_unpack, kernel_scalar_matvec_q4_k, kernel_matvec_q4_k, {0, 2}},
    {KERNEL_Q5_K_VALUES, KERNEL_Q5_K_BYTES, 1, kernel_q5_k_unpack, kernel_scalar_matvec_q5_k, kernel_matvec_q5_k, {0, 2}},
    {KERNEL_Q6_K_VALUES, KERNEL_Q6_K_BYTES, 0, kernel_q6_k_unpack, kernel_scalar_matvec_q6_k, kernel_matvec_q6_k, {208, -1}},
    {KERNEL_Q3_K_VALUES, KERNEL_Q3_K_BYTES, 0, kernel_q3_k_unpack, kernel_scalar_matvec_q3_k, kernel_matvec_q3_k, {108, -1}},
    {KERNEL_Q2_K_VALUES, KERNEL_Q2_K_BYTES, 1, kernel_q2_k_unpack, kernel_scalar_matvec_q2_k, kernel_matvec_q2_k, {80, 82}},
    {KERNEL_IQ4_NL_VALUES, KERNEL_IQ4_NL_BYTES, 0, kernel_iq4_nl_unpack, kernel_scalar_matvec_iq4_nl,
     kernel_matvec_iq4_nl, {0, -1}},
    {KERNEL_IQ4_XS_VALUES, KERNEL_IQ4_XS_BYTES, 0, kernel_iq4_xs_unpack, kernel_scalar_matvec_iq4_xs,
     kernel_matvec_iq4_xs, {0, -1}},
    {KERNEL_MXFP4_VALUES, KERNEL_MXFP4_BYTES, 0, kernel_mxfp4_unpack, kernel_scalar_matvec_mxfp4,
     kernel_matvec_mxfp4, {-1, -1}},
};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))
#define MAX_COLS 4096

static int same_bits(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) {
        return 0;
    }
    const BlockType *t = &TYPES[data[0] % N_TYPES];
    const int rows = 1 + data[1] % 4;
    const uint32_t seed = data[2];
    data += 3;
    size -= 3;
    const int blocks = (int)(size / (size_t)rows / (size_t)t->bytes);
    const int cols = blocks * t->values;
    if (blocks == 0 || cols > MAX_COLS) {
        return 0;
    }
    const size_t row_bytes = (size_t)blocks * (size_t)t->bytes;
    uint8_t *w = malloc(row_bytes * (size_t)rows); /* exactly the rows: ASan sees any read past them */
    int8_t *x_qs = malloc((size_t)cols);
    float *x_d = malloc(sizeof(float) * (size_t)(cols / KERNEL_QK));
    float out_scalar[4], out_kernel[4];
    if (w == NULL || x_qs == NULL || x_d == NULL) {
        abort();
    }
    memcpy(w, data, row_bytes * (size_t)rows);
    uint32_t s = seed * 2654435761u + 1u;
    for (int i = 0; i < cols; i++) {
        s = s * 1664525u + 1013904223u;
        x_qs[i] = (int8_t)((int)(s >> 24) % 255 - 127); /* q8_0 activations: -127..127, as quantized */
    }
    for (int b = 0; b < cols / KERNEL_QK; b++) {
        x_d[b] = ldexpf(1.0f, (int)(seed % 16) - 12 + b % 3);
    }
    /* What the image builder lets through (it refuses the rest): no binary16 field infinite or NaN,
     * and every value finite (an MXFP4 exponent of 0xFF, or one that overflows float32). */
    int admitted = 1;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        for (int k = 0; k < blocks; k++) {
            for (int h = 0; h < 2; h++) {
                if (t->halves[h] >= 0) {
                    const uint8_t *f = row + (size_t)k * (size_t)t->bytes + t->halves[h];
                    admitted = admitted && (f[1] & 0x7C) != 0x7C;
                }
            }
        }
        for (int b = 0; b < cols / KERNEL_QK; b++) {
            KernelUnpacked u;
            t->unpack(row, b, &u);
            for (int l = 0; l < KERNEL_QK; l++) {
                admitted = admitted && isfinite(kernel_unpacked_value(&u, l, t->affine));
            }
        }
    }
    t->scalar(out_scalar, w, x_qs, x_d, rows, cols);
    if (admitted && x86_avx2_usable()) {
        t->kernel(out_kernel, w, x_qs, x_d, rows, cols);
        for (int r = 0; r < rows; r++) {
            if (!same_bits(out_scalar[r], out_kernel[r])) {
                fprintf(stderr, "row %d: scalar %a, kernel %a\n", r, (double)out_scalar[r], (double)out_kernel[r]);
                __builtin_trap(); /* the AVX2 set and the scalar reference differ */
            }
        }
    }
    free(w);
    free(x_qs);
    free(x_d);
    return 0;
}
