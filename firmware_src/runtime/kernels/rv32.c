/* Kernels for rv32imafc MCUs (no SIMD): the scalar kernels' arithmetic, arranged for fewer
 * instructions (``./colibri bench --board qemu-rv32`` counts them exactly, tests/c/rv32_selftest.c
 * each kernel alone). The q8_0 product works on 16 rows at once for a small model's 64- and
 * 128-column matrices and on 8 rows otherwise, with the 32-value block unrolled: every
 * multiply-add is an lb of the weight, a mul and an add, one lb of each activation quant serves
 * all the rows, and each row's binary16 block scale costs eight more per block (half_scaled says
 * why); about 3.31 instructions per multiply-add (3.25 when the scales were float32). Each row's
 * block sums and the reduction tree (kernels.h) are the scalar kernel's, so are the bits. q4_1
 * weights are read in place, eight rows at once (rows8_q4_1 says how), and so is every kept GGUF
 * type, two or four rows at once (the passes after kernel_matvec_q4_1). Portable C: it is also
 * tested against NumPy on the host. */
#include "kernels.h"
#include "../ops.h"

/* This set's own entry points (fallback.h defines the rest, attention with
 * one sum at a time: fewest instructions on an in-order core). */
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATMUL_Q8_0
#define KERNEL_HAS_QUANTIZE_Q8_0
#define KERNEL_HAS_SWIGLU
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_Q4_1
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_ATTENTION_F16
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#include "fallback.h"

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__)
/* GCC's first scheduling pass hoists the 256 loads of an unrolled block ahead of their use and
 * then spills the registers it ran out of; in program order the block fits in registers. Its code
 * hoisting would likewise lift the scale loads the two arms of ROWS16_FIXED's first-block branch
 * share above the branch, sixteen more live registers. */
#pragma GCC optimize("no-schedule-insns", "no-code-hoisting")
#endif

const char *kernel_set(void)
{
    return "rv32";
}

const char *kernel_cpu_features(void)
{
    return "none"; /* rv32imafc, fixed by the board file */
}

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

/* A binary16 KV cache's tile widened: half_scaled's four instructions, the 2^112 multiplied back
 * (exact: the value times 2^-112 times 2^112) and the store, six a value where the portable
 * kernel_half_to_float takes about twelve (its sign goes back by integer instructions). The same
 * bits as kernel_half_to_float for every encoding. */
void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    const int16_t *bits = (const int16_t *)h;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            out[i + k] = half_scaled(bits[i + k]) * 0x1p112f;
        }
    }
    for (; i < n; i++) {
        out[i] = half_scaled(bits[i]) * 0x1p112f;
    }
}

/* Attention over a binary16 cache read in place (kernels.h, kernel_attention_*_f16): each key or
 * value is decoded once, in registers, for up to F16_HEADS query heads of its group, where
 * widening it into a tile cost the lh, slli, and, fmv.w.x of half_scaled, an fmul and an fsw, and
 * then an flw for every head. Scores: the query heads are prescaled by 2^112 (exact while |q| <
 * 2^16; a larger finite query takes the widened path), so (q * 2^112) * half_scaled(k) is q * k
 * as a real number and rounds to the same float32, and every sum adds the same products in the
 * same order (j ascending from -0.0f); four positions share each query load. Value sums: the
 * value is widened (half_scaled times 2^112, exact), no check needed, and the sums of up to six
 * columns of four heads stay in 24 registers across the positions, each the chain over i in
 * order. A decoded value pays for itself against a widened one when it serves four heads, or the
 * one head of its group (7 instructions a value against 9); the two or three heads a group has
 * left over, and head widths that are not a multiple of 8, take the widened path (6 a value, then
 * 3 a head). */
#define F16_HEADS 4
#define F16_QUERIES 256 /* prescaled queries: 1 KiB of stack, four heads of up to 64 or one of 256 */

/* half_scaled's value in a float register (the empty asm statement): GCC would otherwise keep the
 * bits in an integer register and repeat the fmv.w.x for every product that uses them. */
static inline float half_in_register(int16_t h)
{
    float f = half_scaled(h);
#if defined(__riscv)
    __asm__("" : "+f"(f));
#endif
    return f;
}

/* The larger of m (never a NaN) and b, a NaN b passed over: RISC-V's fmax.s (picolibc's fmaxf is a
 * call); the same in C elsewhere (the host's build of this set). */
static inline float max_s(float m, float b)
{
#if defined(__riscv)
    __asm__("fmax.s %0, %0, %1" : "+f"(m) : "f"(b));
    return m;
#else
    return b > m ? b : m;
#endif
}

/* qs[j * h + a] = q[a * q_stride + j] * 2^112 for h heads (1 or 4); 0 if some product would not
 * be exact (a finite |q| of 2^16 or more; a NaN's products are NaN either way). Per value an flw,
 * the fmul, the fsw and fabs, fmax for the check. */
static int prescale_queries(float *qs, const float *q, int q_stride, int h, int head_dim)
{
    float top = 0.0f;
    if (h == F16_HEADS) {
        const float *q0 = q, *q1 = q0 + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
        for (int j = 0; j < head_dim; j++) {
            const float a = q0[j], b = q1[j], c = q2[j], d = q3[j];
            qs[0] = a * 0x1p112f;
            qs[1] = b * 0x1p112f;
            qs[2] = c * 0x1p112f;
            qs[3] = d * 0x1p112f;
            top = max_s(max_s(max_s(max_s(top, fabsf(a)), fabsf(b)), fabsf(c)), fabsf(d));
            qs += 4;
        }
    } else {
        for (int j = 0; j < head_dim; j++) {
            qs[j] = q[j] * 0x1p112f;
            top = max_s(top, fabsf(q[j]));
        }
    }
    return top < 0x1p16f;
}

/* Scores of four positions (rows stride apart) for four heads, written out (no arrays) so that GCC
 * keeps the 16 sums in registers: per column j, four keys decoded (lh, slli, and, fmv.w.x) and
 * four query loads, each serving four products (fmul, fadd): 13 instructions per key value where
 * a float32 tile takes 12 (an flw per head). Column 0's products start the sums (SC4_FIRST: -0.0f
 * + t == t for every float t, so the same bits as the scalar kernel's start from -0.0f). */
#define SC4_KEYS(j)                                                                                \
    const float k0 = half_in_register(r0[j]), k1 = half_in_register(r1[j]);                        \
    const float k2 = half_in_register(r2[j]), k3 = half_in_register(r3[j])
#define SC4_HEAD(a, j)                                                                             \
    do {                                                                                           \
        const float qa = qs[4 * (j) + (a)];                                                        \
        s##a##0 = s##a##0 + qa * k0;                                                               \
        s##a##1 = s##a##1 + qa * k1;                                                               \
        s##a##2 = s##a##2 + qa * k2;                                                               \
        s##a##3 = s##a##3 + qa * k3;                                                               \
    } while (0)
#define SC4_COLUMN(j)                                                                              \
    do {                                                                                           \
        SC4_KEYS(j);                                                                               \
        SC4_HEAD(0, j);                                                                            \
        SC4_HEAD(1, j);                                                                            \
        SC4_HEAD(2, j);                                                                            \
        SC4_HEAD(3, j);                                                                            \
    } while (0)
#define SC4_FIRST_HEAD(a)                                                                          \
    const float q##a = qs[a];                                                                      \
    float s##a##0 = q##a * k0, s##a##1 = q##a * k1, s##a##2 = q##a * k2, s##a##3 = q##a * k3
#define SC4_EIGHT(j)                                                                               \
    do {                                                                                           \
        SC4_COLUMN((j) + 0);                                                                       \
        SC4_COLUMN((j) + 1);                                                                       \
        SC4_COLUMN((j) + 2);                                                                       \
        SC4_COLUMN((j) + 3);                                                                       \
        SC4_COLUMN((j) + 4);                                                                       \
        SC4_COLUMN((j) + 5);                                                                       \
        SC4_COLUMN((j) + 6);                                                                       \
        SC4_COLUMN((j) + 7);                                                                       \
    } while (0)
#define SC4_STORE(a)                                                                               \
    do {                                                                                           \
        float *o = att + (a) * att_stride;                                                         \
        o[0] = s##a##0 * scale;                                                                    \
        o[1] = s##a##1 * scale;                                                                    \
        o[2] = s##a##2 * scale;                                                                    \
        o[3] = s##a##3 * scale;                                                                    \
    } while (0)

/* Positions 0 .. 4 * blocks - 1, four at a time. */
__attribute__((noinline)) static void scores_f16_4x4(float *att, int att_stride, const float *q4, const int16_t *k,
                                                     int stride, int blocks, int head_dim, float scale)
{
    for (int b = 0; b < blocks; b++) {
        const int16_t *r0 = k, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
        const float *qs = q4;
        SC4_KEYS(0);
        SC4_FIRST_HEAD(0);
        SC4_FIRST_HEAD(1);
        SC4_FIRST_HEAD(2);
        SC4_FIRST_HEAD(3);
        SC4_COLUMN(1);
        SC4_COLUMN(2);
        SC4_COLUMN(3);
        SC4_COLUMN(4);
        SC4_COLUMN(5);
        SC4_COLUMN(6);
        SC4_COLUMN(7);
        for (int j = 8; j < head_dim; j += 8) {
            r0 += 8, r1 += 8, r2 += 8, r3 += 8;
            qs += 32;
            SC4_EIGHT(0);
        }
        SC4_STORE(0);
        SC4_STORE(1);
        SC4_STORE(2);
        SC4_STORE(3);
        att += 4;
        k += 4 * stride;
    }
}

/* Positions 0 .. n - 1 one at a time for four heads (what the four-position blocks leave): per
 * column one key decoded and four query loads, fmul and fadd. */
#define SC1_COLUMN(j)                                                                              \
    do {                                                                                           \
        const float kj = half_in_register(r[j]);                                                   \
        s0 = s0 + qs[4 * (j)] * kj;                                                                \
        s1 = s1 + qs[4 * (j) + 1] * kj;                                                            \
        s2 = s2 + qs[4 * (j) + 2] * kj;                                                            \
        s3 = s3 + qs[4 * (j) + 3] * kj;                                                            \
    } while (0)

__attribute__((noinline)) static void scores_f16_1x4(float *att, int att_stride, const float *q4, const int16_t *k,
                                                     int stride, int n, int head_dim, float scale)
{
    for (int i = 0; i < n; i++) {
        const int16_t *r = k + i * stride;
        const float *qs = q4;
        float s0 = -0.0f, s1 = -0.0f, s2 = -0.0f, s3 = -0.0f;
        for (int j = 0; j < head_dim; j += 8) {
            SC1_COLUMN(0);
            SC1_COLUMN(1);
            SC1_COLUMN(2);
            SC1_COLUMN(3);
            SC1_COLUMN(4);
            SC1_COLUMN(5);
            SC1_COLUMN(6);
            SC1_COLUMN(7);
            r += 8;
            qs += 32;
        }
        att[i] = s0 * scale;
        att[att_stride + i] = s1 * scale;
        att[2 * att_stride + i] = s2 * scale;
        att[3 * att_stride + i] = s3 * scale;
    }
}

/* Every position for one head (a group's last heads when it has not a multiple of four). */
static void scores_f16_one_head(float *att, const float *qs, const int16_t *k, int stride, int n, int head_dim,
                                float scale)
{
    for (int i = 0; i < n; i++) {
        const int16_t *r = k + i * stride;
        float s = -0.0f;
        for (int j = 0; j < head_dim; j += 8) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                s = s + qs[j + c] * half_scaled(r[j + c]);
            }
        }
        att[i] = s * scale;
    }
}

void kernel_attention_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                 const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                                 int tile_rows)
{
    float qs[F16_QUERIES];
    const int16_t *k = (const int16_t *)keys;
    const int fours = head_dim % 8 == 0 && F16_HEADS * head_dim <= F16_QUERIES;
    const int ones = head_dim % 8 == 0 && head_dim <= F16_QUERIES;
    for (int a = 0; a < n_q;) {
        const int four = n_q - a >= F16_HEADS && fours, one = n_q - a == 1 && ones;
        const int h = four ? F16_HEADS : (one ? 1 : n_q - a);
        float *at = att + (int64_t)a * att_stride;
        const float *qa = q + (int64_t)a * q_stride;
        if (!(four || one) || !prescale_queries(qs, qa, q_stride, h, head_dim)) {
            fallback_widened_scores_f16(at, att_stride, qa, q_stride, h, keys, stride, n, head_dim, scale, tile,
                                        tile_rows);
        } else if (h == F16_HEADS) {
            const int i = n / 4 * 4;
            if (i > 0) {
                scores_f16_4x4(at, att_stride, qs, k, stride, n / 4, head_dim, scale);
            }
            if (i < n) {
                scores_f16_1x4(at + i, att_stride, qs, k + (int64_t)i * stride, stride, n - i, head_dim, scale);
            }
        } else {
            scores_f16_one_head(at, qs, k, stride, n, head_dim, scale);
        }
        a += h;
    }
}

/* Columns 0 .. C - 1 of H heads' value sums over n positions, in registers throughout. */
static inline __attribute__((always_inline)) void mix_f16_columns(float *out, int out_stride, const float *p,
                                                                  int p_stride, const int16_t *v, int stride, int n,
                                                                  const int H, const int C)
{
    float acc[F16_HEADS][8];
    #pragma GCC unroll 8
    for (int a = 0; a < H; a++) {
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            acc[a][c] = out[a * out_stride + c];
        }
    }
    for (int i = 0; i < n; i++) {
        float w[F16_HEADS];
        #pragma GCC unroll 8
        for (int a = 0; a < H; a++) {
            w[a] = p[a * p_stride + i];
        }
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const float x = half_scaled(v[c]) * 0x1p112f;
            #pragma GCC unroll 8
            for (int a = 0; a < H; a++) {
                acc[a][c] = acc[a][c] + w[a] * x;
            }
        }
        v += stride;
    }
    #pragma GCC unroll 8
    for (int a = 0; a < H; a++) {
        #pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            out[a * out_stride + c] = acc[a][c];
        }
    }
}

void kernel_attention_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                              const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows)
{
    if (head_dim % 8 != 0) {
        fallback_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
        return;
    }
    const int16_t *v = (const int16_t *)values;
    int a = 0;
    for (; a + F16_HEADS <= n_q; a += F16_HEADS) {
        float *o = out + (int64_t)a * out_stride;
        const float *pa = p + (int64_t)a * p_stride;
        int j = 0;
        for (; j + 6 <= head_dim; j += 6) {
            mix_f16_columns(o + j, out_stride, pa, p_stride, v + j, stride, n, F16_HEADS, 6);
        }
        if (head_dim - j == 4) {
            mix_f16_columns(o + j, out_stride, pa, p_stride, v + j, stride, n, F16_HEADS, 4);
        } else if (head_dim - j == 2) {
            mix_f16_columns(o + j, out_stride, pa, p_stride, v + j, stride, n, F16_HEADS, 2);
        }
    }
    if (n_q - a == 1) {
        for (int j = 0; j < head_dim; j += 8) {
            mix_f16_columns(out + (int64_t)a * out_stride + j, out_stride, p + (int64_t)a * p_stride, p_stride, v + j,
                            stride, n, 1, 8);
        }
    } else if (a < n_q) {
        fallback_widened_mix_f16(out + (int64_t)a * out_stride, out_stride, p + (int64_t)a * p_stride, p_stride,
                                 n_q - a, values, stride, n, head_dim, tile, tile_rows);
    }
}

/* xs[b] = x_d[b] * 2^112 for the nb blocks; 0 if some block's X_b would not be exact. */
static int prescale(float *xs, const float *x_d, int nb)
{
    int exact = 1;
    for (int b = 0; b < nb; b++) {
        exact &= fabsf(x_d[b]) < 0x1p16f;
        xs[b] = x_d[b] * 0x1p112f;
    }
    return exact;
}

/* v, which the compiler cannot see through (an empty asm statement that might change it): a row
 * pass walks its rows' scales with one pointer and this stride, an add per row, where GCC would
 * otherwise keep one induction variable per row and spill them. */
static inline int opaque(int v)
{
    __asm__("" : "+r"(v));
    return v;
}

/* Every row's accumulator starts at -0.0f and every block term is added to it: -0.0f + t == t
 * for every float t (+0.0f included), so this is the scalar kernel's "first term is the initial
 * value" without a branch. (The 16-row passes start from their first terms instead.) */
#define ACC_START (-0.0f)

/* How many partial sums a row pass keeps: the reduction tree's eight (kernels.h), except for rows
 * of at most eight blocks, where each partial holds one block and the tree is the sequential sum:
 * one partial then, its blocks in order, and the pass sets up its loop once instead of per block. */
static inline int row_parts(int nb)
{
    return nb <= KERNEL_PARTIALS ? 1 : KERNEL_PARTIALS;
}

/* One row: the reduction tree (kernels.h) as two loops: partial k sums the blocks k, k + 8, ...
 * in order, and is then added to the row's total. Rows of at most 8 blocks run each inner loop
 * once, which is the plain sequential sum. */
static void one_row(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs, const float *xs, int nb)
{
    float total = ACC_START;
    for (int k = 0; k < nb && k < KERNEL_PARTIALS; k++) {
        float acc = ACC_START;
        for (int b = k; b < nb; b += KERNEL_PARTIALS) {
            int32_t s = 0;
            for (int i = 0; i < KERNEL_QK; i++) {
                s += (int32_t)w[b * KERNEL_QK + i] * (int32_t)x_qs[b * KERNEL_QK + i];
            }
            acc = acc + (float)s * (half_scaled(wd[b]) * xs[b]);
        }
        total = total + acc;
    }
    *out = total;
}

/* Eight rows side by side: one load of each activation quant serves eight products, and each
 * row keeps its own int32 block sum and float accumulator. Written out row by row (no arrays),
 * so that GCC keeps all of it in registers; the rows' scales are reached by one pointer stepping
 * nb halves (opaque), the partial sums as row_parts says. 3.67 instructions per multiply-add at
 * 32x288 (nine blocks: eight partials, each set up on its own), 3.62 with float32 scales. */
#define MAC8(i)                                                                                     \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p0[i] * xi;                                                                           \
        s1 += p1[i] * xi;                                                                           \
        s2 += p2[i] * xi;                                                                           \
        s3 += p3[i] * xi;                                                                           \
        s4 += p4[i] * xi;                                                                           \
        s5 += p5[i] * xi;                                                                           \
        s6 += p6[i] * xi;                                                                           \
        s7 += p7[i] * xi;                                                                           \
    } while (0)

__attribute__((noinline)) static void rows8(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs,
                                            const float *xs, int cols)
{
    const int nb = cols / KERNEL_QK;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    float t4 = ACC_START, t5 = ACC_START, t6 = ACC_START, t7 = ACC_START;
    /* partial k of every row: blocks k, k + parts, ... (the reduction tree, kernels.h) */
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const int8_t *p0 = w + k * KERNEL_QK, *p1 = p0 + cols, *p2 = p1 + cols, *p3 = p2 + cols;
        const int8_t *p4 = p3 + cols, *p5 = p4 + cols, *p6 = p5 + cols, *p7 = p6 + cols;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        float a4 = ACC_START, a5 = ACC_START, a6 = ACC_START, a7 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma GCC unroll 8
            for (int i = 0; i < KERNEL_QK; i += 4) {
                MAC8(i);
                MAC8(i + 1);
                MAC8(i + 2);
                MAC8(i + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b;
            const int step = opaque(nb);
            a0 = a0 + (float)s0 * (half_scaled(*d) * xd);
            d += step;
            a1 = a1 + (float)s1 * (half_scaled(*d) * xd);
            d += step;
            a2 = a2 + (float)s2 * (half_scaled(*d) * xd);
            d += step;
            a3 = a3 + (float)s3 * (half_scaled(*d) * xd);
            d += step;
            a4 = a4 + (float)s4 * (half_scaled(*d) * xd);
            d += step;
            a5 = a5 + (float)s5 * (half_scaled(*d) * xd);
            d += step;
            a6 = a6 + (float)s6 * (half_scaled(*d) * xd);
            d += step;
            a7 = a7 + (float)s7 * (half_scaled(*d) * xd);
            p0 += parts * KERNEL_QK;
            p1 += parts * KERNEL_QK;
            p2 += parts * KERNEL_QK;
            p3 += parts * KERNEL_QK;
            p4 += parts * KERNEL_QK;
            p5 += parts * KERNEL_QK;
            p6 += parts * KERNEL_QK;
            p7 += parts * KERNEL_QK;
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
        t4 = t4 + a4;
        t5 = t5 + a5;
        t6 = t6 + a6;
        t7 = t7 + a7;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
    out[4] = t4;
    out[5] = t5;
    out[6] = t6;
    out[7] = t7;
}

/* The same for the last four rows of a matrix whose row count is not a multiple of eight. */
#define MAC4(i)                                                                                     \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p0[i] * xi;                                                                           \
        s1 += p1[i] * xi;                                                                           \
        s2 += p2[i] * xi;                                                                           \
        s3 += p3[i] * xi;                                                                           \
    } while (0)

__attribute__((noinline)) static void rows4(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs,
                                            const float *xs, int cols)
{
    const int nb = cols / KERNEL_QK;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const int8_t *p0 = w + k * KERNEL_QK, *p1 = p0 + cols, *p2 = p1 + cols, *p3 = p2 + cols;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma GCC unroll 8
            for (int i = 0; i < KERNEL_QK; i += 4) {
                MAC4(i);
                MAC4(i + 1);
                MAC4(i + 2);
                MAC4(i + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b;
            const int step = opaque(nb);
            a0 = a0 + (float)s0 * (half_scaled(*d) * xd);
            d += step;
            a1 = a1 + (float)s1 * (half_scaled(*d) * xd);
            d += step;
            a2 = a2 + (float)s2 * (half_scaled(*d) * xd);
            d += step;
            a3 = a3 + (float)s3 * (half_scaled(*d) * xd);
            p0 += parts * KERNEL_QK;
            p1 += parts * KERNEL_QK;
            p2 += parts * KERNEL_QK;
            p3 += parts * KERNEL_QK;
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
}

/* Sixteen rows of a matrix with COLS columns known at compile time (a small model's, COLS <=
 * 128): all sixteen rows are reached from one pointer with constant offsets (15 * 128 + 31 fits
 * a load's 12-bit offset), which leaves the registers for sixteen sums, so one load of each
 * activation quant serves sixteen products. Such rows have at most 4 blocks, one per partial of
 * the reduction tree, so adding every term to one running sum in block order is that tree. Block
 * 0's terms start the sums (FIRST_TERM) instead of being added to -0.0f, which changes no bits and
 * saves a group of sixteen rows 16 fmv.s and 16 fadd.s: a branch per block between two copies of
 * the sixteen terms (not of the block's 1,500 multiply-adds). Per row and block: 32 lb, 32 mul and
 * 31 add, 2 lb of the shared activation quants, lh, slli, and, fmv.w.x, fmul (w_d * x_d),
 * fcvt.s.w, fmul and fadd (not in block 0); measured 3.31 (512x64) to 3.33 (64x64) instructions
 * per multiply-add with the calls' own costs, 3.25-3.27 with float32 scales. */
#define MAC16(i)                                                                                    \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p[0 * COLS + (i)] * xi;                                                               \
        s1 += p[1 * COLS + (i)] * xi;                                                               \
        s2 += p[2 * COLS + (i)] * xi;                                                               \
        s3 += p[3 * COLS + (i)] * xi;                                                               \
        s4 += p[4 * COLS + (i)] * xi;                                                               \
        s5 += p[5 * COLS + (i)] * xi;                                                               \
        s6 += p[6 * COLS + (i)] * xi;                                                               \
        s7 += p[7 * COLS + (i)] * xi;                                                               \
        s8 += p[8 * COLS + (i)] * xi;                                                               \
        s9 += p[9 * COLS + (i)] * xi;                                                               \
        s10 += p[10 * COLS + (i)] * xi;                                                             \
        s11 += p[11 * COLS + (i)] * xi;                                                             \
        s12 += p[12 * COLS + (i)] * xi;                                                             \
        s13 += p[13 * COLS + (i)] * xi;                                                             \
        s14 += p[14 * COLS + (i)] * xi;                                                             \
        s15 += p[15 * COLS + (i)] * xi;                                                             \
    } while (0)

#define FIRST_TERM(k) a##k = (float)s##k * (half_scaled(d[(k) * NB]) * xd)
#define ADD_TERM(k) a##k = a##k + (float)s##k * (half_scaled(d[(k) * NB]) * xd)

#if defined(__GNUC__) && !defined(__clang__)
/* Block 0 sets every accumulator before any block adds to it; x86-64 GCC 12 does not see that
 * (riscv64-unknown-elf-gcc 12 does). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* `groups` groups of sixteen rows, one after another. */
#define ROWS16_FIXED(NAME, COLS_VALUE)                                                              \
    __attribute__((noinline)) static void NAME(float *out, const int8_t *w, const int16_t *wd,       \
                                               const int8_t *x_qs, const float *xs, int groups)     \
    {                                                                                               \
        enum { COLS = COLS_VALUE, NB = COLS_VALUE / KERNEL_QK };                                    \
        _Static_assert(NB <= KERNEL_PARTIALS, "one block per partial: the sequential sum is the tree"); \
        for (; groups > 0; groups--, out += 16, w += 16 * COLS, wd += 16 * NB) {                    \
        const int8_t *x = x_qs;                                                                     \
        float a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15;                \
        const int8_t *p = w;                                                                        \
        for (int b = 0; b < NB; b++) {                                                              \
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;                \
            int32_t s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;           \
            _Pragma("GCC unroll 8") for (int i = 0; i < KERNEL_QK; i += 4)                          \
            {                                                                                       \
                MAC16(i);                                                                           \
                MAC16(i + 1);                                                                       \
                MAC16(i + 2);                                                                       \
                MAC16(i + 3);                                                                       \
            }                                                                                       \
            const float xd = xs[b];                                                                 \
            const int16_t *d = wd + b;                                                              \
            if (b == 0) {                                                                           \
                FIRST_TERM(0);                                                                      \
                FIRST_TERM(1);                                                                      \
                FIRST_TERM(2);                                                                      \
                FIRST_TERM(3);                                                                      \
                FIRST_TERM(4);                                                                      \
                FIRST_TERM(5);                                                                      \
                FIRST_TERM(6);                                                                      \
                FIRST_TERM(7);                                                                      \
                FIRST_TERM(8);                                                                      \
                FIRST_TERM(9);                                                                      \
                FIRST_TERM(10);                                                                     \
                FIRST_TERM(11);                                                                     \
                FIRST_TERM(12);                                                                     \
                FIRST_TERM(13);                                                                     \
                FIRST_TERM(14);                                                                     \
                FIRST_TERM(15);                                                                     \
            } else {                                                                                \
                ADD_TERM(0);                                                                        \
                ADD_TERM(1);                                                                        \
                ADD_TERM(2);                                                                        \
                ADD_TERM(3);                                                                        \
                ADD_TERM(4);                                                                        \
                ADD_TERM(5);                                                                        \
                ADD_TERM(6);                                                                        \
                ADD_TERM(7);                                                                        \
                ADD_TERM(8);                                                                        \
                ADD_TERM(9);                                                                        \
                ADD_TERM(10);                                                                       \
                ADD_TERM(11);                                                                       \
                ADD_TERM(12);                                                                       \
                ADD_TERM(13);                                                                       \
                ADD_TERM(14);                                                                       \
                ADD_TERM(15);                                                                       \
            }                                                                                       \
            p += KERNEL_QK;                                                                         \
            x += KERNEL_QK;                                                                         \
        }                                                                                           \
        out[0] = a0;                                                                                \
        out[1] = a1;                                                                                \
        out[2] = a2;                                                                                \
        out[3] = a3;                                                                                \
        out[4] = a4;                                                                                \
        out[5] = a5;                                                                                \
        out[6] = a6;                                                                                \
        out[7] = a7;                                                                                \
        out[8] = a8;                                                                                \
        out[9] = a9;                                                                                \
        out[10] = a10;                                                                              \
        out[11] = a11;                                                                              \
        out[12] = a12;                                                                              \
        out[13] = a13;                                                                              \
        out[14] = a14;                                                                              \
        out[15] = a15;                                                                              \
        }                                                                                           \
    }

ROWS16_FIXED(rows16_cols64, 64)
ROWS16_FIXED(rows16_cols128, 128)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* Rows in every pass that fits: sixteen, then eight, four and one at a time. */
__attribute__((noinline)) static void matvec_q8_0_rows(float *out, const int8_t *w_qs, const int16_t *wd,
                                                       const int8_t *x_qs, const float *xs, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int r = 0;
    if (cols == 64) {
        rows16_cols64(out, w_qs, wd, x_qs, xs, rows / 16);
        r = rows / 16 * 16;
    } else if (cols == 128) {
        rows16_cols128(out, w_qs, wd, x_qs, xs, rows / 16);
        r = rows / 16 * 16;
    }
    for (; r + 8 <= rows; r += 8) {
        rows8(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, cols);
    }
    if (r + 4 <= rows) {
        rows4(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, cols);
        r += 4;
    }
    for (; r < rows; r++) {
        one_row(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, nb);
    }
}

/* A small model's products are short (1,000 to 33,000 multiply-adds a call for the default one),
 * so their fixed costs count: a matrix of whole sixteen-row groups (all of the default model's)
 * goes from here straight to its pass, about 100 instructions a call beyond the passes' own. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    float xs[XS_BLOCKS];
    if (nb > XS_BLOCKS || !prescale(xs, x_d, nb)) {
        kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else if (cols == 64 && rows % 16 == 0) {
        rows16_cols64(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows / 16);
    } else if (cols == 128 && rows % 16 == 0) {
        rows16_cols128(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows / 16);
    } else {
        matvec_q8_0_rows(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows, cols);
    }
}

/* The scalar kernel's quantization, with shortcuts that give the same bits: values are rounded
 * to the nearest integer, ties to even, by lrintf in the default rounding mode (one fcvt.w.s
 * instead of op_round_even's two additions and a conversion); and the clamp to +-127 is skipped
 * for a block whose largest magnitude times 1/d stays below 127.5, since rounding is monotonic and
 * no value of the block can then round beyond 127. (Where the clamp is needed it is applied
 * before rounding: the bounds are integers, so that is the same as after.) */
void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        int8_t *qb = qs + b * KERNEL_QK;
        float amax = 0.0f;
#pragma GCC unroll 32
        for (int i = 0; i < KERNEL_QK; i++) {
            const float a = fabsf(xb[i]);
            if (a > amax) {
                amax = a;
            }
        }
        const float scale = amax / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        if (amax * inv < 127.5f) {
#pragma GCC unroll 32
            for (int i = 0; i < KERNEL_QK; i++) {
                qb[i] = (int8_t)lrintf(xb[i] * inv);
            }
        } else {
            for (int i = 0; i < KERNEL_QK; i++) {
                float v = xb[i] * inv;
                if (v > 127.0f) {
                    v = 127.0f;
                }
                if (v < -127.0f) {
                    v = -127.0f;
                }
                qb[i] = (int8_t)lrintf(v);
            }
        }
    }
}

/* SwiGLU with op_silu_inline (ops.h), op_silu's own definition inlined into the loop: its
 * constants stay in float registers for the whole loop, and op_silu's call, return and eleven
 * constant loads (two instructions each) are gone: 37 instructions per value instead of the scalar
 * kernel's 62 (tests/c/rv32_selftest.c), 12,700 fewer per decoded token of the default model, which
 * pays for most of the binary16 scales' widening. */
void kernel_swiglu(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_silu_inline(gate[i]) * up[i];
    }
}

/* Batched products (prefill) as fallback.h's tiled ones, tiles of rows that stay in cache
 * while every token passes over them, but a multiple of 16 rows each, so that all of a tile goes
 * through the 16-row passes. */
__attribute__((noinline)) static void matmul_q8_0_tiles(float *out, int out_stride, const int8_t *w_qs,
                                                        const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                                                        int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int tile = 16384 / (cols + nb * (int)sizeof(KernelHalf)) / 16 * 16;
    tile = tile < 16 ? 16 : tile;
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q8_0(out + (int64_t)t * out_stride + r, w_qs + (int64_t)r * cols, w_d + (int64_t)r * nb,
                               x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}

/* One token (decode) is the product itself: a jump, no frame of this function's own. */
void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        matmul_q8_0_tiles(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

/* q4_1, read in place (two quants per byte), eight rows at once. A byte holds quant lo of value j
 * (low nibble) and hi of value j + 16 (high nibble): byte = lo + 16 * hi. Writing x = x_qs[j] and
 * y = x_qs[j + 16],
 *     16 * (lo * x + hi * y) = lo * (16 * x - y) + byte * y,
 * so with a = 16 * x - y, made once per byte for all eight rows, a row needs only the low nibble
 * (an andi) and two multiply-adds per byte, never the high nibble (no shift): lbu, andi, mul, add,
 * mul, add for two multiply-adds, 3 instructions per multiply-add. The 16 bytes of a block sum to
 * 16 * isum exactly (|sum| < 2^21) and an arithmetic shift by 4 gives isum. The activation blocks'
 * sums xsum do not depend on the row: kernel_matvec_q4_1 makes them once per call, for all the
 * rows, into XS_BLOCKS int32s on the stack next to the prescaled activation scales (2 KiB
 * together: rows of up to 8192 values; longer rows take the scalar kernel). Each row's term is
 * kernel_q4_1_term with its scale and minimum as half_scaled and the activation scale prescaled
 * (the same two real products, so the same bits), summed by the reduction tree as rows8 sums
 * q8_0's (row_parts), so the bits are the scalar kernel's. With each row's widening of its scale
 * and minimum (eight instructions), two float products, two additions and its conversions per
 * block, it measures 4.19-4.37 instructions per multiply-add (tests/c/rv32_selftest.c; 4.28-4.40
 * with float32 scales, before row_parts and the stepping scale pointer): q8_0 takes 3.31, and q4_0
 * read in place (the scalar kernel; boards with room read an int8 copy with the q8_0 kernel
 * instead) 8.2-8.8. */
#define Q41_MAC8(j)                                                                                 \
    do {                                                                                            \
        const int32_t xj = x[j], yj = x[(j) + KERNEL_QK / 2];                                       \
        const int32_t aj = xj * 16 - yj;                                                            \
        s0 += (p0[j] & 0x0F) * aj + p0[j] * yj;                                                     \
        s1 += (p1[j] & 0x0F) * aj + p1[j] * yj;                                                     \
        s2 += (p2[j] & 0x0F) * aj + p2[j] * yj;                                                     \
        s3 += (p3[j] & 0x0F) * aj + p3[j] * yj;                                                     \
        s4 += (p4[j] & 0x0F) * aj + p4[j] * yj;                                                     \
        s5 += (p5[j] & 0x0F) * aj + p5[j] * yj;                                                     \
        s6 += (p6[j] & 0x0F) * aj + p6[j] * yj;                                                     \
        s7 += (p7[j] & 0x0F) * aj + p7[j] * yj;                                                     \
    } while (0)

/* The sum of each activation block's 32 quants: the affine types' xsum, which does not depend on
 * the row, made once per call. */
static void activation_sums(int32_t *x_sums, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int j = 0; j < KERNEL_QK; j++) {
            sum += x_qs[b * KERNEL_QK + j];
        }
        x_sums[b] = sum;
    }
}

/* The same for every 16 quants (Q6_K's scales cover 16 values). */
static void activation_sums16(int32_t *x_sums, const int8_t *x_qs, int n16)
{
    for (int g = 0; g < n16; g++) {
        int32_t sum = 0;
        for (int j = 0; j < 16; j++) {
            sum += x_qs[g * 16 + j];
        }
        x_sums[g] = sum;
    }
}

/* isum from 16 * isum: an exact multiple of 16, so the arithmetic shift (GCC's >> on a negative
 * int) divides exactly. */
static inline int32_t q4_1_isum(int32_t sum16)
{
    return sum16 >> 4;
}

__attribute__((noinline)) static void rows8_q4_1(float *out, const uint8_t *w, const int16_t *wd, const int16_t *wm,
                                                 const int8_t *x_qs, const float *xs, const int32_t *x_sums,
                                                 int cols)
{
    const int nb = cols / KERNEL_QK, rb = cols / 2;
    const int parts = row_parts(nb);
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    float t4 = ACC_START, t5 = ACC_START, t6 = ACC_START, t7 = ACC_START;
    for (int k = 0; k < parts; k++) {
        const uint8_t *p0 = w + k * (KERNEL_QK / 2), *p1 = p0 + rb, *p2 = p1 + rb, *p3 = p2 + rb;
        const uint8_t *p4 = p3 + rb, *p5 = p4 + rb, *p6 = p5 + rb, *p7 = p6 + rb;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        float a4 = ACC_START, a5 = ACC_START, a6 = ACC_START, a7 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma GCC unroll 4
            for (int j = 0; j < KERNEL_QK / 2; j += 4) {
                Q41_MAC8(j);
                Q41_MAC8(j + 1);
                Q41_MAC8(j + 2);
                Q41_MAC8(j + 3);
            }
            const int32_t xsum = x_sums[b];
            const float xd = xs[b];
            const int16_t *d = wd + b, *m = wm + b;
            const int step = opaque(nb);
            a0 = a0 + kernel_q4_1_term(q4_1_isum(s0), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a1 = a1 + kernel_q4_1_term(q4_1_isum(s1), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a2 = a2 + kernel_q4_1_term(q4_1_isum(s2), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a3 = a3 + kernel_q4_1_term(q4_1_isum(s3), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a4 = a4 + kernel_q4_1_term(q4_1_isum(s4), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a5 = a5 + kernel_q4_1_term(q4_1_isum(s5), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a6 = a6 + kernel_q4_1_term(q4_1_isum(s6), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a7 = a7 + kernel_q4_1_term(q4_1_isum(s7), xsum, half_scaled(*d), half_scaled(*m), xd);
            p0 += parts * (KERNEL_QK / 2);
            p1 += parts * (KERNEL_QK / 2);
            p2 += parts * (KERNEL_QK / 2);
            p3 += parts * (KERNEL_QK / 2);
            p4 += parts * (KERNEL_QK / 2);
            p5 += parts * (KERNEL_QK / 2);
            p6 += parts * (KERNEL_QK / 2);
            p7 += parts * (KERNEL_QK / 2);
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
        t4 = t4 + a4;
        t5 = t5 + a5;
        t6 = t6 + a6;
        t7 = t7 + a7;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
    out[4] = t4;
    out[5] = t5;
    out[6] = t6;
    out[7] = t7;
}

/* The same for four rows (the last ones of a matrix whose row count is not a multiple of eight). */
#define Q41_MAC4(j)                                                                                 \
    do {                                                                                            \
        const int32_t xj = x[j], yj = x[(j) + KERNEL_QK / 2];                                       \
        const int32_t aj = xj * 16 - yj;                                                            \
        s0 += (p0[j] & 0x0F) * aj + p0[j] * yj;                                                     \
        s1 += (p1[j] & 0x0F) * aj + p1[j] * yj;                                                     \
        s2 += (p2[j] & 0x0F) * aj + p2[j] * yj;                                                     \
        s3 += (p3[j] & 0x0F) * aj + p3[j] * yj;                                                     \
    } while (0)

__attribute__((noinline)) static void rows4_q4_1(float *out, const uint8_t *w, const int16_t *wd, const int16_t *wm,
                                                 const int8_t *x_qs, const float *xs, const int32_t *x_sums,
                                                 int cols)
{
    const int nb = cols / KERNEL_QK, rb = cols / 2;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const uint8_t *p0 = w + k * (KERNEL_QK / 2), *p1 = p0 + rb, *p2 = p1 + rb, *p3 = p2 + rb;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            const int32_t xsum = x_sums[b];
#pragma GCC unroll 4
            for (int j = 0; j < KERNEL_QK / 2; j += 4) {
                Q41_MAC4(j);
                Q41_MAC4(j + 1);
                Q41_MAC4(j + 2);
                Q41_MAC4(j + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b, *m = wm + b;
            const int step = opaque(nb);
            a0 = a0 + kernel_q4_1_term(q4_1_isum(s0), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a1 = a1 + kernel_q4_1_term(q4_1_isum(s1), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a2 = a2 + kernel_q4_1_term(q4_1_isum(s2), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a3 = a3 + kernel_q4_1_term(q4_1_isum(s3), xsum, half_scaled(*d), half_scaled(*m), xd);
            p0 += parts * (KERNEL_QK / 2);
            p1 += parts * (KERNEL_QK / 2);
            p2 += parts * (KERNEL_QK / 2);
            p3 += parts * (KERNEL_QK / 2);
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
}

void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int r = 0;
    int32_t x_sums[XS_BLOCKS];
    float xs[XS_BLOCKS];
    if (nb <= XS_BLOCKS && rows >= 4 && prescale(xs, x_d, nb)) {
        const int16_t *wd = (const int16_t *)w_d, *wm = (const int16_t *)w_m;
        activation_sums(x_sums, x_qs, nb);
        for (; r + 8 <= rows; r += 8) {
            rows8_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), wd + (int64_t)r * nb, wm + (int64_t)r * nb,
                       x_qs, xs, x_sums, cols);
        }
        if (r + 4 <= rows) {
            rows4_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), wd + (int64_t)r * nb, wm + (int64_t)r * nb,
                       x_qs, xs, x_sums, cols);
            r += 4;
        }
    }
    /* the last one to three rows (or all of a matrix too wide for x_sums, or with an activation
     * scale of 2^16 or more): the scalar kernel's loop */
    if (r < rows) {
        kernel_scalar_matvec_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), w_d + (int64_t)r * nb,
                                  w_m + (int64_t)r * nb, x_qs, x_d, rows - r, cols);
    }
}

/* Batched q4_1 as the q8_0 one above: tiles of a multiple of 8 rows that stay in cache while
 * every token passes over them. */
__attribute__((noinline)) static void matmul_q4_1_tiles(float *out, int out_stride, const uint8_t *w_q4,
                                                        const KernelHalf *w_d, const KernelHalf *w_m,
                                                        const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                                                        int cols)
{
    const int nb = cols / KERNEL_QK;
    int tile = 16384 / (cols / 2 + 2 * nb * (int)sizeof(KernelHalf)) / 8 * 8;
    tile = tile < 8 ? 8 : tile;
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q4_1(out + (int64_t)t * out_stride + r, w_q4 + (int64_t)r * (cols / 2),
                               w_d + (int64_t)r * nb, w_m + (int64_t)r * nb, x_qs + (int64_t)t * cols,
                               x_d + (int64_t)t * nb, n, cols);
        }
    }
}

/* One token (decode) is the product itself, as for q8_0. */
void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else {
        matmul_q4_1_tiles(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}

/* Q4_K read in place, four rows at once. A superblock's 128 quant bytes are four runs of 32: run i
 * holds sub-block 2i in its low nibbles and sub-block 2i + 1 in its high ones (kernel_k_unpack), so
 * a byte, loaded once, serves both: andi, mul, add for the low nibble, srai, mul, add for the high
 * one, and each activation quant is loaded once for the four rows. Each row's eight scales and
 * minimums are decoded once per superblock (kernel_k_unpack's d * sc and -(dmin * m)) and a
 * sub-block's term is kernel_unpacked_term's, the activation sums made once per call; sub-block j
 * of every superblock goes to partial j (eight sub-blocks a superblock: the reduction tree's
 * partial b % 8), so the bits are the scalar kernel's. */
#define Q4K_MAC4(l)                                   \
    do {                                              \
        const int32_t xl = x[l], yl = y[l];           \
        const int32_t v0 = q0[l], v1 = q1[l];         \
        const int32_t v2 = q2[l], v3 = q3[l];         \
        lo0 += (v0 & 0x0F) * xl;                      \
        hi0 += (v0 >> 4) * yl;                        \
        lo1 += (v1 & 0x0F) * xl;                      \
        hi1 += (v1 >> 4) * yl;                        \
        lo2 += (v2 & 0x0F) * xl;                      \
        hi2 += (v2 >> 4) * yl;                        \
        lo3 += (v3 & 0x0F) * xl;                      \
        hi3 += (v3 >> 4) * yl;                        \
    } while (0)

/* A Q4_K (or Q5_K) superblock's eight sub-block scales d * sc_j and offsets -(dmin * m_j), as
 * kernel_k_unpack makes them; inlined into each row pass (a call a row and superblock otherwise). */
static inline __attribute__((always_inline)) void q4_k_scales(const uint8_t *blk, float scale[8], float offset[8])
{
    const float d = kernel_half_at(blk), dmin = kernel_half_at(blk + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kernel_k_scale_min(blk + 4, j, &sc, &m);
        scale[j] = d * (float)sc;
        offset[j] = -(dmin * (float)m);
    }
}

/* Run i of superblock s (sub-blocks 2i and 2i + 1) in four rows of a Q4_K or Q5_K pass: each
 * sub-block's integer sum made into kernel_unpacked_term's affine term, d * sc times the sum plus
 * the activation sum times -(dmin * m), and added to partial j of its row. */
__attribute__((always_inline)) static inline void k_run_terms4(float part[4][KERNEL_PARTIALS], const int32_t isum[2][4],
                                                               const float scale[4][8], const float offset[4][8],
                                                               const float *x_d, const float *x_sums, int s, int i)
{
    for (int h = 0; h < 2; h++) {
        const int j = 2 * i + h, b = s * 8 + j;
        const float xd = x_d[b], xsum = x_sums[b];
        for (int r = 0; r < 4; r++) {
            const float term = (float)isum[h][r] * (scale[r][j] * xd);
            part[r][j] = part[r][j] + (term + xsum * (offset[r][j] * xd));
        }
    }
}

/* A Q4_K or Q5_K matvec: its four-row pass over every group of four rows, the activation sums made
 * once; the last one to three rows, or rows too long for x_sums, take the scalar kernel. */
typedef void KRowsPass4(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs, const float *x_d,
                        const float *x_sums, int superblocks);
typedef void KMatvec(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);

static void k_matvec_rows4(KRowsPass4 *pass, KMatvec *scalar, int block_bytes, float *out, const uint8_t *w,
                           const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK, superblocks = cols / KERNEL_Q4_K_VALUES; /* Q5_K: 256 too */
    const int row_bytes = superblocks * block_bytes;
    int r = 0;
    if (nb <= XS_BLOCKS) {
        int32_t sums[XS_BLOCKS];
        float x_sums[XS_BLOCKS]; /* exact: |sum| < 2^12 */
        activation_sums(sums, x_qs, nb);
        for (int b = 0; b < nb; b++) {
            x_sums[b] = (float)sums[b];
        }
        for (; r + 4 <= rows; r += 4) {
            pass(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, x_sums, superblocks);
        }
    }
    if (r < rows) {
        scalar(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

__attribute__((noinline)) static void rows4_q4_k(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const float *x_sums, int superblocks)
{
    float part[4][KERNEL_PARTIALS];
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int s = 0; s < superblocks; s++) {
        const uint8_t *blk = w + (int64_t)s * KERNEL_Q4_K_BYTES;
        float scale[4][8], offset[4][8];
        for (int r = 0; r < 4; r++) {
            q4_k_scales(blk + (int64_t)r * row_bytes, scale[r], offset[r]);
        }
        for (int i = 0; i < 4; i++) {
            const uint8_t *q0 = blk + 16 + 32 * i, *q1 = q0 + row_bytes, *q2 = q1 + row_bytes, *q3 = q2 + row_bytes;
            const int8_t *x = x_qs + s * KERNEL_Q4_K_VALUES + 2 * i * KERNEL_QK, *y = x + KERNEL_QK;
            int32_t lo0 = 0, lo1 = 0, lo2 = 0, lo3 = 0, hi0 = 0, hi1 = 0, hi2 = 0, hi3 = 0;
            for (int l = 0; l < KERNEL_QK; l += 4) {
                Q4K_MAC4(0);
                Q4K_MAC4(1);
                Q4K_MAC4(2);
                Q4K_MAC4(3);
                q0 += 4, q1 += 4, q2 += 4, q3 += 4, x += 4, y += 4;
            }
            const int32_t isum[2][4] = {{lo0, lo1, lo2, lo3}, {hi0, hi1, hi2, hi3}};
            k_run_terms4(part, isum, scale, offset, x_d, x_sums, s, i);
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = kernel_sum_partials(part[r]);
    }
}

void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    k_matvec_rows4(rows4_q4_k, kernel_scalar_matvec_q4_k, KERNEL_Q4_K_BYTES, out, w, x_qs, x_d, rows, cols);
}

/* Q6_K read in place, two rows at once. Each half of a superblock holds four runs of 32 values: run
 * k's low four bits are the low (k = 0, 1) or high (k = 2, 3) nibbles of ql[32 * (k % 2) + l] and
 * its high two bits are bits 2k, 2k + 1 of qh[l] (kernel_q6_k_unpack), so the three bytes of
 * position l, loaded once, give all four runs' quants, which multiply the four activation quants
 * of position l (loaded once for both rows). The quants are summed as stored (0..63) and the 32
 * taken off once per 16 values as 32 times their activation sum, the same integer isum; a run's
 * term is kernel_unpacked_term's two-scale one, (float)isum_a * (s_a * x_d) + (float)isum_b *
 * (s_b * x_d) with s = d * scale, and run j of every superblock goes to partial j: the scalar
 * kernel's bits. */
#define Q6K_ROW(r, l)                                                      \
    do {                                                                   \
        const int32_t a = ql##r[l], c = ql##r[(l) + 32], h = qh##r[l];     \
        s##r##0 += ((a & 0x0F) | ((h & 0x03) << 4)) * x0;                  \
        s##r##1 += ((c & 0x0F) | ((h & 0x0C) << 2)) * x1;                  \
        s##r##2 += ((a >> 4) | (h & 0x30)) * x2;                           \
        s##r##3 += ((c >> 4) | ((h & 0xC0) >> 2)) * x3;                    \
    } while (0)

#define Q6K_MAC2(l)                                                        \
    do {                                                                   \
        const int32_t x0 = x[l], x1 = x[(l) + 32];                         \
        const int32_t x2 = x[(l) + 64], x3 = x[(l) + 96];                  \
        Q6K_ROW(0, l);                                                     \
        Q6K_ROW(1, l);                                                     \
    } while (0)

__attribute__((noinline)) static void rows2_q6_k(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const int32_t *x_sums16, int superblocks)
{
    float part[2][KERNEL_PARTIALS];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int s = 0; s < superblocks; s++) {
        const uint8_t *blk0 = w + (int64_t)s * KERNEL_Q6_K_BYTES, *blk1 = blk0 + row_bytes;
        const float d[2] = {kernel_half_at(blk0 + 208), kernel_half_at(blk1 + 208)};
        for (int half = 0; half < 2; half++) {
            int32_t isum[2][2][4]; /* [16-value half of the run][row][run] */
            for (int sh = 0; sh < 2; sh++) {
                const uint8_t *ql0 = blk0 + 64 * half + 16 * sh, *qh0 = blk0 + 128 + 32 * half + 16 * sh;
                const uint8_t *ql1 = blk1 + 64 * half + 16 * sh, *qh1 = blk1 + 128 + 32 * half + 16 * sh;
                const int8_t *x = x_qs + s * KERNEL_Q6_K_VALUES + 128 * half + 16 * sh;
                int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
                for (int l = 0; l < 16; l += 2) {
                    Q6K_MAC2(0);
                    Q6K_MAC2(1);
                    ql0 += 2, qh0 += 2, ql1 += 2, qh1 += 2, x += 2;
                }
                const int32_t *sums = x_sums16 + 2 * (s * 8 + 4 * half) + sh; /* run k's: sums[2 * k] */
                isum[sh][0][0] = s00 - 32 * sums[0];
                isum[sh][0][1] = s01 - 32 * sums[2];
                isum[sh][0][2] = s02 - 32 * sums[4];
                isum[sh][0][3] = s03 - 32 * sums[6];
                isum[sh][1][0] = s10 - 32 * sums[0];
                isum[sh][1][1] = s11 - 32 * sums[2];
                isum[sh][1][2] = s12 - 32 * sums[4];
                isum[sh][1][3] = s13 - 32 * sums[6];
            }
            for (int k = 0; k < 4; k++) {
                const int j = 4 * half + k, b = s * 8 + j;
                const float xd = x_d[b];
                for (int r = 0; r < 2; r++) {
                    const int8_t *scales = (const int8_t *)(r == 0 ? blk0 : blk1) + 192;
                    const float sa = d[r] * (float)scales[2 * j], sb = d[r] * (float)scales[2 * j + 1];
                    const float term = (float)isum[0][r][k] * (sa * xd) + (float)isum[1][r][k] * (sb * xd);
                    part[r][j] = part[r][j] + term;
                }
            }
        }
    }
    out[0] = kernel_sum_partials(part[0]);
    out[1] = kernel_sum_partials(part[1]);
}

void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int superblocks = cols / KERNEL_Q6_K_VALUES;
    const int row_bytes = superblocks * KERNEL_Q6_K_BYTES;
    int r = 0;
    if (cols / 16 <= 2 * XS_BLOCKS) {
        int32_t sums16[2 * XS_BLOCKS]; /* each 16 activation quants' sum */
        activation_sums16(sums16, x_qs, cols / 16);
        for (; r + 2 <= rows; r += 2) {
            rows2_q6_k(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, sums16, superblocks);
        }
    }
    if (r < rows) {
        kernel_scalar_matvec_q6_k(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

/* Q5_K read in place, four rows at once: rows4_q4_k's runs with each value's fifth bit from qh[l]
 * (bit j for sub-block j, kernel_k_unpack). Run i's two sub-blocks 2i and 2i + 1 take bits 2i and
 * 2i + 1 of the same qh byte, which one shift and one andi put beside the quant byte as bits 8 and 9
 * (constant shifts: the run loop is unrolled); that 10-bit index looks up both 5-bit quants in two
 * 1 KiB tables (q5k_quants: low value at [index], high at [1024 + index], one add of the table's
 * address for both), so a byte's two multiply-adds cost two lbu, slli, andi, or, add, two lbu, two
 * mul and two add, and each activation quant is loaded once for the four rows. The quants are the
 * unpacked ones, so each sub-block's isum, its term (kernel_unpacked_term's affine one) and partial
 * j are the scalar kernel's: its bits. */
#define Q5K_SEQ16(o) (o), (o) + 1, (o) + 2, (o) + 3, (o) + 4, (o) + 5, (o) + 6, (o) + 7, (o) + 8, (o) + 9, \
    (o) + 10, (o) + 11, (o) + 12, (o) + 13, (o) + 14, (o) + 15
#define Q5K_EACH16(o) NIBBLE_X16(o), NIBBLE_X16((o) + 1), NIBBLE_X16((o) + 2), NIBBLE_X16((o) + 3),         \
    NIBBLE_X16((o) + 4), NIBBLE_X16((o) + 5), NIBBLE_X16((o) + 6), NIBBLE_X16((o) + 7), NIBBLE_X16((o) + 8), \
    NIBBLE_X16((o) + 9), NIBBLE_X16((o) + 10), NIBBLE_X16((o) + 11), NIBBLE_X16((o) + 12),                  \
    NIBBLE_X16((o) + 13), NIBBLE_X16((o) + 14), NIBBLE_X16((o) + 15)
#define NIBBLE_X16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v

/* [b << 8 | byte]: the low nibble plus 16 times bit 0 of b; then [1024 + (b << 8 | byte)]: the
 * high nibble plus 16 times bit 1 of b. */
static const uint8_t q5k_quants[2048] = {
    NIBBLE_X16(Q5K_SEQ16(0)), NIBBLE_X16(Q5K_SEQ16(16)), NIBBLE_X16(Q5K_SEQ16(0)), NIBBLE_X16(Q5K_SEQ16(16)),
    Q5K_EACH16(0),            Q5K_EACH16(0),             Q5K_EACH16(16),           Q5K_EACH16(16),
};

#define Q5K_ROW(r, l)                                                                \
    do {                                                                             \
        const int32_t h = q##r[(l) - 32 * (i + 1)];                                  \
        const uint8_t *t = q5k_quants + (q##r[l] | ((h << (8 - 2 * i)) & 0x300));    \
        lo##r += t[0] * xl;                                                          \
        hi##r += t[1024] * yl;                                                       \
    } while (0)

#define Q5K_MAC4(l)                                                                  \
    do {                                                                             \
        const int32_t xl = x[l], yl = y[l];                                          \
        Q5K_ROW(0, l);                                                               \
        Q5K_ROW(1, l);                                                               \
        Q5K_ROW(2, l);                                                               \
        Q5K_ROW(3, l);                                                               \
    } while (0)

__attribute__((noinline)) static void rows4_q5_k(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const float *x_sums, int superblocks)
{
    float part[4][KERNEL_PARTIALS];
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int s = 0; s < superblocks; s++) {
        const uint8_t *blk = w + (int64_t)s * KERNEL_Q5_K_BYTES;
        float scale[4][8], offset[4][8];
        for (int r = 0; r < 4; r++) {
            q4_k_scales(blk + (int64_t)r * row_bytes, scale[r], offset[r]); /* Q5_K's d, dmin, scales: Q4_K's */
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *q0 = blk + 48 + 32 * i, *q1 = q0 + row_bytes, *q2 = q1 + row_bytes, *q3 = q2 + row_bytes;
            const int8_t *x = x_qs + s * KERNEL_Q5_K_VALUES + 2 * i * KERNEL_QK, *y = x + KERNEL_QK;
            int32_t lo0 = 0, lo1 = 0, lo2 = 0, lo3 = 0, hi0 = 0, hi1 = 0, hi2 = 0, hi3 = 0;
            for (int l = 0; l < KERNEL_QK; l += 4) {
                Q5K_MAC4(0);
                Q5K_MAC4(1);
                Q5K_MAC4(2);
                Q5K_MAC4(3);
                q0 += 4, q1 += 4, q2 += 4, q3 += 4, x += 4, y += 4;
            }
            const int32_t isum[2][4] = {{lo0, lo1, lo2, lo3}, {hi0, hi1, hi2, hi3}};
            k_run_terms4(part, isum, scale, offset, x_d, x_sums, s, i);
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = kernel_sum_partials(part[r]);
    }
}

void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    k_matvec_rows4(rows4_q5_k, kernel_scalar_matvec_q5_k, KERNEL_Q5_K_BYTES, out, w, x_qs, x_d, rows, cols);
}

/* Q3_K read in place, two rows at once. A half (sub-blocks 4h..4h + 3) of a superblock is one run
 * of 32 qs bytes: bits 2k, 2k + 1 of byte l are value l of sub-block 4h + k, and bit 4h + k of
 * hmask[l] says whether 4 is not taken off (kernel_q3_k_unpack). So the two bytes of position l,
 * loaded once, give four quants, each multiplying its own activation quant (loaded once for both
 * rows). A quant is summed as crumb + 4 * bit (0..7), two at a time looked up in q3k_quants from
 * a nibble of the qs byte and the two hmask bits beside it (andi or srli, the bits' shift and
 * andi, or, the table's add, two lbu); the 4 is taken off as 4 times the activation sum, once per
 * 16 values: the same integer isum as the scalar kernel's. Each 16 values' term is
 * kernel_unpacked_term's two-scale one and sub-block j goes to partial j: the scalar kernel's bits. */
#define Q3K_LOW4(o) (o), (o) + 1, (o) + 2, (o) + 3, (o), (o) + 1, (o) + 2, (o) + 3, (o), (o) + 1, (o) + 2, \
    (o) + 3, (o), (o) + 1, (o) + 2, (o) + 3
#define Q3K_HIGH4(o) (o), (o), (o), (o), (o) + 1, (o) + 1, (o) + 1, (o) + 1, (o) + 2, (o) + 2, (o) + 2, \
    (o) + 2, (o) + 3, (o) + 3, (o) + 3, (o) + 3

/* [b << 4 | nibble]: its low crumb plus 4 times bit 0 of b; [64 + (b << 4 | nibble)]: its high
 * crumb plus 4 times bit 1 of b. */
static const uint8_t q3k_quants[128] = {Q3K_LOW4(0),  Q3K_LOW4(4),  Q3K_LOW4(0),  Q3K_LOW4(4),
                                        Q3K_HIGH4(0), Q3K_HIGH4(0), Q3K_HIGH4(4), Q3K_HIGH4(4)};

#define Q3K_ROW(r, l)                                                                \
    do {                                                                             \
        const int32_t v = q##r[l], h = q##r[(l) - 32 - 32 * half]; /* hmask[l] */      \
        const uint8_t *a = q3k_quants + ((v & 0x0F) | (((h >> (4 * half)) << 4) & 0x30)); \
        const uint8_t *c = q3k_quants + ((v >> 4) | (((h >> (4 * half + 2)) << 4) & 0x30)); \
        s##r##0 += a[0] * x0;                                                        \
        s##r##1 += a[64] * x1;                                                       \
        s##r##2 += c[0] * x2;                                                        \
        s##r##3 += c[64] * x3;                                                       \
    } while (0)

#define Q3K_MAC2(l)                                                                  \
    do {                                                                             \
        const int32_t x0 = x[l], x1 = x[(l) + 32];                                   \
        const int32_t x2 = x[(l) + 64], x3 = x[(l) + 96];                            \
        Q3K_ROW(0, l);                                                               \
        Q3K_ROW(1, l);                                                               \
    } while (0)

__attribute__((noinline)) static void rows2_q3_k(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const int32_t *x_sums16, int superblocks)
{
    float part[2][KERNEL_PARTIALS];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int s = 0; s < superblocks; s++) {
        const uint8_t *blk0 = w + (int64_t)s * KERNEL_Q3_K_BYTES, *blk1 = blk0 + row_bytes;
        const float d[2] = {kernel_half_at(blk0 + 108), kernel_half_at(blk1 + 108)};
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            int32_t isum[2][2][4]; /* [16-value half of the sub-block][row][k] */
            for (int sh = 0; sh < 2; sh++) {
                const uint8_t *q0 = blk0 + 32 + 32 * half + 16 * sh, *q1 = blk1 + 32 + 32 * half + 16 * sh;
                const int8_t *x = x_qs + s * KERNEL_Q3_K_VALUES + 128 * half + 16 * sh;
                int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
                for (int l = 0; l < 16; l += 4) {
                    Q3K_MAC2(0);
                    Q3K_MAC2(1);
                    Q3K_MAC2(2);
                    Q3K_MAC2(3);
                    q0 += 4, q1 += 4, x += 4;
                }
                const int32_t *sums = x_sums16 + 2 * (s * 8 + 4 * half) + sh; /* sub-block k's: sums[2 * k] */
                isum[sh][0][0] = s00 - 4 * sums[0];
                isum[sh][0][1] = s01 - 4 * sums[2];
                isum[sh][0][2] = s02 - 4 * sums[4];
                isum[sh][0][3] = s03 - 4 * sums[6];
                isum[sh][1][0] = s10 - 4 * sums[0];
                isum[sh][1][1] = s11 - 4 * sums[2];
                isum[sh][1][2] = s12 - 4 * sums[4];
                isum[sh][1][3] = s13 - 4 * sums[6];
            }
            for (int k = 0; k < 4; k++) {
                const int j = 4 * half + k, b = s * 8 + j;
                const float xd = x_d[b];
                for (int r = 0; r < 2; r++) {
                    const uint8_t *scales = (r == 0 ? blk0 : blk1) + 96;
                    const float sa = d[r] * (float)kernel_q3_k_scale(scales, 2 * j);
                    const float sb = d[r] * (float)kernel_q3_k_scale(scales, 2 * j + 1);
                    const float term = (float)isum[0][r][k] * (sa * xd) + (float)isum[1][r][k] * (sb * xd);
                    part[r][j] = part[r][j] + term;
                }
            }
        }
    }
    out[0] = kernel_sum_partials(part[0]);
    out[1] = kernel_sum_partials(part[1]);
}

void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int superblocks = cols / KERNEL_Q3_K_VALUES;
    const int row_bytes = superblocks * KERNEL_Q3_K_BYTES;
    int r = 0;
    if (cols / 16 <= 2 * XS_BLOCKS) {
        int32_t sums16[2 * XS_BLOCKS];
        activation_sums16(sums16, x_qs, cols / 16);
        for (; r + 2 <= rows; r += 2) {
            rows2_q3_k(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, sums16, superblocks);
        }
    }
    if (r < rows) {
        kernel_scalar_matvec_q3_k(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

/* Q2_K read in place, two rows at once: as Q3_K's runs without the hmask, so a quant is the and
 * of its two bits alone, summed where it lies (4^k times its value) and shifted back once per 16
 * values (the top one shifted down instead). Each 16 values' scale d * (sc & 15) and offset
 * -(dmin * (sc >> 4)) are kernel_q2_k_unpack's and the term kernel_unpacked_term's two-scale affine
 * one, the activation sums (exact as floats: |sum| < 2^11) made once per call: the scalar bits. */
#define Q2K_ROW(r, l)                                                                \
    do {                                                                             \
        const int32_t v = q##r[l];                                                   \
        s##r##0 += (v & 0x03) * x0;                                                  \
        s##r##1 += (v & 0x0C) * x1;                                                  \
        s##r##2 += (v & 0x30) * x2;                                                  \
        s##r##3 += (v >> 6) * x3;                                                    \
    } while (0)

#define Q2K_MAC2(l)                                                                  \
    do {                                                                             \
        const int32_t x0 = x[l], x1 = x[(l) + 32];                                   \
        const int32_t x2 = x[(l) + 64], x3 = x[(l) + 96];                            \
        Q2K_ROW(0, l);                                                               \
        Q2K_ROW(1, l);                                                               \
    } while (0)

__attribute__((noinline)) static void rows2_q2_k(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const float *x_sums16, int superblocks)
{
    float part[2][KERNEL_PARTIALS];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int s = 0; s < superblocks; s++) {
        const uint8_t *blk0 = w + (int64_t)s * KERNEL_Q2_K_BYTES, *blk1 = blk0 + row_bytes;
        const float d[2] = {kernel_half_at(blk0 + 80), kernel_half_at(blk1 + 80)};
        const float dmin[2] = {kernel_half_at(blk0 + 82), kernel_half_at(blk1 + 82)};
        for (int half = 0; half < 2; half++) {
            int32_t isum[2][2][4]; /* [16-value half of the sub-block][row][k] */
            for (int sh = 0; sh < 2; sh++) {
                const uint8_t *q0 = blk0 + 16 + 32 * half + 16 * sh, *q1 = blk1 + 16 + 32 * half + 16 * sh;
                const int8_t *x = x_qs + s * KERNEL_Q2_K_VALUES + 128 * half + 16 * sh;
                int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
                for (int l = 0; l < 16; l += 4) {
                    Q2K_MAC2(0);
                    Q2K_MAC2(1);
                    Q2K_MAC2(2);
                    Q2K_MAC2(3);
                    q0 += 4, q1 += 4, x += 4;
                }
                isum[sh][0][0] = s00;
                isum[sh][0][1] = s01 >> 2;
                isum[sh][0][2] = s02 >> 4;
                isum[sh][0][3] = s03;
                isum[sh][1][0] = s10;
                isum[sh][1][1] = s11 >> 2;
                isum[sh][1][2] = s12 >> 4;
                isum[sh][1][3] = s13;
            }
            for (int k = 0; k < 4; k++) {
                const int j = 4 * half + k, b = s * 8 + j;
                const float xd = x_d[b], xsa = x_sums16[2 * b], xsb = x_sums16[2 * b + 1];
                for (int r = 0; r < 2; r++) {
                    const uint8_t *sc = (r == 0 ? blk0 : blk1) + 2 * j;
                    const float sa = d[r] * (float)(sc[0] & 0x0F), sb = d[r] * (float)(sc[1] & 0x0F);
                    const float oa = -(dmin[r] * (float)(sc[0] >> 4)), ob = -(dmin[r] * (float)(sc[1] >> 4));
                    float term = (float)isum[0][r][k] * (sa * xd) + (float)isum[1][r][k] * (sb * xd);
                    term = term + xsa * (oa * xd);
                    term = term + xsb * (ob * xd);
                    part[r][j] = part[r][j] + term;
                }
            }
        }
    }
    out[0] = kernel_sum_partials(part[0]);
    out[1] = kernel_sum_partials(part[1]);
}

void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int superblocks = cols / KERNEL_Q2_K_VALUES;
    const int row_bytes = superblocks * KERNEL_Q2_K_BYTES;
    int r = 0;
    if (cols / 16 <= 2 * XS_BLOCKS) {
        float x_sums16[2 * XS_BLOCKS]; /* 2 KiB of the MCU's 8 KiB stack, as Q6_K's */
        for (int g = 0; g < cols / 16; g++) {
            int32_t sum = 0;
            for (int j = 0; j < 16; j++) {
                sum += x_qs[g * 16 + j];
            }
            x_sums16[g] = (float)sum;
        }
        for (; r + 2 <= rows; r += 2) {
            rows2_q2_k(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, x_sums16, superblocks);
        }
    }
    if (r < rows) {
        kernel_scalar_matvec_q2_k(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

/* Q5_0 and Q5_1 read in place, four rows at once. Byte j of a block's qs holds the nibbles of
 * values j and j + 16, whose fifth bits are bits j and j + 16 of qh; interleaved once per block and
 * row (bit j to 2j, bit j + 16 to 2j + 1: q5_pair_bits, through a 512-byte table), the two bits of byte j sit side by side,
 * and one shift and one andi put them beside the byte as bits 8 and 9: the index of both 5-bit
 * quants in Q5_K's tables (q5k_quants). So a byte's two multiply-adds cost lbu, slli, andi, or, add,
 * two lbu, two mul and two add, the interleaved bits stepping on by one srli every four bytes, and
 * each activation quant is loaded once for the four rows. The sum is over the stored quants
 * (0..31): Q5_1's own, so isum; Q5_0's take 16 off, 16 times the activation sum. The term is
 * kernel_unpacked_term's, (float)isum * (d * x_d) [+ (float)xsum * (m * x_d) for Q5_1], the
 * activation sums made once per call, and block b goes to partial b % 8: the scalar kernel's bits. */
/* spread8[v]: bit i of v at bit 2i (a byte's bits interleaved with zeros). */
#define SPREAD8_ROW(o) (o), (o) + 1, (o) + 4, (o) + 5, (o) + 16, (o) + 17, (o) + 20, (o) + 21, (o) + 64, (o) + 65, \
    (o) + 68, (o) + 69, (o) + 80, (o) + 81, (o) + 84, (o) + 85
static const uint16_t spread8[256] = {
    SPREAD8_ROW(0 << 8),  SPREAD8_ROW(1 << 8),  SPREAD8_ROW(4 << 8),  SPREAD8_ROW(5 << 8),
    SPREAD8_ROW(16 << 8), SPREAD8_ROW(17 << 8), SPREAD8_ROW(20 << 8), SPREAD8_ROW(21 << 8),
    SPREAD8_ROW(64 << 8), SPREAD8_ROW(65 << 8), SPREAD8_ROW(68 << 8), SPREAD8_ROW(69 << 8),
    SPREAD8_ROW(80 << 8), SPREAD8_ROW(81 << 8), SPREAD8_ROW(84 << 8), SPREAD8_ROW(85 << 8),
};

/* A Q5_0 or Q5_1 block's qh (bit l: value l's fifth bit) with bits j (0..15) at 2j and j + 16 at
 * 2j + 1. */
static inline uint32_t q5_pair_bits(const uint8_t *qh)
{
    const uint32_t low = spread8[qh[0]] | (uint32_t)spread8[qh[1]] << 16;
    const uint32_t high = spread8[qh[2]] | (uint32_t)spread8[qh[3]] << 16;
    return low | high << 1;
}

#define Q5_ROW(r, j)                                                                 \
    do {                                                                             \
        const uint8_t *t = q5k_quants + (p##r[j] | ((z##r << (8 - 2 * (j))) & 0x300)); \
        s##r += t[0] * xj + t[1024] * yj;                                            \
    } while (0)

#define Q5_MAC4(j)                                                                   \
    do {                                                                             \
        const int32_t xj = x[j], yj = x[(j) + KERNEL_QK / 2];                        \
        Q5_ROW(0, j);                                                                \
        Q5_ROW(1, j);                                                                \
        Q5_ROW(2, j);                                                                \
        Q5_ROW(3, j);                                                                \
    } while (0)

/* block_bytes: Q5_0's 22 (d, qh, qs) or Q5_1's 24 (d, m, qh, qs). */
static inline __attribute__((always_inline)) void rows4_q5(float *out, const uint8_t *w, int row_bytes,
                                                           const int8_t *x_qs, const float *x_d,
                                                           const int32_t *x_sums, int nb, int block_bytes)
{
    const int affine = block_bytes == KERNEL_Q5_1_BYTES, qh = affine ? 4 : 2;
    float part[4][KERNEL_PARTIALS];
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (int64_t)b * block_bytes;
        const uint8_t *p0 = blk + qh + 4, *p1 = p0 + row_bytes, *p2 = p1 + row_bytes, *p3 = p2 + row_bytes;
        uint32_t z0 = q5_pair_bits(p0 - 4), z1 = q5_pair_bits(p1 - 4);
        uint32_t z2 = q5_pair_bits(p2 - 4), z3 = q5_pair_bits(p3 - 4);
        const int8_t *x = x_qs + b * KERNEL_QK;
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int j = 0; j < KERNEL_QK / 2; j += 4) {
            Q5_MAC4(0);
            Q5_MAC4(1);
            Q5_MAC4(2);
            Q5_MAC4(3);
            p0 += 4, p1 += 4, p2 += 4, p3 += 4, x += 4;
            z0 >>= 8, z1 >>= 8, z2 >>= 8, z3 >>= 8;
        }
        const float xd = x_d[b];
        const int32_t isum[4] = {s0, s1, s2, s3};
        for (int r = 0; r < 4; r++) {
            const uint8_t *rblk = blk + (int64_t)r * row_bytes;
            float term;
            if (affine) {
                term = (float)isum[r] * (kernel_half_at(rblk) * xd) + (float)x_sums[b] * (kernel_half_at(rblk + 2) * xd);
            } else {
                term = (float)(isum[r] - 16 * x_sums[b]) * (kernel_half_at(rblk) * xd);
            }
            part[r][b % KERNEL_PARTIALS] = part[r][b % KERNEL_PARTIALS] + term;
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = kernel_sum_partials(part[r]);
    }
}

__attribute__((noinline)) static void rows4_q5_0(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const int32_t *x_sums, int nb)
{
    rows4_q5(out, w, row_bytes, x_qs, x_d, x_sums, nb, KERNEL_Q5_0_BYTES);
}

__attribute__((noinline)) static void rows4_q5_1(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                 const float *x_d, const int32_t *x_sums, int nb)
{
    rows4_q5(out, w, row_bytes, x_qs, x_d, x_sums, nb, KERNEL_Q5_1_BYTES);
}

void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int row_bytes = nb * KERNEL_Q5_0_BYTES;
    int r = 0;
    if (nb <= XS_BLOCKS) {
        int32_t x_sums[XS_BLOCKS];
        activation_sums(x_sums, x_qs, nb);
        for (; r + 4 <= rows; r += 4) {
            rows4_q5_0(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, x_sums, nb);
        }
    }
    if (r < rows) {
        kernel_scalar_matvec_q5_0(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int row_bytes = nb * KERNEL_Q5_1_BYTES;
    int r = 0;
    if (nb <= XS_BLOCKS) {
        int32_t x_sums[XS_BLOCKS];
        activation_sums(x_sums, x_qs, nb);
        for (; r + 4 <= rows; r += 4) {
            rows4_q5_1(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, x_sums, nb);
        }
    }
    if (r < rows) {
        kernel_scalar_matvec_q5_1(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

/* The table types (IQ4_NL, IQ4_XS, MXFP4) read in place, four rows at once: a 32-value block's
 * 16 bytes hold values l (low nibble) and l + 16 (high), each nibble an index into the type's
 * sixteen int8 values (kernel_iq4_values). The lookups go through 512-byte tables indexed by the
 * whole byte, the low nibble's value at [byte] and the high one's at [256 + byte], so a byte costs
 * lbu, one add of the table's address and two lb, then mul and add per value (no andi, no shift),
 * the two activation quants loaded once for the four rows. One scale covers the block (IQ4_XS's
 * sub-block), so each row keeps one sum; the term (float)isum * (scale * x_d) with the type's
 * scale as its unpack computes it, and partial b % 8: the scalar kernel's bits. */
#define NIBBLE_TABLES(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)                                  \
    {                                                                                                 \
        NIBBLE_X16(NIBBLE_LIST(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)),                       \
        NIBBLE_X16(a), NIBBLE_X16(b), NIBBLE_X16(c), NIBBLE_X16(d), NIBBLE_X16(e), NIBBLE_X16(f),      \
        NIBBLE_X16(g), NIBBLE_X16(h), NIBBLE_X16(i), NIBBLE_X16(j), NIBBLE_X16(k), NIBBLE_X16(l),      \
        NIBBLE_X16(m), NIBBLE_X16(n), NIBBLE_X16(o), NIBBLE_X16(p)                                    \
    }
#define NIBBLE_LIST(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p) a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p

/* kernel_iq4nl_values and kernel_mxfp4_values (kernels.h), spread over the bytes. */
static const int8_t iq4nl_bytes[512] = NIBBLE_TABLES(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53,
                                                     69, 89, 113);
static const int8_t mxfp4_bytes[512] = NIBBLE_TABLES(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

#define TABLE4_ROW(r, l)                                                             \
    do {                                                                             \
        const int8_t *t = table + p##r[l];                                           \
        s##r += t[0] * xl + t[256] * yl;                                             \
    } while (0)

#define TABLE4_MAC4(l)                                                               \
    do {                                                                             \
        const int32_t xl = x[l], yl = x[(l) + 16];                                   \
        TABLE4_ROW(0, l);                                                            \
        TABLE4_ROW(1, l);                                                            \
        TABLE4_ROW(2, l);                                                            \
        TABLE4_ROW(3, l);                                                            \
    } while (0)

/* The scales' parts as kernel_iq4_nl_unpack, kernel_iq4_xs_unpack and kernel_mxfp4_unpack make
 * them: the binary16 d (IQ4_XS's sub-block j then takes d * (float)(ls_j - 32)) or 2^(e - 128). */
static inline float half_base(const uint8_t *blk)
{
    return kernel_half_at(blk);
}

static inline int iq4_xs_ls(const uint8_t *blk, int j)
{
    const int scales_h = blk[2] | blk[3] << 8;
    return (((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
}

static inline float e8m0_base(const uint8_t *blk)
{
    return kernel_e8m0_half(blk[0]);
}

/* per: 32-value blocks a stored block (1, or IQ4_XS's 8), block j of which has its 16 bytes at
 * qs + 16 * j; base_of(stored block) is its scale (IQ4_XS's d, widened once for its 8 blocks and
 * times (float)(ls_j - 32) for block j). The compiler sees per, so each type's pass has only its
 * own branch. */
static inline __attribute__((always_inline)) void rows4_table4(float *out, const uint8_t *w, int row_bytes,
                                                               const int8_t *x_qs, const float *x_d, int nb,
                                                               const int8_t *table, int per, int block_bytes, int qs,
                                                               float (*base_of)(const uint8_t *))
{
    float part[4][KERNEL_PARTIALS];
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[r][k] = -0.0f;
        }
    }
    for (int sb = 0; sb < nb / per; sb++) {
        const uint8_t *blk = w + (int64_t)sb * block_bytes;
        float base[4];
        for (int r = 0; r < 4 && per > 1; r++) {
            base[r] = base_of(blk + (int64_t)r * row_bytes);
        }
        for (int j = 0; j < per; j++) {
            const int b = sb * per + j;
            const uint8_t *p0 = blk + qs + 16 * j, *p1 = p0 + row_bytes, *p2 = p1 + row_bytes, *p3 = p2 + row_bytes;
            const int8_t *x = x_qs + b * KERNEL_QK;
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int l = 0; l < 16; l += 4) {
                TABLE4_MAC4(0);
                TABLE4_MAC4(1);
                TABLE4_MAC4(2);
                TABLE4_MAC4(3);
                p0 += 4, p1 += 4, p2 += 4, p3 += 4, x += 4;
            }
            const float xd = x_d[b];
            const int32_t isum[4] = {s0, s1, s2, s3};
            for (int r = 0; r < 4; r++) {
                const uint8_t *rblk = blk + (int64_t)r * row_bytes;
                const float scale = per == 1 ? base_of(rblk) : base[r] * (float)iq4_xs_ls(rblk, j);
                const float term = (float)isum[r] * (scale * xd);
                part[r][b % KERNEL_PARTIALS] = part[r][b % KERNEL_PARTIALS] + term;
            }
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = kernel_sum_partials(part[r]);
    }
}

__attribute__((noinline)) static void rows4_iq4_nl(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                   const float *x_d, int nb)
{
    rows4_table4(out, w, row_bytes, x_qs, x_d, nb, iq4nl_bytes, 1, KERNEL_IQ4_NL_BYTES, 2, half_base);
}

__attribute__((noinline)) static void rows4_iq4_xs(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                   const float *x_d, int nb)
{
    rows4_table4(out, w, row_bytes, x_qs, x_d, nb, iq4nl_bytes, 8, KERNEL_IQ4_XS_BYTES, 8, half_base);
}

__attribute__((noinline)) static void rows4_mxfp4(float *out, const uint8_t *w, int row_bytes, const int8_t *x_qs,
                                                  const float *x_d, int nb)
{
    rows4_table4(out, w, row_bytes, x_qs, x_d, nb, mxfp4_bytes, 1, KERNEL_MXFP4_BYTES, 1, e8m0_base);
}

void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK, row_bytes = nb * KERNEL_IQ4_NL_BYTES;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        rows4_iq4_nl(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, nb);
    }
    if (r < rows) {
        kernel_scalar_matvec_iq4_nl(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK, row_bytes = cols / KERNEL_IQ4_XS_VALUES * KERNEL_IQ4_XS_BYTES;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        rows4_iq4_xs(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, nb);
    }
    if (r < rows) {
        kernel_scalar_matvec_iq4_xs(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}

void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK, row_bytes = nb * KERNEL_MXFP4_BYTES;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        rows4_mxfp4(out + r, w + (int64_t)r * row_bytes, row_bytes, x_qs, x_d, nb);
    }
    if (r < rows) {
        kernel_scalar_matvec_mxfp4(out + r, w + (int64_t)r * row_bytes, x_qs, x_d, rows - r, cols);
    }
}
