/* aarch64 kernels: NEON integer dot products for q8_0, q4_0 and q4_1, with the dot-product extension
 * (SDOT) when the CPU has it (checked at run time through the kernel's hwcaps), plain NEON widening
 * multiplies otherwise; f32 products four rows per vector. Same bits as kernels/scalar.c: each
 * block's int32 sum is exact, the binary16 weight scales are widened exactly (fcvtl), and the float
 * terms (float)isum * (w_d * x_d) follow the reduction tree of kernels.h, a row's eight partials
 * being two vectors of four; an f32 row's products are added one column after another, each vector
 * lane carrying a different row. */
#include <arm_neon.h>
#include <string.h>
#include <sys/auxv.h>

#include "kernels.h"

/* This set's own entry points (fallback.h defines the rest: the batched
 * q8_0/q4_0/q4_1 products as tiles of these matvecs, quantization and SwiGLU as the scalar ones). */
#define KERNEL_HAS_MATVEC_F32
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATVEC_Q4_0
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_F32
#define KERNEL_ATTENTION_CHAINS 4 /* an out-of-order core overlaps four positions' sums */
#include "fallback.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* Linux uapi: the CPU has SDOT/UDOT */
#endif

static int have_dotprod(void)
{
    static int known = -1;
    if (known < 0) {
        known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 1 : 0;
    }
    return known;
}

const char *kernel_set(void)
{
    return have_dotprod() ? "neon-dotprod" : "neon";
}

const char *kernel_cpu_features(void)
{
    return have_dotprod() ? "sdot" : "none";
}

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

/* Four blocks' lane vectors -> their four totals, in block order. */
static inline int32x4_t block_sums4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
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
        const float32x4_t sum = sum_partials4(lo, hi);
        if (n == 4) {
            vst1q_f32(out + r, sum);
        } else {
            float lanes[4];
            vst1q_f32(lanes, sum);
            for (int i = 0; i < n; i++) {
                out[r + i] = lanes[i];
            }
        }
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
    if (have_dotprod()) {
        matvec_q8_0_dotprod(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        matvec_rows(out, (const uint8_t *)w_qs, w_d, x_qs, x_d, rows, cols, 0, 0);
    }
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
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
    const int dotprod = have_dotprod();
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

/* f32 products. A row's sum is one chain of dependent float32 additions in column order
 * (docs/numerics.md), which no vector can shorten; so the vectors run across rows instead: lane i
 * holds row i's running sum, and step j adds w[i][j] * x[j] in all four lanes at once. Each lane
 * does exactly the scalar kernel's multiplications and additions in its order, so the bits are
 * the same. The weights are stored row after row, so every 4x4 tile (4 rows, 4 columns) is
 * transposed in registers first. vmulq and vaddq, never vfmaq or vmlaq (which may be fused), and
 * the build's -ffp-contract=off keeps the compiler from fusing them into fmla itself. */

/* Rows r .. r + n - 1 of w as the `lanes` lanes of a row group; lanes past n repeat row r, are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows(const float **p, int lanes, const float *w, int r, int n, int cols)
{
    for (int i = 0; i < lanes; i++) {
        p[i] = w + (int64_t)(r + (i < n ? i : 0)) * cols;
    }
}


/* The tile of rows p[0..3] at columns c .. c + 3, transposed: col[j] lane i = p[i][c + j]. */
static inline void transpose_tile(float32x4_t col[4], const float *const p[4], int c)
{
    const float32x4_t r[4] = {vld1q_f32(p[0] + c), vld1q_f32(p[1] + c), vld1q_f32(p[2] + c), vld1q_f32(p[3] + c)};
    transpose4(col, r);
}

/* The last k < 4 columns of the rows p[0..3], from column c: copied into a zero-padded 4x4 tile so
 * that the same transpose applies. Only col[0 .. k-1] are used; the padding is never added. */
static void transpose_partial_tile(float32x4_t col[4], const float *const p[4], int c, int k)
{
    float tile[4][4] = {{0.0f}};
    const float *q[4];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < k; j++) {
            tile[i][j] = p[i][c + j];
        }
        q[i] = tile[i];
    }
    transpose_tile(col, q, 0);
}

/* Lane i: acc = acc + col[j] * x[j] for j = 0 .. k-1 in order, the scalar kernel's chain for four
 * rows at once. With `first` (column 0 is col[0]) the sum starts from the first product itself, as
 * the scalar kernel does: 0.0f + (-0.0f) would be +0.0f, so a row of -0.0 products would differ. */
static inline float32x4_t add_products(float32x4_t acc, const float32x4_t col[4], const float *x, int k, int first)
{
    int j = 0;
    if (first) {
        acc = vmulq_n_f32(col[0], x[0]);
        j = 1;
    }
#pragma GCC unroll 4
    for (; j < k; j++) {
        acc = vaddq_f32(acc, vmulq_n_f32(col[j], x[j]));
    }
    return acc;
}

/* Sixteen rows at a time, as four groups of four whose additions are independent chains, so that
 * the latency of one is hidden behind the others. The next sixteen rows are asked for while these
 * are summed, as in x86_avx2.c where that made decoding ~25 % faster (sixteen rows are sixteen
 * streams, which hardware prefetchers follow poorly); not measured on an aarch64 board. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r += 16) {
        const int n = rows - r < 16 ? rows - r : 16;
        const float *p[16];
        group_rows(p, 16, w, r, n, cols);
        float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        int c = 0;
        if (cols >= 4) {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_tile(col, p + 4 * g, 0);
                acc[g] = add_products(acc[g], col, x, 4, 1);
            }
            c = 4;
        }
        for (; c + 4 <= cols; c += 4) {
            /* The next sixteen rows are one block of 64 * cols bytes; each step asks for the next
             * 256 bytes of it, into L2. */
            const char *next = (const char *)(w + (int64_t)(r + 16) * cols) + (int64_t)c * 64;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __builtin_prefetch(next + 64 * i, 0, 2);
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_tile(col, p + 4 * g, c);
                acc[g] = add_products(acc[g], col, x + c, 4, 0);
            }
        }
        if (c < cols) {
            for (int g = 0; g < 4; g++) {
                float32x4_t col[4];
                transpose_partial_tile(col, p + 4 * g, c, cols - c);
                acc[g] = add_products(acc[g], col, x + c, cols - c, c == 0);
            }
        }
        if (n == 16) {
            for (int g = 0; g < 4; g++) {
                vst1q_f32(out + r + 4 * g, acc[g]);
            }
        } else {
            float lanes[16];
            for (int g = 0; g < 4; g++) {
                vst1q_f32(lanes + 4 * g, acc[g]);
            }
            for (int i = 0; i < n; i++) {
                out[r + i] = lanes[i];
            }
        }
    }
}

/* Batched f32: tokens per pass over the weights; their partial sums wait in a stack array. */
#define F32_TOKENS 64

/* Eight rows at a time (two 4x4 tiles, two independent chains per token): each tile is transposed
 * once and then serves every token of the pass (token t's running sums of the eight rows are
 * sums[t], kept between tiles), so the weights are read once per pass. Each lane is the matvec
 * kernel's chain for its (row, token), so the bits are the same. */
static void matmul_f32_neon(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                            int cols)
{
    float32x4_t sums[F32_TOKENS][2];
    for (int t0 = 0; t0 < n_tok; t0 += F32_TOKENS) {
        const int nt = n_tok - t0 < F32_TOKENS ? n_tok - t0 : F32_TOKENS;
        const float *xt = x + (int64_t)t0 * cols;
        for (int r = 0; r < rows; r += 8) {
            const int n = rows - r < 8 ? rows - r : 8;
            const float *p[8];
            group_rows(p, 8, w, r, n, cols);
            for (int c = 0; c < cols; c += 4) {
                const int k = cols - c < 4 ? cols - c : 4;
                float32x4_t lo[4], hi[4];
                if (k == 4) {
                    transpose_tile(lo, p, c);
                    transpose_tile(hi, p + 4, c);
                } else {
                    transpose_partial_tile(lo, p, c, k);
                    transpose_partial_tile(hi, p + 4, c, k);
                }
                if (k == 4 && c > 0) {
                    for (int t = 0; t < nt; t++) {
                        const float *xc = xt + (int64_t)t * cols + c;
                        sums[t][0] = add_products(sums[t][0], lo, xc, 4, 0);
                        sums[t][1] = add_products(sums[t][1], hi, xc, 4, 0);
                    }
                } else {
                    for (int t = 0; t < nt; t++) {
                        const float *xc = xt + (int64_t)t * cols + c;
                        sums[t][0] = add_products(sums[t][0], lo, xc, k, c == 0);
                        sums[t][1] = add_products(sums[t][1], hi, xc, k, c == 0);
                    }
                }
            }
            for (int t = 0; t < nt; t++) {
                float lanes[8];
                vst1q_f32(lanes, sums[t][0]);
                vst1q_f32(lanes + 4, sums[t][1]);
                for (int i = 0; i < n; i++) {
                    out[(int64_t)(t0 + t) * out_stride + r + i] = lanes[i];
                }
            }
        }
    }
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_f32(out, w, x, rows, cols);
    } else {
        matmul_f32_neon(out, out_stride, w, x, n_tok, rows, cols);
    }
}
