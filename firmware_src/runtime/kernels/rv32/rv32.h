/* The rv32 kernel set's shared helpers and the declarations between its files.
 *
 * Kernels for rv32imafc MCUs (no SIMD): the scalar kernels' arithmetic, arranged for fewer
 * instructions (``./colibri bench --board qemu-rv32`` counts them exactly, tests/c/rv32_selftest.c
 * each kernel alone). The q8_0 product works on 16 rows at once for a small model's 64- and
 * 128-column matrices and on 8 rows otherwise, with the 32-value block unrolled: every
 * multiply-add is an lb of the weight, a mul and an add, one lb of each activation quant serves
 * all the rows, and each row's binary16 block scale costs eight more per block (half_scaled says
 * why); about 3.31 instructions per multiply-add (3.25 when the scales were float32). Each row's
 * block sums and the reduction tree (kernels.h) are the scalar kernel's, so are the bits. q4_1
 * weights are read in place, eight rows at once (rows8_q4_1 says how), and so is every kept GGUF
 * type, two or four rows at once (kquants.c, blocks.c). Portable C: it is also tested against
 * NumPy on the host.
 *
 * The set's files, by role (kernels.h): set.c its entry table (the entry points it defines,
 * fallback.h for the rest); matvec.c the q8_0 and q4_1 products, matmul.c their batched forms;
 * kquants.c the K-quants (Q2_K ... Q6_K) and blocks.c the other kept GGUF types (Q5_0, Q5_1,
 * IQ4_NL, IQ4_XS, MXFP4); vector.c the KV cache's widening, the activations' quantization and
 * SwiGLU; attention.c attention over a binary16 cache read in place. */
#ifndef COLIBRI_KERNELS_RV32_H
#define COLIBRI_KERNELS_RV32_H

#include "../kernels.h"
#include "../../ops.h"

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__)
/* GCC's first scheduling pass hoists the 256 loads of an unrolled block ahead of their use and
 * then spills the registers it ran out of; in program order the block fits in registers. Its code
 * hoisting would likewise lift the scale loads the two arms of ROWS16_FIXED's first-block branch
 * share above the branch, sixteen more live registers. */
#pragma GCC optimize("no-schedule-insns", "no-code-hoisting")
#endif

/* Weight block scales and q4_1 minimums are binary16 (kernels.h) and rv32imafc has no half
 * precision. A scale's bits h, read sign-extended (an lh), shifted left by 13 put its exponent and
 * mantissa at float32's places and copies of its sign in bits 31..28; keeping bit 31 of those
 * (the mask stays in a register) gives the float32 w_d * 2^-112 exactly, a binary16 subnormal
 * becoming a float32 subnormal: lh, slli, and, fmv.w.x, four instructions where a float32 scale
 * took one flw (no shorter sequence exists: the sign and the other bits move by different
 * amounts). The 2^112 that kernel_half_to_float multiplies back, a fifth instruction per scale,
 * is left to the activation side instead: prescale makes X_b = x_d[b] * 2^112 once per call for
 * all the rows. w_d * 2^-112 times X_b is w_d * x_d[b] as a real number, so the float32 product
 * rounds to the same bits, subnormal, overflowing and zero results and their signs included,
 * provided X_b itself is exact, that is |x_d[b]| < 2^16 (quantized activations have x_d =
 * max|x| / 127, so values up to 8.3e6). A call with a larger (or NaN) activation scale, or with
 * more than XS_BLOCKS blocks, takes the scalar kernel. (w_d * 2^-112 may be subnormal, which
 * RISC-V's F extension computes with exactly: it has no flush-to-zero.) */
#define XS_BLOCKS 256 /* rows of up to 8192 values: 1 KiB of stack */

static inline float half_scaled(int16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {((uint32_t)(int32_t)h << 13) & 0x8FFFFFFFu};
    return v.f;
}

/* v sixteen times: the lookup tables' rows (rv32_q5k_quants, blocks.c's nibble values). */
#define NIBBLE_X16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v

/* The sum of each activation block's 32 quants: the affine types' xsum, which does not depend on
 * the row, made once per call. */
static inline void activation_sums(int32_t *x_sums, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int j = 0; j < KERNEL_QK; j++) {
            sum += x_qs[b * KERNEL_QK + j];
        }
        x_sums[b] = sum;
    }
}

/* Q5_K's two 5-bit quant tables (kquants.c), which Q5_0 and Q5_1 read too (blocks.c). */
extern const uint8_t rv32_q5k_quants[2048];

/* fallback.h's widened tile, for the heads and widths attention.c's in-place kernels do not take
 * (set.c: fallback.h's helpers are static to the file that includes it). */
void rv32_widened_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                             const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                             int tile_rows);
void rv32_widened_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                          const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows);

#endif
