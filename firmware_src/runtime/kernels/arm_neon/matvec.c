/* The arm_neon set's quantized matrix-vector products: q8_0 and q4_0 four rows at a time, their
 * block sums by SDOT or widening multiplies, and q4_1 row by row. */
#include "arm_neon.h"

/* The 32 int8 weights of block b of a row: q8_0 quants as they are, or q4_0 nibbles as the values
 * quant - 8 (low nibbles are values 0..15, high nibbles 16..31). */
static inline void weight_block(int8x16_t *w0, int8x16_t *w1, const uint8_t *row, int b, int q4)
{
    if (!q4) {
        *w0 = vld1q_s8((const int8_t *)row + b * KERNEL_QK);
        *w1 = vld1q_s8((const int8_t *)row + b * KERNEL_QK + 16);
        return;
    }
    const uint8x16_t packed = vld1q_u8(row + b * (KERNEL_QK / 2));
    *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), vdupq_n_s8(8));
}

/* Block b's four int32 lanes (their total is its exact isum); blocks past nb give zeros. */
static inline __attribute__((always_inline)) int32x4_t block_lanes(const uint8_t *row, const int8_t *x_qs, int b,
                                                                   int nb, int q4, int dotprod)
{
    if (b >= nb) {
        return vdupq_n_s32(0);
    }
    int8x16_t w0, w1;
    weight_block(&w0, &w1, row, b, q4);
    const int8_t *x = x_qs + b * KERNEL_QK;
    return dotprod ? block_lanes_dotprod(w0, w1, x) : block_lanes_neon(w0, w1, x);
}

/* binary16 scales to float32 with NEON's own conversion (fcvtl, or fcvt for one): exact for every
 * binary16, subnormals included (they are normal float32s; FPCR.FZ16 does not apply to
 * conversions), so the products below are the scalar kernel's. */

/* The scales of four blocks (lane k = block b + k, n of them real); lanes past n are zero and their
 * scales are never read. */
static inline float32x4_t widen_scales4(const KernelHalf *wd, int n)
{
    if (n >= 4) {
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(wd)));
    }
    KernelHalf h[4] = {0, 0, 0, 0};
    for (int k = 0; k < n; k++) {
        h[k] = wd[k];
    }
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* One block's scale (or q4_1 minimum). memcpy, not a cast of the pointer: KernelHalf and __fp16 may
 * not alias. */
static inline float widen_scale(const KernelHalf *wd)
{
    __fp16 h;
    memcpy(&h, wd, sizeof h);
    return (float)h;
}

/* Adds the terms of four blocks (lane k = block b + k, n of them real; d their widened scales) to
 * four partials; lanes past n get -0.0f, which leaves a partial exactly as it was. Activation
 * scales past n are never read. */
static inline float32x4_t add_terms4(float32x4_t acc, int32x4_t isums, float32x4_t d, const float *xd, int n)
{
    if (n >= 4) {
        return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(isums), vmulq_f32(d, vld1q_f32(xd))));
    }
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < n; k++) {
        x[k] = xd[k];
    }
    const float32x4_t terms = vmulq_f32(vcvtq_f32_s32(isums), vmulq_f32(d, vld1q_f32(x)));
    const int32_t lane[4] = {0, 1, 2, 3};
    const uint32x4_t real = vcltq_s32(vld1q_s32(lane), vdupq_n_s32(n));
    return vaddq_f32(acc, vbslq_f32(real, terms, vdupq_n_f32(-0.0f)));
}

/* One row's eight partials (reduction tree, kernels.h): lo holds partials 0-3, hi 4-7. q8_0 or
 * q4_0 weights and SDOT or not, the flags being constants in each caller. */
static inline __attribute__((always_inline)) void row_partials(float32x4_t *lo, float32x4_t *hi, const uint8_t *row,
                                                               const KernelHalf *wd, const int8_t *x_qs,
                                                               const float *x_d, int nb, int q4, int dotprod)
{
    float32x4_t a = vdupq_n_f32(-0.0f), c = vdupq_n_f32(-0.0f);
    for (int b = 0; b < nb; b += 8) {
        /* The eight blocks' scales in one 16-byte load (fcvtl, fcvtl2) where the row has them all. */
        float32x4_t d0, d1;
        if (b + 8 <= nb) {
            const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(wd + b));
            d0 = vcvt_f32_f16(vget_low_f16(h));
            d1 = vcvt_high_f32_f16(h);
        } else {
            d0 = widen_scales4(wd + b, nb - b);
            d1 = widen_scales4(wd + b + 4, nb - b - 4);
        }
        const int32x4_t s0 = block_sums4(block_lanes(row, x_qs, b, nb, q4, dotprod),
                                         block_lanes(row, x_qs, b + 1, nb, q4, dotprod),
                                         block_lanes(row, x_qs, b + 2, nb, q4, dotprod),
                                         block_lanes(row, x_qs, b + 3, nb, q4, dotprod));
        a = add_terms4(a, s0, d0, x_d + b, nb - b);
        if (b + 4 < nb) {
            const int32x4_t s1 = block_sums4(block_lanes(row, x_qs, b + 4, nb, q4, dotprod),
                                             block_lanes(row, x_qs, b + 5, nb, q4, dotprod),
                                             block_lanes(row, x_qs, b + 6, nb, q4, dotprod),
                                             block_lanes(row, x_qs, b + 7, nb, q4, dotprod));
            c = add_terms4(c, s1, d1, x_d + b + 4, nb - b - 4);
        }
    }
    *lo = a;
    *hi = c;
}


/* Four rows at a time (rows past the matrix repeat its row r, computed and dropped), each row's
 * blocks in order, their partials combined together. */
static inline __attribute__((always_inline)) void matvec_rows(float *out, const uint8_t *w, const KernelHalf *w_d,
                                                              const int8_t *x_qs, const float *x_d, int rows, int cols,
                                                              int q4, int dotprod)
{
    const int nb = cols / KERNEL_QK;
    const int row_bytes = q4 ? cols / 2 : cols;
    for (int r = 0; r < rows; r += 4) {
        const int n = rows - r < 4 ? rows - r : 4;
        float32x4_t lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            const int64_t row = r + (i < n ? i : 0);
            row_partials(&lo[i], &hi[i], w + row * row_bytes, w_d + row * nb, x_qs, x_d, nb, q4, dotprod);
        }
        store_rows(out, r, n, sum_partials4(lo, hi));
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q8_0_dotprod(float *out, const int8_t *w_qs,
                                                                                  const KernelHalf *w_d,
                                                                                  const int8_t *x_qs,
                                                                                  const float *x_d, int rows, int cols)
{
    matvec_rows(out, (const uint8_t *)w_qs, w_d, x_qs, x_d, rows, cols, 0, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q4_0_dotprod(float *out, const uint8_t *w_q4,
                                                                                  const KernelHalf *w_d,
                                                                                  const int8_t *x_qs,
                                                                                  const float *x_d, int rows, int cols)
{
    matvec_rows(out, w_q4, w_d, x_qs, x_d, rows, cols, 1, 1);
}

void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (arm_neon_have_dotprod()) {
        matvec_q8_0_dotprod(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        matvec_rows(out, (const uint8_t *)w_qs, w_d, x_qs, x_d, rows, cols, 0, 0);
    }
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (arm_neon_have_dotprod()) {
        matvec_q4_0_dotprod(out, w_q4, w_d, x_qs, x_d, rows, cols);
    } else {
        matvec_rows(out, w_q4, w_d, x_qs, x_d, rows, cols, 1, 0);
    }
}

/* q4_1 rows: each block's nibbles are its quants 0..15, taken as int8 by the same block sums as
 * q8_0 (SDOT or widening multiplies). The minimum's part needs xsum, each activation block's sum of
 * quants, which does not depend on the row: computed once per call for all the rows, into
 * Q4_1_XSUM_BLOCKS int32s on the stack (rows of up to 16384 values; longer rows take the scalar
 * kernel). Each term is kernel_q4_1_term on the block's widened scale and minimum and is added
 * through kernel_q4_1_sum_add (kernels.h). */
#define Q4_1_XSUM_BLOCKS 512

static void matvec_q4_1_neon(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                             const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int dotprod = arm_neon_have_dotprod();
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    int32_t xs[Q4_1_XSUM_BLOCKS];
    for (int b = 0; b < nb; b++) {
        const int8_t *x = x_qs + b * KERNEL_QK;
        xs[b] = (int32_t)vaddlvq_s8(vld1q_s8(x)) + (int32_t)vaddlvq_s8(vld1q_s8(x + 16));
    }
    for (int r = 0; r < rows; r++) {
        const uint8_t *wq = w_q4 + (int64_t)r * (cols / 2);
        const KernelHalf *wd = w_d + (int64_t)r * nb;
        const KernelHalf *wm = w_m + (int64_t)r * nb;
        KernelQ41Sum sum = kernel_q4_1_sum_start();
        for (int b = 0; b < nb; b++) {
            const uint8x16_t packed = vld1q_u8(wq + b * (KERNEL_QK / 2));
            const int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(packed, low4));
            const int8x16_t w1 = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
            const int8_t *x = x_qs + b * KERNEL_QK;
            const int32_t isum = vaddvq_s32(dotprod ? block_lanes_dotprod(w0, w1, x) : block_lanes_neon(w0, w1, x));
            kernel_q4_1_sum_add(&sum, b,
                                kernel_q4_1_term(isum, xs[b], widen_scale(wd + b), widen_scale(wm + b), x_d[b]));
        }
        out[r] = kernel_q4_1_sum_end(&sum);
    }
}

void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (cols / KERNEL_QK <= Q4_1_XSUM_BLOCKS) {
        matvec_q4_1_neon(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    }
}
