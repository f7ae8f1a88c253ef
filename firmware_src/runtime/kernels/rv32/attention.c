/* The rv32 set's attention over a binary16 KV cache read in place (kernel_attention_*_f16); the
 * float32 cache's attention is fallback.h's (set.c), one sum at a time. */
#include "rv32.h"

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
            rv32_widened_scores_f16(at, att_stride, qa, q_stride, h, keys, stride, n, head_dim, scale, tile,
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
        rv32_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
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
        rv32_widened_mix_f16(out + (int64_t)a * out_stride, out_stride, p + (int64_t)a * p_stride, p_stride,
                             n_q - a, values, stride, n, head_dim, tile, tile_rows);
    }
}
