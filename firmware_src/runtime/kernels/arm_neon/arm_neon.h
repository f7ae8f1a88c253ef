/* The arm_neon kernel set's shared helpers (static inline, so that each role file's hot loops keep
 * them inlined) and the set's internal declarations. (The compiler's own <arm_neon.h> is included
 * with angle brackets, which never find this file.)
 *
 * aarch64 kernels: NEON integer dot products for q8_0, q4_0, q4_1 and the kept GGUF block types
 * (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4), with the dot-product extension
 * (SDOT) when the CPU has it (checked at run time through the kernel's hwcaps), plain NEON widening
 * multiplies otherwise; f32 products four rows per vector. Same bits as kernels/scalar.c: each
 * block's int32 sum is exact, the binary16 weight scales are widened exactly (fcvtl), and the float
 * terms (float)isum * (w_d * x_d) follow the reduction tree of kernels.h, a row's eight partials
 * being two vectors of four; an f32 row's products are added one column after another, each vector
 * lane carrying a different row. */
#ifndef COLIBRI_KERNELS_ARM_NEON_H
#define COLIBRI_KERNELS_ARM_NEON_H

#include <arm_neon.h>
#include <string.h>

#include "../kernels.h"

/* Whether the CPU has SDOT/UDOT (cpu.c: the kernel's hwcaps, read once). */
int arm_neon_have_dotprod(void);

/* A kept GGUF type's batched product as tiles of rows over its matvec: fallback.h's
 * kernel_tiled_matmul_blocks, from set.c, which includes fallback.h for the set. */
void arm_neon_tiled_matmul_blocks(KernelBlocksMatvec matvec, int64_t row_bytes, float *out, int out_stride,
                                  const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                                  int cols);

/* The four int32 lanes of a block's products, summed in pairs as far as the extension allows:
 * SDOT (four products per lane) or widening multiplies and pairwise adds. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static inline int32x4_t block_lanes_dotprod(int8x16_t w0,
                                                                                             int8x16_t w1,
                                                                                             const int8_t *x)
{
    int32x4_t acc = vdupq_n_s32(0);
    acc = vdotq_s32(acc, w0, vld1q_s8(x));
    return vdotq_s32(acc, w1, vld1q_s8(x + 16));
}

static inline int32x4_t block_lanes_neon(int8x16_t w0, int8x16_t w1, const int8_t *x)
{
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(w0), vget_high_s8(x0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
    return vpadalq_s16(acc, vmull_s8(vget_high_s8(w1), vget_high_s8(x1)));
}

/* The four int32 lanes of 16 values' products (their total is the exact sum). */
__attribute__((target("arch=armv8.2-a+dotprod"))) static inline int32x4_t half_lanes_dotprod(int8x16_t w, int8x16_t x)
{
    return vdotq_s32(vdupq_n_s32(0), w, x);
}

static inline int32x4_t half_lanes_neon(int8x16_t w, int8x16_t x)
{
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x))), vmull_high_s8(w, x));
}

static inline __attribute__((always_inline)) int32x4_t half_lanes(int8x16_t w, const int8_t *x, int dotprod)
{
    return dotprod ? half_lanes_dotprod(w, vld1q_s8(x)) : half_lanes_neon(w, vld1q_s8(x));
}

/* A whole 32-value block's lanes (w0: values 0..15, w1: 16..31). */
static inline __attribute__((always_inline)) int32x4_t whole_lanes(int8x16_t w0, int8x16_t w1, const int8_t *x,
                                                                   int dotprod)
{
    return dotprod ? block_lanes_dotprod(w0, w1, x) : block_lanes_neon(w0, w1, x);
}

/* Four blocks' lane vectors -> their four totals, in block order. */
static inline int32x4_t block_sums4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* The float terms of four blocks, one per lane: (float)isum * (s * x_d), the shape of every
 * product in kernel_unpacked_term (an offset's part is (float)xsum * (o * x_d)). */
static inline float32x4_t scaled_terms(int32x4_t isum, float32x4_t s, float32x4_t xd)
{
    return vmulq_f32(vcvtq_f32_s32(isum), vmulq_f32(s, xd));
}

/* The binary16 at p (any alignment), widened by fcvt. */
static inline float half_at(const uint8_t *p)
{
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

/* Lanes 0 .. n-1 of t, the others -0.0f (which leaves a partial as it was). */
static inline float32x4_t keep_lanes(float32x4_t t, int n)
{
    if (n >= 4) {
        return t;
    }
    const int32_t lane[4] = {0, 1, 2, 3};
    const uint32x4_t real = vcltq_s32(vld1q_s32(lane), vdupq_n_s32(n));
    return vbslq_f32(real, t, vdupq_n_f32(-0.0f));
}

/* Four floats (or int32s) from p, of which n are real; the rest read as zero, never from memory. */
static inline float32x4_t load4_f32(const float *p, int n)
{
    if (n >= 4) {
        return vld1q_f32(p);
    }
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < n; k++) {
        v[k] = p[k];
    }
    return vld1q_f32(v);
}

static inline int32x4_t load4_s32(const int32_t *p, int n)
{
    if (n >= 4) {
        return vld1q_s32(p);
    }
    int32_t v[4] = {0, 0, 0, 0};
    for (int k = 0; k < n; k++) {
        v[k] = p[k];
    }
    return vld1q_s32(v);
}

static inline float32x4_t trn1_64(float32x4_t a, float32x4_t b)
{
    return vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}

static inline float32x4_t trn2_64(float32x4_t a, float32x4_t b)
{
    return vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b)));
}

/* r[0..3] (one row each) transposed: col[j] lane i = r[i][j]. */
static inline void transpose4(float32x4_t col[4], const float32x4_t r[4])
{
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]); /* r0[0] r1[0] r0[2] r1[2] */
    const float32x4_t t1 = vtrn2q_f32(r[0], r[1]); /* r0[1] r1[1] r0[3] r1[3] */
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]);
    const float32x4_t t3 = vtrn2q_f32(r[2], r[3]);
    col[0] = trn1_64(t0, t2);
    col[1] = trn1_64(t1, t3);
    col[2] = trn2_64(t0, t2);
    col[3] = trn2_64(t1, t3);
}

/* The combine of the reduction tree for four rows at once: lo[i], hi[i] hold row i's partials
 * 0-3 and 4-7; lane i of the result is ((p0 + p1) + p2) + ... + p7 of row i. (Reused by every
 * quantized block type.) */
static inline float32x4_t sum_partials4(const float32x4_t lo[4], const float32x4_t hi[4])
{
    float32x4_t a[4], c[4];
    transpose4(a, lo);
    transpose4(c, hi);
    float32x4_t sum = vaddq_f32(a[0], a[1]);
    sum = vaddq_f32(sum, a[2]);
    sum = vaddq_f32(sum, a[3]);
    sum = vaddq_f32(sum, c[0]);
    sum = vaddq_f32(sum, c[1]);
    sum = vaddq_f32(sum, c[2]);
    return vaddq_f32(sum, c[3]);
}

/* Stores lanes 0 .. n-1 of four rows' sums (lane i = row r + i) at out + r. */
static inline void store_rows(float *out, int r, int n, float32x4_t sum)
{
    if (n == 4) {
        vst1q_f32(out + r, sum);
        return;
    }
    float lanes[4];
    vst1q_f32(lanes, sum);
    for (int i = 0; i < n; i++) {
        out[r + i] = lanes[i];
    }
}

#endif
