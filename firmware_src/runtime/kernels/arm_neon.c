/* aarch64 kernels: NEON integer dot products for q8_0, q4_0, q4_1 and the kept GGUF block types
 * (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4), with the dot-product extension
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

/* This set's own entry points (fallback.h defines the rest: the batched q8_0/q4_0/q4_1 products
 * as tiles of these matvecs, quantization and SwiGLU as the scalar ones). */
#define KERNEL_HAS_MATVEC_F32
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATVEC_Q4_0
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_F32
#define KERNEL_HAS_DELTA_RULE_STEP
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#define KERNEL_HAS_MATMUL_Q5_0
#define KERNEL_HAS_MATMUL_Q5_1
#define KERNEL_HAS_MATMUL_Q4_K
#define KERNEL_HAS_MATMUL_Q5_K
#define KERNEL_HAS_MATMUL_Q6_K
#define KERNEL_HAS_MATMUL_Q3_K
#define KERNEL_HAS_MATMUL_Q2_K
#define KERNEL_HAS_MATMUL_IQ4_NL
#define KERNEL_HAS_MATMUL_IQ4_XS
#define KERNEL_HAS_MATMUL_MXFP4
#define KERNEL_HAS_ATTENTION_MIX
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_WIDEN_Q8_0
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

/* The delta rule four value columns per vector: lane l carries column j + l's chains, each
 * operation the scalar one (vmulq then vaddq, never a fused vfmaq), so the sums are the scalar
 * kernel's. */
void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim)
{
    if (value_dim % 4 != 0) {
        kernel_scalar_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
        return;
    }
    const float32x4_t vdecay = vdupq_n_f32(decay), vbeta = vdupq_n_f32(beta);
    for (int j = 0; j < value_dim; j += 4) {
        float32x4_t s = vmulq_f32(vld1q_f32(state + j), vdecay);
        vst1q_f32(state + j, s);
        float32x4_t m = vmulq_f32(s, vdupq_n_f32(k[0]));
        for (int i = 1; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = vmulq_f32(vld1q_f32(row), vdecay);
            vst1q_f32(row, s);
            m = vaddq_f32(m, vmulq_f32(s, vdupq_n_f32(k[i])));
        }
        m = vmulq_f32(vsubq_f32(vld1q_f32(v + j), m), vbeta);
        vst1q_f32(memory + j, m);
        float32x4_t o = vdupq_n_f32(0.0f);
        for (int i = 0; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = vaddq_f32(vld1q_f32(row), vmulq_f32(vdupq_n_f32(k[i]), m));
            vst1q_f32(row, s);
            const float32x4_t term = vmulq_f32(s, vdupq_n_f32(q[i]));
            o = (i == 0) ? term : vaddq_f32(o, term);
        }
        vst1q_f32(out + j, o);
    }
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

/* ---- The kept GGUF block types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4) ----
 *
 * Each 32-value block is decoded from its bytes straight into two int8 vectors (values 0..15 and
 * 16..31): the small integers kernel_<type>_unpack makes, so the int32 sums (SDOT, or widening
 * multiplies and pairwise adds) are kernel_unpacked_term's exactly. The float work is done four
 * blocks at a time, one block per lane, each lane doing kernel_unpacked_term's multiplications and
 * additions in its order (vmulq and vaddq only, never fused). Block b goes to lane b % 4 of partial
 * vector (b / 4) % 2, which is partial b % 8 of the reduction tree. A 256-value superblock is
 * exactly blocks 8k .. 8k + 7: its eight terms are one vector for partials 0-3 and one for 4-7, and
 * its scales are decoded once, into vectors; the 32-value types go four blocks per step. Rows go
 * four at a time, combined by sum_partials4 as the q8_0 rows are. The batched product decodes each
 * step's weights once and applies them to every token of the batch. */

/* The row's kind: the always-inlined functions below are compiled once per type. */
enum {
    BLOCKS_Q5_0,
    BLOCKS_Q5_1,
    BLOCKS_IQ4_NL,
    BLOCKS_MXFP4,
    BLOCKS_Q4_K,
    BLOCKS_Q5_K,
    BLOCKS_Q6_K,
    BLOCKS_Q3_K,
    BLOCKS_Q2_K,
    BLOCKS_IQ4_XS,
};

static inline int blocks_values(int type)
{
    return type == BLOCKS_Q5_0 || type == BLOCKS_Q5_1 || type == BLOCKS_IQ4_NL || type == BLOCKS_MXFP4 ? 32 : 256;
}

static inline int blocks_bytes(int type)
{
    switch (type) {
    case BLOCKS_Q5_0: return KERNEL_Q5_0_BYTES;
    case BLOCKS_Q5_1: return KERNEL_Q5_1_BYTES;
    case BLOCKS_IQ4_NL: return KERNEL_IQ4_NL_BYTES;
    case BLOCKS_MXFP4: return KERNEL_MXFP4_BYTES;
    case BLOCKS_Q4_K: return KERNEL_Q4_K_BYTES;
    case BLOCKS_Q5_K: return KERNEL_Q5_K_BYTES;
    case BLOCKS_Q6_K: return KERNEL_Q6_K_BYTES;
    case BLOCKS_Q3_K: return KERNEL_Q3_K_BYTES;
    case BLOCKS_Q2_K: return KERNEL_Q2_K_BYTES;
    default: return KERNEL_IQ4_XS_BYTES;
    }
}

/* Whether the type's terms have an offset's part, which needs the activation block sums. */
static inline int blocks_affine(int type)
{
    return type == BLOCKS_Q5_1 || type == BLOCKS_Q4_K || type == BLOCKS_Q5_K || type == BLOCKS_Q2_K;
}

/* Whether the type has one scale per 16 values (an isum per half block). */
static inline int blocks_two_scales(int type)
{
    return type == BLOCKS_Q6_K || type == BLOCKS_Q3_K || type == BLOCKS_Q2_K;
}

/* The activation sums of the affine types (each 32-value block's halves, xs_a and xs_b) are
 * computed once per call for all the rows, into stack arrays of this many blocks: rows of up to
 * 16384 values (longer rows of an affine type take the scalar kernel, as q4_1's do), and for the
 * batched product as many tokens as fit. */
#define BLOCKS_XSUM_MAX 4096
#define BLOCKS_ROW_MAX 512 /* blocks of 32 in a row of an affine type */
#define BLOCKS_TOKENS 64   /* tokens per pass of the batched product */

static void activation_sums(int32_t *xs_a, int32_t *xs_b, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        xs_a[b] = (int32_t)vaddlvq_s8(vld1q_s8(x_qs + b * KERNEL_QK));
        xs_b[b] = (int32_t)vaddlvq_s8(vld1q_s8(x_qs + b * KERNEL_QK + 16));
    }
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

/* Eight integer scales (int16 lanes) as two float32 vectors times d: d * (float)sc, the scalar
 * unpack's product (IEEE multiplication is commutative, bit for bit). */
static inline void scales8(float32x4_t s[2], int16x8_t v, float d)
{
    s[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), d);
    s[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(v)), d);
}

/* Sixteen int8 scales, one per 16 values (sub-block j takes 2j for values 0..15 and 2j + 1 for
 * 16..31): the even ones into sa, the odd ones into sb, each times d. */
static inline void scales16(float32x4_t sa[2], float32x4_t sb[2], int8x16_t v, float d)
{
    scales8(sa, vmovl_s8(vget_low_s8(vuzp1q_s8(v, v))), d);
    scales8(sb, vmovl_s8(vget_low_s8(vuzp2q_s8(v, v))), d);
}

/* A Q5_0/Q5_1 block's 32 fifth bits (qh, bit l for value l) as byte masks: lane l of set[0] is
 * 0xFF where bit l is set (values 0..15), of set[1] where bit 16 + l is (values 16..31). One
 * table lookup spreads qh's bytes over the lanes (byte l / 8 to lane l), one test per vector. */
static inline void fifth_bits(uint8x16_t set[2], uint32_t qh)
{
    static const uint8_t spread[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                          {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(qh)); /* little-endian: byte k = bits 8k.. */
    set[0] = vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(spread[0])), vld1q_u8(bit));
    set[1] = vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(spread[1])), vld1q_u8(bit));
}

/* A row is read in steps: a superblock (or four blocks of a 32-value type, one group), whose
 * scales are decoded once into BlocksScales, and within it groups of four blocks (4g .. 4g + 3,
 * the lanes of partial vector g), each decoded into BlocksQuants and then applied to the token(s)
 * before the next group is decoded, so that its eight vectors stay in registers. */
typedef struct {
    /* per lane of partial vector g: the scales s_a (values 0..15; all 32 for the one-scale types)
     * and s_b (16..31, two-scale types), the affine types' offsets o_a, o_b */
    float32x4_t s_a[2], s_b[2], o_a[2], o_b[2];
    uint8x16_t high[2]; /* Q3_K's hmask or Q5_K's qh (a bit per value and sub-block), read once */
} BlocksScales;

typedef struct {
    int8x16_t w[8]; /* block k of the group: values 0..15 in w[2k], 16..31 in w[2k + 1] */
} BlocksQuants;

/* One block of Q5_0, Q5_1, IQ4_NL or MXFP4 (w0: values 0..15, the low nibbles of qs; w1: values
 * 16..31, the high ones), as kernel_<type>_unpack makes them. */
static inline __attribute__((always_inline)) void block32_quants(int type, const uint8_t *blk, int8x16_t *w0,
                                                                 int8x16_t *w1)
{
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    if (type == BLOCKS_IQ4_NL) {
        const uint8x16_t qs = vld1q_u8(blk + 2);
        const int8x16_t values = vld1q_s8(kernel_iq4nl_values);
        *w0 = vqtbl1q_s8(values, vandq_u8(qs, low4));
        *w1 = vqtbl1q_s8(values, vshrq_n_u8(qs, 4));
        return;
    }
    if (type == BLOCKS_MXFP4) { /* qs after the exponent byte, through kvalues_mxfp4 */
        const uint8x16_t qs = vld1q_u8(blk + 1);
        const int8x16_t values = vld1q_s8(kernel_mxfp4_values);
        *w0 = vqtbl1q_s8(values, vandq_u8(qs, low4));
        *w1 = vqtbl1q_s8(values, vshrq_n_u8(qs, 4));
        return;
    }
    const int at = type == BLOCKS_Q5_0 ? 2 : 4; /* qh after d (and Q5_1's m) */
    uint32_t qh;
    memcpy(&qh, blk + at, sizeof qh); /* little-endian, as the file holds it */
    const uint8x16_t qs = vld1q_u8(blk + at + 4), sixteen = vdupq_n_u8(0x10);
    uint8x16_t set[2];
    fifth_bits(set, qh);
    if (type == BLOCKS_Q5_0) { /* nibble + 16 * bit - 16: the nibble less 16 where the bit is clear */
        *w0 = vreinterpretq_s8_u8(vsubq_u8(vandq_u8(qs, low4), vbicq_u8(sixteen, set[0])));
        *w1 = vreinterpretq_s8_u8(vsubq_u8(vshrq_n_u8(qs, 4), vbicq_u8(sixteen, set[1])));
    } else { /* nibble + 16 * bit */
        *w0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(qs, low4), vandq_u8(sixteen, set[0])));
        *w1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(qs, 4), vandq_u8(sixteen, set[1])));
    }
}

/* Blocks b .. b + n - 1 (n <= 4) of a row of Q5_0, Q5_1, IQ4_NL or MXFP4: their quants and their
 * scales (binary16 widened, or MXFP4's e8m0 power of two, kernel_e8m0_half) and Q5_1's minimums;
 * lanes past n are zero and never read from the row. */
static inline __attribute__((always_inline)) void decode_block32(int type, BlocksScales *sc, BlocksQuants *q,
                                                                 const uint8_t *row, int b, int n)
{
    const int bytes = blocks_bytes(type);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        if (k < n) {
            const uint8_t *blk = row + (int64_t)(b + k) * bytes;
            block32_quants(type, blk, &q->w[2 * k], &q->w[2 * k + 1]);
            d[k] = type == BLOCKS_MXFP4 ? kernel_e8m0_half(blk[0]) : half_at(blk);
            if (type == BLOCKS_Q5_1) {
                m[k] = half_at(blk + 2);
            }
        } else {
            q->w[2 * k] = q->w[2 * k + 1] = vdupq_n_s8(0);
        }
    }
    sc->s_a[0] = vld1q_f32(d);
    sc->o_a[0] = vld1q_f32(m);
}

/* Q4_K and Q5_K: a superblock's eight 6-bit scales and minimums (kernel_k_scale_min for j = 0..7)
 * in four 32-bit steps (ggml's), times d, and the offsets -(dmin * m). */
static inline void k_scales(BlocksScales *sc, const uint8_t *blk)
{
    uint32_t u[4];
    memcpy(u, blk + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4); /* m 4..7 */
    const uint32_t m_low = u[1] & 0x3F3F3F3F;                               /* m 0..3 */
    u[1] = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);         /* sc 4..7 */
    u[2] = m_low;
    u[0] &= 0x3F3F3F3F; /* sc 0..3 */
    uint8_t bytes[16];
    memcpy(bytes, u, sizeof bytes);
    const uint8x16_t v = vld1q_u8(bytes);
    scales8(sc->s_a, vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))), half_at(blk));
    scales8(sc->o_a, vreinterpretq_s16_u16(vmovl_high_u8(v)), half_at(blk + 2));
    sc->o_a[0] = vnegq_f32(sc->o_a[0]);
    sc->o_a[1] = vnegq_f32(sc->o_a[1]);
}

/* Q3_K: the sixteen 6-bit scales (kernel_q3_k_scale for g = 0..15) in four 32-bit steps (ggml's),
 * minus 32, as int8. */
static inline int8x16_t q3_k_scales(const uint8_t *s)
{
    uint32_t a[4];
    memcpy(a, s, 12);
    const uint32_t high = a[2];
    a[2] = ((a[0] >> 4) & 0x0F0F0F0F) | (((high >> 4) & 0x03030303) << 4);
    a[3] = ((a[1] >> 4) & 0x0F0F0F0F) | (((high >> 6) & 0x03030303) << 4);
    a[0] = (a[0] & 0x0F0F0F0F) | ((high & 0x03030303) << 4);
    a[1] = (a[1] & 0x0F0F0F0F) | (((high >> 2) & 0x03030303) << 4);
    uint8_t bytes[16];
    memcpy(bytes, a, sizeof bytes);
    return vsubq_s8(vreinterpretq_s8_u8(vld1q_u8(bytes)), vdupq_n_s8(32));
}

/* A superblock's scales (and offsets, and the high bits of Q3_K and Q5_K), decoded once. */
static inline __attribute__((always_inline)) void super_scales(int type, BlocksScales *sc, const uint8_t *blk)
{
    switch (type) {
    case BLOCKS_Q4_K: k_scales(sc, blk); break;
    case BLOCKS_Q5_K:
        k_scales(sc, blk);
        sc->high[0] = vld1q_u8(blk + 16);
        sc->high[1] = vld1q_u8(blk + 32);
        break;
    case BLOCKS_Q6_K: scales16(sc->s_a, sc->s_b, vld1q_s8((const int8_t *)blk + 192), half_at(blk + 208)); break;
    case BLOCKS_Q3_K:
        scales16(sc->s_a, sc->s_b, q3_k_scales(blk + 96), half_at(blk + 108));
        sc->high[0] = vld1q_u8(blk);
        sc->high[1] = vld1q_u8(blk + 16);
        break;
    case BLOCKS_Q2_K: {
        const uint8x16_t v = vld1q_u8(blk);
        scales16(sc->s_a, sc->s_b, vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), half_at(blk + 80));
        scales16(sc->o_a, sc->o_b, vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), half_at(blk + 82));
        for (int g = 0; g < 2; g++) {
            sc->o_a[g] = vnegq_f32(sc->o_a[g]);
            sc->o_b[g] = vnegq_f32(sc->o_b[g]);
        }
        break;
    }
    default: { /* IQ4_XS: ls 4 bits of scales_l and 2 of scales_h, minus 32, times d */
        const int scales_h = blk[2] | blk[3] << 8;
        int16_t ls[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = (int16_t)((((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((scales_h >> (2 * j)) & 3) << 4)) - 32);
        }
        scales8(sc->s_a, vld1q_s16(ls), half_at(blk));
        break;
    }
    }
}

/* Q4_K (qh NULL) and Q5_K, group g: sub-blocks 4g .. 4g + 3 are the low and high nibbles of
 * qs[64g .. 64g + 63] (sub-block 2i the low nibbles of qs[32i ..], 2i + 1 their high ones), read
 * once; Q5_K's fifth bit of value l of sub-block j is bit j of qh[l] (qh[0..15], qh[16..31]). */
static inline __attribute__((always_inline)) void k_quants(BlocksQuants *q, const uint8_t *qs, const uint8x16_t *qh,
                                                           int g)
{
    const uint8x16_t low4 = vdupq_n_u8(0x0F), sixteen = vdupq_n_u8(0x10);
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const int i = 2 * g + p;
        const uint8x16_t a = vld1q_u8(qs + 32 * i), b = vld1q_u8(qs + 32 * i + 16);
        uint8x16_t lo0 = vandq_u8(a, low4), lo1 = vandq_u8(b, low4);
        uint8x16_t hi0 = vshrq_n_u8(a, 4), hi1 = vshrq_n_u8(b, 4);
        if (qh != NULL) {
            const uint8x16_t even = vdupq_n_u8((uint8_t)(1 << (2 * i))), odd = vdupq_n_u8((uint8_t)(2 << (2 * i)));
            lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(qh[0], even), sixteen));
            lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(qh[1], even), sixteen));
            hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(qh[0], odd), sixteen));
            hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(qh[1], odd), sixteen));
        }
        q->w[4 * p] = vreinterpretq_s8_u8(lo0);
        q->w[4 * p + 1] = vreinterpretq_s8_u8(lo1);
        q->w[4 * p + 2] = vreinterpretq_s8_u8(hi0);
        q->w[4 * p + 3] = vreinterpretq_s8_u8(hi1);
    }
}

/* Q6_K, group g = half h: 64 bytes of ql and 32 of qh; sub-block 4h + k takes the low (k < 2) or
 * high nibbles of ql[32 * (k % 2) ..] and bits 2k, 2k + 1 of qh, minus 32. */
static inline __attribute__((always_inline)) void q6_k_quants(BlocksQuants *q, const uint8_t *blk, int h)
{
    const uint8x16_t low4 = vdupq_n_u8(0x0F), bits45 = vdupq_n_u8(0x30);
    const int8x16_t minus = vdupq_n_s8(32);
    const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
    const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
    const uint8x16_t q0 = vld1q_u8(qh), q1 = vld1q_u8(qh + 16);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const uint8x16_t n0 = k % 2 ? l2 : l0, n1 = k % 2 ? l3 : l1;
        const uint8x16_t v0 = k < 2 ? vandq_u8(n0, low4) : vshrq_n_u8(n0, 4);
        const uint8x16_t v1 = k < 2 ? vandq_u8(n1, low4) : vshrq_n_u8(n1, 4);
        /* bits 2k, 2k + 1 moved to 4, 5: a shift by 4 - 2k (right when negative) */
        const int8x16_t shift = vdupq_n_s8((int8_t)(4 - 2 * k));
        const uint8x16_t b0 = vandq_u8(vshlq_u8(q0, shift), bits45), b1 = vandq_u8(vshlq_u8(q1, shift), bits45);
        q->w[2 * k] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(v0, b0)), minus);
        q->w[2 * k + 1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(v1, b1)), minus);
    }
}

/* Q3_K and Q2_K, group g: sub-block 4g + k is bits 2k, 2k + 1 of qs[32g ..]; Q3_K's values are
 * those minus 4 where bit j of hmask[l] is clear (hmask NULL for Q2_K). */
static inline __attribute__((always_inline)) void crumb_quants(BlocksQuants *q, const uint8_t *qs,
                                                               const uint8x16_t *hmask, int g)
{
    const uint8x16_t three = vdupq_n_u8(3), four = vdupq_n_u8(4);
    const uint8x16_t c0 = vld1q_u8(qs + 32 * g), c1 = vld1q_u8(qs + 32 * g + 16);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * k));
        int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(c0, shift), three));
        int8x16_t w1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(c1, shift), three));
        if (hmask != NULL) {
            const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << (4 * g + k)));
            w0 = vsubq_s8(w0, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hmask[0], bit))));
            w1 = vsubq_s8(w1, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(hmask[1], bit))));
        }
        q->w[2 * k] = w0;
        q->w[2 * k + 1] = w1;
    }
}

/* IQ4_XS, group g: sub-block j is the 16 bytes at qs + 16 j through the table. */
static inline __attribute__((always_inline)) void iq4_xs_quants(BlocksQuants *q, const uint8_t *blk, int g)
{
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    const int8x16_t values = vld1q_s8(kernel_iq4nl_values);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const uint8x16_t qs = vld1q_u8(blk + 8 + 16 * (4 * g + k));
        q->w[2 * k] = vqtbl1q_s8(values, vandq_u8(qs, low4));
        q->w[2 * k + 1] = vqtbl1q_s8(values, vshrq_n_u8(qs, 4));
    }
}

/* Group g of a superblock: its quants. */
static inline __attribute__((always_inline)) void super_quants(int type, BlocksQuants *q, const BlocksScales *sc,
                                                               const uint8_t *blk, int g)
{
    switch (type) {
    case BLOCKS_Q4_K: k_quants(q, blk + 16, NULL, g); break;
    case BLOCKS_Q5_K: k_quants(q, blk + 48, sc->high, g); break;
    case BLOCKS_Q6_K: q6_k_quants(q, blk, g); break;
    case BLOCKS_Q3_K: crumb_quants(q, blk + 32, sc->high, g); break;
    case BLOCKS_Q2_K: crumb_quants(q, blk + 16, NULL, g); break;
    default: iq4_xs_quants(q, blk, g); break;
    }
}

/* A decoded group's terms for one token, added to its partial vector p (lane k: block 4g + k):
 * m real blocks. x: the token's quants of the group's first block; x_d, xs_a, xs_b from it too. */
static inline __attribute__((always_inline)) float32x4_t group_terms(int type, const BlocksQuants *q,
                                                                     const BlocksScales *sc, int g, float32x4_t p,
                                                                     int m, const int8_t *x, const float *x_d,
                                                                     const int32_t *xs_a, const int32_t *xs_b,
                                                                     int dotprod)
{
    const int8x16_t *w = q->w;
    const float32x4_t xd = load4_f32(x_d, m);
    float32x4_t t;
    if (blocks_two_scales(type)) {
        const int32x4_t isum_a = block_sums4(half_lanes(w[0], x, dotprod), half_lanes(w[2], x + 32, dotprod),
                                             half_lanes(w[4], x + 64, dotprod), half_lanes(w[6], x + 96, dotprod));
        const int32x4_t isum_b = block_sums4(half_lanes(w[1], x + 16, dotprod), half_lanes(w[3], x + 48, dotprod),
                                             half_lanes(w[5], x + 80, dotprod), half_lanes(w[7], x + 112, dotprod));
        t = vaddq_f32(scaled_terms(isum_a, sc->s_a[g], xd), scaled_terms(isum_b, sc->s_b[g], xd));
        if (blocks_affine(type)) { /* Q2_K: the offsets after the scaled sums, half a then b */
            t = vaddq_f32(t, scaled_terms(load4_s32(xs_a, m), sc->o_a[g], xd));
            t = vaddq_f32(t, scaled_terms(load4_s32(xs_b, m), sc->o_b[g], xd));
        }
    } else {
        const int32x4_t isum =
            block_sums4(whole_lanes(w[0], w[1], x, dotprod), whole_lanes(w[2], w[3], x + 32, dotprod),
                        whole_lanes(w[4], w[5], x + 64, dotprod), whole_lanes(w[6], w[7], x + 96, dotprod));
        t = scaled_terms(isum, sc->s_a[g], xd);
        if (blocks_affine(type)) {
            const int32x4_t xsum = vaddq_s32(load4_s32(xs_a, m), load4_s32(xs_b, m));
            t = vaddq_f32(t, scaled_terms(xsum, sc->o_a[g], xd));
        }
    }
    return vaddq_f32(p, keep_lanes(t, m));
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

/* The activation of token t (of a batch; 0 for the matvec) at block b. */
typedef struct {
    const int8_t *x_qs;
    const float *x_d;
    const int32_t *xs_a, *xs_b; /* the affine types' activation sums, from block 0 of the token */
} BlocksInput;

/* One row's partials for n_tok tokens (part[t][0..1]; n_tok = 1 for the matvec): each group
 * decoded once, then its terms added for every token; in[t] token t's input. */
static inline __attribute__((always_inline)) void row_partials_blocks(int type, float32x4_t (*part)[2],
                                                                      const uint8_t *row, const BlocksInput *in,
                                                                      int n_tok, int nb, int dotprod)
{
    if (blocks_values(type) == 32) {
        for (int b = 0; b < nb; b += 4) {
            const int m = nb - b < 4 ? nb - b : 4;
            BlocksScales sc;
            BlocksQuants q;
            decode_block32(type, &sc, &q, row, b, m);
            const int p = (b / 4) % 2;
            for (int t = 0; t < n_tok; t++) {
                part[t][p] = group_terms(type, &q, &sc, 0, part[t][p], m, in[t].x_qs + b * KERNEL_QK,
                                         in[t].x_d + b, in[t].xs_a + b, in[t].xs_b + b, dotprod);
            }
        }
        return;
    }
    const int bytes = blocks_bytes(type);
    for (int b = 0; b < nb; b += 8) {
        const uint8_t *blk = row + (int64_t)(b / 8) * bytes;
        BlocksScales sc;
        super_scales(type, &sc, blk);
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++) {
            BlocksQuants q;
            super_quants(type, &q, &sc, blk, g);
            const int first = b + 4 * g;
            for (int t = 0; t < n_tok; t++) {
                part[t][g] = group_terms(type, &q, &sc, g, part[t][g], 4, in[t].x_qs + first * KERNEL_QK,
                                         in[t].x_d + first, in[t].xs_a + first, in[t].xs_b + first, dotprod);
            }
        }
    }
}

/* The matvec of a kept type: the activation sums once (affine types; cols / 32 <= BLOCKS_ROW_MAX,
 * which the entry points check), then four rows at a time (a short last group computes only its
 * rows), the four rows' partials combined together. */
static inline __attribute__((always_inline)) void blocks_matvec(int type, float *out, const uint8_t *w,
                                                                const int8_t *x_qs, const float *x_d, int rows,
                                                                int cols, int dotprod)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / blocks_values(type)) * blocks_bytes(type);
    int32_t xs_a[BLOCKS_ROW_MAX], xs_b[BLOCKS_ROW_MAX];
    if (blocks_affine(type)) {
        activation_sums(xs_a, xs_b, x_qs, nb);
    }
    const BlocksInput in = {x_qs, x_d, xs_a, xs_b};
    for (int r = 0; r < rows; r += 4) {
        const int n = rows - r < 4 ? rows - r : 4;
        float32x4_t lo[4], hi[4];
        for (int i = 0; i < 4; i++) {
            float32x4_t part[1][2] = {{vdupq_n_f32(-0.0f), vdupq_n_f32(-0.0f)}};
            if (i < n) {
                row_partials_blocks(type, part, w + (int64_t)(r + i) * row_bytes, &in, 1, nb, dotprod);
            }
            lo[i] = part[0][0];
            hi[i] = part[0][1];
        }
        store_rows(out, r, n, sum_partials4(lo, hi));
    }
}

/* The batched product: tokens in passes of up to BLOCKS_TOKENS (fewer where an affine type's
 * activation sums would not fit BLOCKS_XSUM_MAX), four rows at a time; each group of a row is
 * decoded once and its terms added to every token's partials, which the combine then sums for
 * each token as the matvec does. */
static inline __attribute__((always_inline)) void blocks_matmul(int type, float *out, int out_stride,
                                                                const uint8_t *w, const int8_t *x_qs,
                                                                const float *x_d, int n_tok, int rows, int cols,
                                                                int dotprod)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / blocks_values(type)) * blocks_bytes(type);
    int pass = BLOCKS_TOKENS;
    if (blocks_affine(type) && pass * nb > BLOCKS_XSUM_MAX) {
        pass = BLOCKS_XSUM_MAX / nb;
    }
    int32_t xs_a[BLOCKS_XSUM_MAX], xs_b[BLOCKS_XSUM_MAX];
    BlocksInput in[BLOCKS_TOKENS];
    float32x4_t part[4][BLOCKS_TOKENS][2];
    for (int t0 = 0; t0 < n_tok; t0 += pass) {
        const int nt = n_tok - t0 < pass ? n_tok - t0 : pass;
        if (blocks_affine(type)) {
            activation_sums(xs_a, xs_b, x_qs + (int64_t)t0 * cols, nt * nb);
        }
        for (int t = 0; t < nt; t++) {
            in[t].x_qs = x_qs + (int64_t)(t0 + t) * cols;
            in[t].x_d = x_d + (int64_t)(t0 + t) * nb;
            in[t].xs_a = xs_a + t * nb;
            in[t].xs_b = xs_b + t * nb;
        }
        for (int r = 0; r < rows; r += 4) {
            const int n = rows - r < 4 ? rows - r : 4;
            for (int i = 0; i < 4; i++) {
                for (int t = 0; t < nt; t++) {
                    part[i][t][0] = part[i][t][1] = vdupq_n_f32(-0.0f);
                }
                if (i < n) {
                    row_partials_blocks(type, part[i], w + (int64_t)(r + i) * row_bytes, in, nt, nb, dotprod);
                }
            }
            for (int t = 0; t < nt; t++) {
                const float32x4_t lo[4] = {part[0][t][0], part[1][t][0], part[2][t][0], part[3][t][0]};
                const float32x4_t hi[4] = {part[0][t][1], part[1][t][1], part[2][t][1], part[3][t][1]};
                store_rows(out + (int64_t)(t0 + t) * out_stride, r, n, sum_partials4(lo, hi));
            }
        }
    }
}

/* The entry points: SDOT where the CPU has it, else plain NEON. Rows of an affine type longer than
 * BLOCKS_ROW_MAX blocks take the scalar kernel (and, batched, tiles of it); one token's batched
 * product is the matvec. */

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q5_0_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q5_0, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q5_0_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_q5_0_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q5_0, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_q5_0, (int64_t)(cols / KERNEL_Q5_0_VALUES) * KERNEL_Q5_0_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q5_0_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q5_1_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q5_1, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q5_1_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_scalar_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
    } else if (have_dotprod()) {
        matvec_q5_1_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q5_1, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1 || cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_tiled_matmul_blocks(kernel_matvec_q5_1, (int64_t)(cols / KERNEL_Q5_1_VALUES) * KERNEL_Q5_1_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q5_1_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q4_k_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q4_K, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q4_k_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q4_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_scalar_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
    } else if (have_dotprod()) {
        matvec_q4_k_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q4_K, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1 || cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_tiled_matmul_blocks(kernel_matvec_q4_k, (int64_t)(cols / KERNEL_Q4_K_VALUES) * KERNEL_Q4_K_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q4_k_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q4_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q5_k_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q5_K, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q5_k_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q5_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_scalar_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
    } else if (have_dotprod()) {
        matvec_q5_k_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q5_K, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1 || cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_tiled_matmul_blocks(kernel_matvec_q5_k, (int64_t)(cols / KERNEL_Q5_K_VALUES) * KERNEL_Q5_K_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q5_k_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q5_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q6_k_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q6_K, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q6_k_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q6_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_q6_k_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q6_K, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_q6_k, (int64_t)(cols / KERNEL_Q6_K_VALUES) * KERNEL_Q6_K_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q6_k_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q6_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q3_k_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q3_K, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q3_k_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q3_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_q3_k_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q3_K, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_q3_k, (int64_t)(cols / KERNEL_Q3_K_VALUES) * KERNEL_Q3_K_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q3_k_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q3_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_q2_k_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_Q2_K, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_q2_k_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                  const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_Q2_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_scalar_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
    } else if (have_dotprod()) {
        matvec_q2_k_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_Q2_K, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    if (n_tok == 1 || cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        kernel_tiled_matmul_blocks(kernel_matvec_q2_k, (int64_t)(cols / KERNEL_Q2_K_VALUES) * KERNEL_Q2_K_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_q2_k_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_Q2_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_iq4_nl_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_IQ4_NL, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_iq4_nl_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                    const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_IQ4_NL, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_iq4_nl_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_IQ4_NL, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                          int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_iq4_nl, (int64_t)(cols / KERNEL_IQ4_NL_VALUES) * KERNEL_IQ4_NL_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_iq4_nl_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_IQ4_NL, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_mxfp4_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_MXFP4, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_mxfp4_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                    const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_MXFP4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_mxfp4_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_MXFP4, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                          int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_mxfp4, (int64_t)(cols / KERNEL_MXFP4_VALUES) * KERNEL_MXFP4_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_mxfp4_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_MXFP4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matvec_iq4_xs_dotprod(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(BLOCKS_IQ4_XS, out, w, x_qs, x_d, rows, cols, 1);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void matmul_iq4_xs_dotprod(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                                                    const float *x_d, int n_tok, int rows, int cols)
{
    blocks_matmul(BLOCKS_IQ4_XS, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 1);
}

void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_dotprod()) {
        matvec_iq4_xs_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(BLOCKS_IQ4_XS, out, w, x_qs, x_d, rows, cols, 0);
    }
}

void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                          int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_tiled_matmul_blocks(kernel_matvec_iq4_xs, (int64_t)(cols / KERNEL_IQ4_XS_VALUES) * KERNEL_IQ4_XS_BYTES, out,
                                   out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (have_dotprod()) {
        matmul_iq4_xs_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(BLOCKS_IQ4_XS, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

/* The weighted sum of values, four of a head's dimensions per vector (lane j carries out[j]'s chain
 * over the positions in order: a multiply, then an add, never fused), up to 32 dimensions (eight
 * vectors) in registers at once. */
void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim)
{
    for (int a = 0; a < n_q; a++) {
        float *o = out + (int64_t)a * out_stride;
        const float *w = p + (int64_t)a * p_stride;
        int j0 = 0;
        for (; j0 + 32 <= head_dim; j0 += 32) {
            float32x4_t acc[8];
            for (int v = 0; v < 8; v++) {
                acc[v] = vld1q_f32(o + j0 + 4 * v);
            }
            for (int i = 0; i < n; i++) {
                const float *row = values + (int64_t)i * stride + j0;
                const float32x4_t wi = vdupq_n_f32(w[i]);
                for (int v = 0; v < 8; v++) {
                    acc[v] = vaddq_f32(acc[v], vmulq_f32(wi, vld1q_f32(row + 4 * v)));
                }
            }
            for (int v = 0; v < 8; v++) {
                vst1q_f32(o + j0 + 4 * v, acc[v]);
            }
        }
        for (; j0 + 4 <= head_dim; j0 += 4) {
            float32x4_t acc = vld1q_f32(o + j0);
            for (int i = 0; i < n; i++) {
                acc = vaddq_f32(acc, vmulq_f32(vdupq_n_f32(w[i]), vld1q_f32(values + (int64_t)i * stride + j0)));
            }
            vst1q_f32(o + j0, acc);
        }
        for (; j0 < head_dim; j0++) {
            float acc = o[j0];
            for (int i = 0; i < n; i++) {
                acc = acc + w[i] * values[(int64_t)i * stride + j0];
            }
            o[j0] = acc;
        }
    }
}

/* binary16 -> float32 with fcvtl (exact, subnormals included). */
void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    }
    for (; i < n; i++) {
        out[i] = kernel_half_to_float(h[i]);
    }
}

/* q8_0 -> float32: each quant widened to float32 and times its block's widened scale (exact). */
void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float32x4_t scale = vdupq_n_f32(kernel_half_to_float(d[b]));
        for (int i = 0; i < KERNEL_QK; i += 8) {
            const int16x8_t q = vmovl_s8(vld1_s8(qs + b * KERNEL_QK + i));
            vst1q_f32(out + b * KERNEL_QK + i, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), scale));
            vst1q_f32(out + b * KERNEL_QK + i + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q))), scale));
        }
    }
}
