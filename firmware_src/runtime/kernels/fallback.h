/* Included once by each kernel set's file, right after its list of KERNEL_HAS_<ENTRY>: every kernel
 * entry point the set does not define itself is defined here, so no set restates what it
 * leaves unchanged (ggml's arch-fallback idea). Products and the other element-wise entries fall back
 * to the scalar reference; a batched product falls back to tiles of rows over the set's own matvec;
 * attention to a portable loop that is fast on the set's kind of core (KERNEL_ATTENTION_CHAINS). */
#ifndef COLIBRI_KERNELS_FALLBACK_H
#define COLIBRI_KERNELS_FALLBACK_H

#include "kernels.h"
#include "../ops.h" /* op_softmax: the scalar definition a set may vectorize */

#ifndef KERNEL_HAS_DELTA_RULE_STEP
void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim)
{
    kernel_scalar_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
}
#endif

#ifndef KERNEL_HAS_MATVEC_F32
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    kernel_scalar_matvec_f32(out, w, x, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q8_0
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                        int rows, int cols)
{
    kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q4_0
void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                        int rows, int cols)
{
    kernel_scalar_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q4_1
void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m, const int8_t *x_qs,
                        const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_SWIGLU
void kernel_swiglu(float *up, const float *gate, int n)
{
    kernel_scalar_swiglu(up, gate, n);
}
#endif

#ifndef KERNEL_HAS_GELU_TANH_MUL
void kernel_gelu_tanh_mul(float *up, const float *gate, int n)
{
    kernel_scalar_gelu_tanh_mul(up, gate, n);
}
#endif

#ifndef KERNEL_HAS_QUANTIZE_Q8_0
void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    kernel_scalar_quantize_q8_0(qs, d, x, n);
}
#endif

/* Batched products as tiles: the set's matvec over tiles of rows small enough (16 KiB of weights) to
 * stay in the L1 or L2 cache while every token passes over them; each (row, token) sum is the
 * matvec's. The fallback for a set without a batched kernel, and a set's own path where its batched
 * kernel does not apply. */
static inline int kernel_tile_rows(int row_bytes)
{
    int rows = 16384 / (row_bytes > 0 ? row_bytes : 1);
    return rows < 1 ? 1 : rows;
}

static inline void kernel_tiled_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok,
                                           int rows, int cols)
{
    const int tile = kernel_tile_rows(cols * (int)sizeof(float));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_f32(out + (int64_t)t * out_stride + r, w + (int64_t)r * cols, x + (int64_t)t * cols, n,
                              cols);
        }
    }
}

static inline void kernel_tiled_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                                            const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int tile = kernel_tile_rows(cols + nb * (int)sizeof(KernelHalf));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q8_0(out + (int64_t)t * out_stride + r, w_qs + (int64_t)r * cols, w_d + (int64_t)r * nb,
                               x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}

static inline void kernel_tiled_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                                            const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int tile = kernel_tile_rows(cols / 2 + nb * (int)sizeof(KernelHalf));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q4_0(out + (int64_t)t * out_stride + r, w_q4 + (int64_t)r * (cols / 2),
                               w_d + (int64_t)r * nb, x_qs + (int64_t)t * cols, x_d + (int64_t)t * nb, n, cols);
        }
    }
}

static inline void kernel_tiled_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                                            const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok,
                                            int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int tile = kernel_tile_rows(cols / 2 + 2 * nb * (int)sizeof(KernelHalf));
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            kernel_matvec_q4_1(out + (int64_t)t * out_stride + r, w_q4 + (int64_t)r * (cols / 2),
                               w_d + (int64_t)r * nb, w_m + (int64_t)r * nb, x_qs + (int64_t)t * cols,
                               x_d + (int64_t)t * nb, n, cols);
        }
    }
}

#ifndef KERNEL_HAS_MATMUL_F32
void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_f32(out, out_stride, w, x, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q8_0
void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                        const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q4_0
void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                        const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q4_1
void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
}
#endif

/* A kept GGUF type's batched product as tiles of rows over its matvec (row_bytes: one row's blocks). */
static inline void kernel_tiled_matmul_blocks(KernelBlocksMatvec matvec, int64_t row_bytes, float *out, int out_stride,
                                              const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                                              int rows, int cols)
{
    const int tile = kernel_tile_rows((int)row_bytes);
    for (int r = 0; r < rows; r += tile) {
        const int n = rows - r < tile ? rows - r : tile;
        for (int t = 0; t < n_tok; t++) {
            matvec(out + (int64_t)t * out_stride + r, w + (int64_t)r * row_bytes, x_qs + (int64_t)t * cols,
                   x_d + (int64_t)t * (cols / KERNEL_QK), n, cols);
        }
    }
}

#ifndef KERNEL_HAS_MATVEC_Q5_0
void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q5_0(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q5_0
void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q5_0, (int64_t)(cols / KERNEL_Q5_0_VALUES) * KERNEL_Q5_0_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q5_1
void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q5_1
void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q5_1, (int64_t)(cols / KERNEL_Q5_1_VALUES) * KERNEL_Q5_1_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q4_K
void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q4_K
void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q4_k, (int64_t)(cols / KERNEL_Q4_K_VALUES) * KERNEL_Q4_K_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q5_K
void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q5_K
void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q5_k, (int64_t)(cols / KERNEL_Q5_K_VALUES) * KERNEL_Q5_K_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q6_K
void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q6_k(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q6_K
void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q6_k, (int64_t)(cols / KERNEL_Q6_K_VALUES) * KERNEL_Q6_K_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q3_K
void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q3_k(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q3_K
void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q3_k, (int64_t)(cols / KERNEL_Q3_K_VALUES) * KERNEL_Q3_K_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_Q2_K
void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_Q2_K
void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_q2_k, (int64_t)(cols / KERNEL_Q2_K_VALUES) * KERNEL_Q2_K_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_IQ4_NL
void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_iq4_nl(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_IQ4_NL
void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_iq4_nl, (int64_t)(cols / KERNEL_IQ4_NL_VALUES) * KERNEL_IQ4_NL_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_IQ4_XS
void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_iq4_xs(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_IQ4_XS
void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_iq4_xs, (int64_t)(cols / KERNEL_IQ4_XS_VALUES) * KERNEL_IQ4_XS_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATVEC_MXFP4
void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_mxfp4(out, w, x_qs, x_d, rows, cols);
}
#endif

#ifndef KERNEL_HAS_MATMUL_MXFP4
void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                         int rows, int cols)
{
    kernel_tiled_matmul_blocks(kernel_matvec_mxfp4, (int64_t)(cols / KERNEL_MXFP4_VALUES) * KERNEL_MXFP4_BYTES, out,
                               out_stride, w, x_qs, x_d, n_tok, rows, cols);
}
#endif

#ifndef KERNEL_ATTENTION_CHAINS
#define KERNEL_ATTENTION_CHAINS 1 /* in-order cores: one sum at a time, fewest instructions */
#endif

#ifndef KERNEL_HAS_ATTENTION_SCORES
/* Scores with the query in local variables: for a head_dim known at compile time (the
 * specialisations below) the compiler keeps it in registers. Out-of-order cores take
 * KERNEL_ATTENTION_CHAINS = 4: four positions side by side, four independent sums (each still over
 * j in order) whose additions overlap instead of waiting on one chain. The tile's rows are read
 * once per query head of the group, from the L1 cache after the first. */
static inline __attribute__((always_inline)) void fallback_scores(float *att, const float *q, const float *keys,
                                                                  int n, int stride, const int head_dim, float scale)
{
    float qh[256];
#pragma GCC unroll 16
    for (int j = 0; j < head_dim; j++) {
        qh[j] = q[j];
    }
    int i = 0;
#if KERNEL_ATTENTION_CHAINS == 4
    for (; i + 4 <= n; i += 4) {
        const float *k0 = keys + (int64_t)i * stride;
        const float *k1 = k0 + stride;
        const float *k2 = k1 + stride;
        const float *k3 = k2 + stride;
        float s0 = -0.0f, s1 = -0.0f, s2 = -0.0f, s3 = -0.0f;
        for (int j = 0; j < head_dim; j++) {
            s0 = s0 + qh[j] * k0[j];
            s1 = s1 + qh[j] * k1[j];
            s2 = s2 + qh[j] * k2[j];
            s3 = s3 + qh[j] * k3[j];
        }
        att[i] = s0 * scale;
        att[i + 1] = s1 * scale;
        att[i + 2] = s2 * scale;
        att[i + 3] = s3 * scale;
    }
#endif
    for (; i < n; i++) {
        const float *k = keys + (int64_t)i * stride;
        float s = -0.0f;
#pragma GCC unroll 16
        for (int j = 0; j < head_dim; j++) {
            s = s + qh[j] * k[j];
        }
        att[i] = s * scale;
    }
}

static void fallback_scores_any(float *att, const float *q, const float *keys, int n, int stride, int head_dim,
                                float scale)
{
    switch (head_dim) { /* the usual head sizes, each compiled with its size known */
    case 16: fallback_scores(att, q, keys, n, stride, 16, scale); break;
    case 32: fallback_scores(att, q, keys, n, stride, 32, scale); break;
    case 48: fallback_scores(att, q, keys, n, stride, 48, scale); break;
    case 64: fallback_scores(att, q, keys, n, stride, 64, scale); break;
    case 128: fallback_scores(att, q, keys, n, stride, 128, scale); break;
    default:
        if (head_dim <= 256) {
            fallback_scores(att, q, keys, n, stride, head_dim, scale);
        } else {
            kernel_scalar_attention_scores(att, 0, q, 0, 1, keys, stride, n, head_dim, scale);
        }
        break;
    }
}

void kernel_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q, const float *keys,
                             int stride, int n, int head_dim, float scale)
{
    for (int a = 0; a < n_q; a++) {
        fallback_scores_any(att + (int64_t)a * att_stride, q + (int64_t)a * q_stride, keys, n, stride, head_dim, scale);
    }
}
#endif

/* A block's tokens one after the other through kernel_attention_scores: kernels.h's definition of
 * kernel_attention_scores_tokens, and a set's own way out. */
static inline void fallback_scores_token_by_token(const KernelQueryRange *tokens, int n_tok, int att_stride,
                                                  int q_stride, int n_q, const float *keys, int stride, int head_dim,
                                                  float scale)
{
    for (int t = 0; t < n_tok; t++) {
        const KernelQueryRange *r = &tokens[t];
        kernel_attention_scores(r->att, att_stride, r->q, q_stride, n_q, keys + (int64_t)r->first * stride, stride,
                                r->count, head_dim, scale);
    }
}

#ifndef KERNEL_HAS_ATTENTION_SCORES_TOKENS
void kernel_attention_scores_tokens(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale)
{
    (void)n;
    fallback_scores_token_by_token(tokens, n_tok, att_stride, q_stride, n_q, keys, stride, head_dim, scale);
}
#endif

#ifndef KERNEL_HAS_ATTENTION_MIX
/* The weighted sum with its head_dim sums in local variables (registers, for a small head),
 * continuing from what out holds. */
static inline __attribute__((always_inline)) void fallback_mix(float *out, const float *p, const float *values,
                                                               int n, int stride, const int head_dim)
{
    float acc[256];
#pragma GCC unroll 16
    for (int j = 0; j < head_dim; j++) {
        acc[j] = out[j];
    }
    for (int i = 0; i < n; i++) {
        const float *v = values + (int64_t)i * stride;
        const float w = p[i];
#pragma GCC unroll 16
        for (int j = 0; j < head_dim; j++) {
            acc[j] = acc[j] + w * v[j];
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < head_dim; j++) {
        out[j] = acc[j];
    }
}

static void fallback_mix_any(float *out, const float *p, const float *values, int n, int stride, int head_dim)
{
    switch (head_dim) {
    case 16: fallback_mix(out, p, values, n, stride, 16); break;
    case 32: fallback_mix(out, p, values, n, stride, 32); break;
    case 48: fallback_mix(out, p, values, n, stride, 48); break;
    case 64: fallback_mix(out, p, values, n, stride, 64); break;
    case 128: fallback_mix(out, p, values, n, stride, 128); break;
    default:
        if (head_dim <= 256) {
            fallback_mix(out, p, values, n, stride, head_dim);
        } else {
            kernel_scalar_attention_mix(out, 0, p, 0, 1, values, stride, n, head_dim);
        }
        break;
    }
}

void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim)
{
    for (int a = 0; a < n_q; a++) {
        fallback_mix_any(out + (int64_t)a * out_stride, p + (int64_t)a * p_stride, values, n, stride, head_dim);
    }
}
#endif

#ifndef KERNEL_HAS_SOFTMAX
void kernel_softmax(float *x, int n)
{
    op_softmax(x, n);
}
#endif

#ifndef KERNEL_HAS_SOFTMAX_ROWS
void kernel_softmax_rows(float *x, int stride, int rows, int n)
{
    for (int r = 0; r < rows; r++) {
        kernel_softmax(x + (int64_t)r * stride, n);
    }
}
#endif

#ifndef KERNEL_HAS_WIDEN_F16
void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    kernel_scalar_widen_f16(out, h, n);
}
#endif

/* A binary16 tile's n rows (stride apart) widened into tile, head_dim floats a row, then the float
 * kernels: kernels.h's definition of the _f16 attention entry points, and a set's own way out. */
static inline const float *fallback_widen_rows(float *tile, const KernelHalf *h, int stride, int n, int head_dim)
{
    if (stride == head_dim) {
        kernel_widen_f16(tile, h, n * head_dim);
    } else {
        for (int i = 0; i < n; i++) {
            kernel_widen_f16(tile + (int64_t)i * head_dim, h + (int64_t)i * stride, head_dim);
        }
    }
    return tile;
}

static inline void fallback_widened_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                               const KernelHalf *keys, int stride, int n, int head_dim, float scale,
                                               float *tile, int tile_rows)
{
    for (int i = 0; i < n; i += tile_rows) {
        const int m = n - i < tile_rows ? n - i : tile_rows;
        const float *rows = fallback_widen_rows(tile, keys + (int64_t)i * stride, stride, m, head_dim);
        kernel_attention_scores(att + i, att_stride, q, q_stride, n_q, rows, head_dim, m, head_dim, scale);
    }
}

static inline void fallback_widened_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                                            const KernelHalf *values, int stride, int n, int head_dim, float *tile,
                                            int tile_rows)
{
    for (int i = 0; i < n; i += tile_rows) {
        const int m = n - i < tile_rows ? n - i : tile_rows;
        const float *rows = fallback_widen_rows(tile, values + (int64_t)i * stride, stride, m, head_dim);
        kernel_attention_mix(out, out_stride, p + i, p_stride, n_q, rows, head_dim, m, head_dim);
    }
}

#ifndef KERNEL_HAS_ATTENTION_F16
void kernel_attention_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                 const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                                 int tile_rows)
{
    fallback_widened_scores_f16(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, tile, tile_rows);
}

void kernel_attention_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                              const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows)
{
    fallback_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
}
#endif

#ifndef KERNEL_HAS_WIDEN_Q8_0
void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    kernel_scalar_widen_q8_0(out, qs, d, n);
}
#endif

#endif
