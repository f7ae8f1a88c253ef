/* The x86_avx2 set's attention over the KV cache (float32 or binary16, widened by F16C as it is
 * read): the scores of up to four query heads of a group per pass over the keys, a prompt block's
 * tokens against one transposed tile, and the value sums; each lane carries one position's or one
 * dimension's chain in the scalar kernel's order. Called by set.c's entry points once the CPU was
 * checked. */
#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

/* A key's or value's elements, from a float32 tile or read where they lie in a binary16 cache
 * (widened exactly, as kernel_widen_f16 would: vcvtph2ps, kernel_half_to_float): `half` is a
 * constant in every caller, so each kernel below compiles once per cache type. */
__attribute__((always_inline)) static inline __m256 kv_load8(const void *base, int64_t i, int half)
{
    if (half) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const KernelHalf *)base + i)));
    }
    return _mm256_loadu_ps((const float *)base + i);
}

__attribute__((always_inline)) static inline float kv_load1(const void *base, int64_t i, int half)
{
    return half ? kernel_half_to_float(((const KernelHalf *)base)[i]) : ((const float *)base)[i];
}

/* The keys of eight positions a KV head's pass will read SCORES_PREFETCH_POSITIONS positions
 * later, asked for now. Each KV head's keys are one stream (attention.c: [KV head][slot]), but in
 * a decode each is a short one started cold between the weights' streams, and the hardware
 * prefetchers ramped up on it too late: decode of SmolLM2-135M Q4_1 at 1,536 positions (63 tokens,
 * six alternating runs of each build) took 687-722 ms without this and 580-646 ms with it. On one
 * long stream alone (the kernel in a loop over consecutive heads) it changes nothing. Two steps of
 * sixteen ahead: with the staged columns below, 64 positions ahead left the scores of 4,096
 * positions (tools/attention_bench.c) at 4.2-4.7 ms a token, 32 at 3.6-3.8. */
#define SCORES_PREFETCH_POSITIONS 32

__attribute__((always_inline)) static inline void scores_prefetch(const void *keys, int64_t at, int stride,
                                                                  int64_t row_bytes, const int half)
{
    const char *base = (const char *)keys + at * (half ? 2 : 4);
    const int64_t step = (int64_t)stride * (half ? 2 : 4);
    for (int p = 0; p < 8; p++) {
        for (int64_t off = 0; off < row_bytes; off += 64) {
            _mm_prefetch(base + p * step + off, _MM_HINT_T0);
        }
    }
}

/* The widest head whose columns scores_avx2_heads stages: two groups of eight positions, 16 KiB. */
#define SCORES_STAGED_DIM 256

/* The eight keys from k on (stride apart), values j .. j + 7 of each, as columns: col[t] lane p =
 * key p's value j + t. */
__attribute__((always_inline)) static inline void key_columns8(__m256 col[8], const void *keys, int64_t k, int stride,
                                                               int j, const int half)
{
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        col[p] = kv_load8(keys, k + (int64_t)p * stride + j, half);
    }
    transpose8(col);
}

/* Eight keys' columns, column j lane p = key p's value j, for j < head_dim (a multiple of 8). */
__attribute__((always_inline)) static inline void stage_columns(__m256 *cols, const void *keys, int64_t k, int stride,
                                                                int head_dim, const int half)
{
    for (int j = 0; j < head_dim; j += 8) {
        key_columns8(cols + j, keys, k, stride, j, half);
    }
}

/* Attention scores, eight positions per vector: lane p carries position i + p's sum over j in
 * order, from -0.0f, the scalar kernel's chain lane by lane. Eight keys' next eight values are
 * loaded and transposed once (column t lane p = key p's value j + t) for up to four query heads of
 * the group (grouped-query attention), each column then one multiply and one add per query head;
 * the transposes overlap the additions. Where the head fits the staging, sixteen positions go
 * first (below); positions past the last group of eight take the scalar loop. The unroll pragmas
 * matter: at -O2 GCC keeps these loops of four and eight rolled and the accumulators and columns
 * in memory, every add then waiting on a store (decode at 1,536 positions ran at 34 tok/s that
 * way, 55 with them). */
__attribute__((always_inline)) static inline void scores_avx2_heads(float *att, int att_stride, const float *q,
                                                                   int q_stride, const int m, const void *keys,
                                                                   int stride, int n, int head_dim, float scale,
                                                                   const int half)
{
    int i = 0;
    const int64_t row_bytes = (int64_t)head_dim * (half ? 2 : 4);
    if (head_dim % 8 == 0 && head_dim <= SCORES_STAGED_DIM) {
        /* Sixteen positions a step, their columns staged in L1 first: each sum is a chain of
         * head_dim additions, one per column, and eight positions give only m chains in flight,
         * which the adds' latency then paces; two groups give 2m. */
        __m256 cols_a[SCORES_STAGED_DIM], cols_b[SCORES_STAGED_DIM];
        for (; i + 16 <= n; i += 16) {
            const int64_t k = (int64_t)i * stride;
            if (i + SCORES_PREFETCH_POSITIONS + 16 <= n) {
                scores_prefetch(keys, k + (int64_t)SCORES_PREFETCH_POSITIONS * stride, stride, row_bytes, half);
                scores_prefetch(keys, k + (int64_t)(SCORES_PREFETCH_POSITIONS + 8) * stride, stride, row_bytes, half);
            }
            stage_columns(cols_a, keys, k, stride, head_dim, half);
            stage_columns(cols_b, keys, k + 8 * (int64_t)stride, stride, head_dim, half);
            __m256 acc_a[4], acc_b[4];
#pragma GCC unroll 4
            for (int a = 0; a < m; a++) {
                acc_a[a] = _mm256_set1_ps(-0.0f);
                acc_b[a] = _mm256_set1_ps(-0.0f);
            }
#pragma GCC unroll 2
            for (int j = 0; j < head_dim; j++) {
                const __m256 col_a = cols_a[j], col_b = cols_b[j];
#pragma GCC unroll 4
                for (int a = 0; a < m; a++) {
                    const __m256 w = _mm256_set1_ps(q[(int64_t)a * q_stride + j]);
                    acc_a[a] = _mm256_add_ps(acc_a[a], _mm256_mul_ps(w, col_a));
                    acc_b[a] = _mm256_add_ps(acc_b[a], _mm256_mul_ps(w, col_b));
                }
            }
#pragma GCC unroll 4
            for (int a = 0; a < m; a++) {
                _mm256_storeu_ps(att + (int64_t)a * att_stride + i, _mm256_mul_ps(acc_a[a], _mm256_set1_ps(scale)));
                _mm256_storeu_ps(att + (int64_t)a * att_stride + i + 8, _mm256_mul_ps(acc_b[a], _mm256_set1_ps(scale)));
            }
        }
    }
    for (; i + 8 <= n; i += 8) {
        const int64_t k = (int64_t)i * stride;
        if (i + SCORES_PREFETCH_POSITIONS + 8 <= n) {
            scores_prefetch(keys, k + (int64_t)SCORES_PREFETCH_POSITIONS * stride, stride, row_bytes, half);
        }
        __m256 acc[4];
#pragma GCC unroll 4
        for (int a = 0; a < m; a++) {
            acc[a] = _mm256_set1_ps(-0.0f);
        }
        int j = 0;
        for (; j + 8 <= head_dim; j += 8) {
            __m256 col[8];
            key_columns8(col, keys, k, stride, j, half);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
#pragma GCC unroll 4
                for (int a = 0; a < m; a++) {
                    acc[a] = _mm256_add_ps(acc[a], _mm256_mul_ps(_mm256_set1_ps(q[(int64_t)a * q_stride + j + t]), col[t]));
                }
            }
        }
        for (; j < head_dim; j++) {
            const __m256 col = _mm256_setr_ps(
                kv_load1(keys, k + j, half), kv_load1(keys, k + stride + j, half),
                kv_load1(keys, k + 2 * stride + j, half), kv_load1(keys, k + 3 * stride + j, half),
                kv_load1(keys, k + 4 * stride + j, half), kv_load1(keys, k + 5 * stride + j, half),
                kv_load1(keys, k + 6 * stride + j, half), kv_load1(keys, k + 7 * stride + j, half));
#pragma GCC unroll 4
            for (int a = 0; a < m; a++) {
                acc[a] = _mm256_add_ps(acc[a], _mm256_mul_ps(_mm256_set1_ps(q[(int64_t)a * q_stride + j]), col));
            }
        }
#pragma GCC unroll 4
        for (int a = 0; a < m; a++) {
            _mm256_storeu_ps(att + (int64_t)a * att_stride + i, _mm256_mul_ps(acc[a], _mm256_set1_ps(scale)));
        }
    }
    for (; i < n; i++) {
        const int64_t k = (int64_t)i * stride;
        for (int a = 0; a < m; a++) {
            float s = -0.0f;
            for (int j = 0; j < head_dim; j++) {
                s = s + q[(int64_t)a * q_stride + j] * kv_load1(keys, k + j, half);
            }
            att[(int64_t)a * att_stride + i] = s * scale;
        }
    }
}

__attribute__((always_inline)) static inline void scores_avx2(float *att, int att_stride, const float *q, int q_stride,
                                                              int n_q, const void *keys, int stride, int n,
                                                              int head_dim, float scale, const int half)
{
    for (int a0 = 0; a0 < n_q; a0 += 4) { /* up to four query heads per pass over the keys */
        float *att0 = att + (int64_t)a0 * att_stride;
        const float *q0 = q + (int64_t)a0 * q_stride;
        switch (n_q - a0 < 4 ? n_q - a0 : 4) { /* each count compiled with its accumulators known */
        case 1: scores_avx2_heads(att0, att_stride, q0, q_stride, 1, keys, stride, n, head_dim, scale, half); break;
        case 2: scores_avx2_heads(att0, att_stride, q0, q_stride, 2, keys, stride, n, head_dim, scale, half); break;
        case 3: scores_avx2_heads(att0, att_stride, q0, q_stride, 3, keys, stride, n, head_dim, scale, half); break;
        default: scores_avx2_heads(att0, att_stride, q0, q_stride, 4, keys, stride, n, head_dim, scale, half); break;
        }
    }
}

void attention_scores_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q,
                           const float *keys, int stride, int n, int head_dim, float scale)
{
    scores_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, 0);
}

void attention_scores_f16_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q,
                               const KernelHalf *keys, int stride, int n, int head_dim, float scale)
{
    scores_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, 1);
}

/* A prompt block's tokens against one tile (kernel_attention_scores_tokens): the tile is transposed
 * once into keys_t (row j = the tile's value j of every position, TOKENS_ROWS_MAX wide), then each
 * token's scores read eight positions' value j as one vector: no transpose per token, and a column
 * serves the token's m query heads for sixteen positions at a time (2m sums in registers). Lane p of
 * a vector is position i + p's chain over j in order from -0.0f, the scalar kernel's. The
 * per-token kernel above takes single tokens, head widths that are not a multiple of eight and
 * tiles larger than the scratch. */
static _Thread_local float keys_t[TOKENS_HEAD_MAX * TOKENS_ROWS_MAX];

static void transpose_tile_avx2(float *kt, const float *keys, int stride, int n, int head_dim)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < head_dim; j += 8) {
            __m256 col[8];
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) {
                col[p] = _mm256_loadu_ps(keys + (int64_t)(i + p) * stride + j);
            }
            transpose8(col);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                _mm256_storeu_ps(kt + (int64_t)(j + t) * TOKENS_ROWS_MAX + i, col[t]);
            }
        }
    }
    for (; i < n; i++) {
        for (int j = 0; j < head_dim; j++) {
            kt[(int64_t)j * TOKENS_ROWS_MAX + i] = keys[(int64_t)i * stride + j];
        }
    }
}

/* m <= 4 query heads' scores over positions i .. i + 8 * v_count - 1 of the transposed tile (kt at
 * the token's first position): m * v_count sums in registers, each column load serving m heads. */
__attribute__((always_inline)) static inline void scores_t_vectors(float *att, int att_stride, const float *q,
                                                                   int q_stride, const int m, const float *kt, int i,
                                                                   const int v_count, int head_dim, float scale)
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int a = 0; a < m; a++) {
#pragma GCC unroll 4
        for (int v = 0; v < v_count; v++) {
            acc[a][v] = _mm256_set1_ps(-0.0f);
        }
    }
    for (int j = 0; j < head_dim; j++) {
        __m256 col[4];
#pragma GCC unroll 4
        for (int v = 0; v < v_count; v++) {
            col[v] = _mm256_loadu_ps(kt + (int64_t)j * TOKENS_ROWS_MAX + i + 8 * v);
        }
#pragma GCC unroll 4
        for (int a = 0; a < m; a++) {
            const __m256 qa = _mm256_set1_ps(q[(int64_t)a * q_stride + j]);
#pragma GCC unroll 4
            for (int v = 0; v < v_count; v++) {
                acc[a][v] = _mm256_add_ps(acc[a][v], _mm256_mul_ps(qa, col[v]));
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < m; a++) {
#pragma GCC unroll 4
        for (int v = 0; v < v_count; v++) {
            _mm256_storeu_ps(att + (int64_t)a * att_stride + i + 8 * v, _mm256_mul_ps(acc[a][v], _mm256_set1_ps(scale)));
        }
    }
}

/* m <= 4 query heads' scores over count positions of the transposed tile: 32 positions a pass for
 * one or two heads, 16 for more (at most eight sums in registers; a tile's 64 positions divide
 * evenly), then eight at a time, then the last ones one chain at a time. */
__attribute__((always_inline)) static inline void scores_t_heads(float *att, int att_stride, const float *q,
                                                                 int q_stride, const int m, const float *kt, int count,
                                                                 int head_dim, float scale)
{
    int i = 0;
    if (m <= 2) {
        for (; i + 32 <= count; i += 32) {
            scores_t_vectors(att, att_stride, q, q_stride, m, kt, i, 4, head_dim, scale);
        }
    }
    for (; i + 16 <= count; i += 16) {
        scores_t_vectors(att, att_stride, q, q_stride, m, kt, i, 2, head_dim, scale);
    }
    for (; i + 8 <= count; i += 8) {
        scores_t_vectors(att, att_stride, q, q_stride, m, kt, i, 1, head_dim, scale);
    }
    for (; i < count; i++) {
        for (int a = 0; a < m; a++) {
            float s = -0.0f;
            for (int j = 0; j < head_dim; j++) {
                s = s + q[(int64_t)a * q_stride + j] * kt[(int64_t)j * TOKENS_ROWS_MAX + i];
            }
            att[(int64_t)a * att_stride + i] = s * scale;
        }
    }
}

void attention_scores_tokens_avx2(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride,
                                  int n_q, const float *keys, int stride, int n, int head_dim, float scale)
{
    transpose_tile_avx2(keys_t, keys, stride, n, head_dim);
    for (int t = 0; t < n_tok; t++) {
        const KernelQueryRange *r = &tokens[t];
        for (int a0 = 0; a0 < n_q; a0 += 4) {
            float *att = r->att + (int64_t)a0 * att_stride;
            const float *q = r->q + (int64_t)a0 * q_stride;
            const float *kt = keys_t + r->first;
            switch (n_q - a0 < 4 ? n_q - a0 : 4) {
            case 1: scores_t_heads(att, att_stride, q, q_stride, 1, kt, r->count, head_dim, scale); break;
            case 2: scores_t_heads(att, att_stride, q, q_stride, 2, kt, r->count, head_dim, scale); break;
            case 3: scores_t_heads(att, att_stride, q, q_stride, 3, kt, r->count, head_dim, scale); break;
            default: scores_t_heads(att, att_stride, q, q_stride, 4, kt, r->count, head_dim, scale); break;
            }
        }
    }
}

/* Value sums of m <= 4 query heads over positions 0 .. n - 1, dimensions j0 .. j0 + 15: each value
 * row's sixteen elements are loaded (and widened) once for all the heads of the group, which keeps
 * 2 * m sums in registers; lane j of each carries out[j]'s chain over the positions in order, from
 * the value in `out`. */
__attribute__((always_inline)) static inline void mix_heads16(float *out, int out_stride, const float *p, int p_stride,
                                                              const int m, const void *values, int stride, int n,
                                                              int j0, const int half)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int a = 0; a < m; a++) {
        acc[a][0] = _mm256_loadu_ps(out + (int64_t)a * out_stride + j0);
        acc[a][1] = _mm256_loadu_ps(out + (int64_t)a * out_stride + j0 + 8);
    }
    for (int i = 0; i < n; i++) {
        const __m256 v0 = kv_load8(values, (int64_t)i * stride + j0, half);
        const __m256 v1 = kv_load8(values, (int64_t)i * stride + j0 + 8, half);
#pragma GCC unroll 4
        for (int a = 0; a < m; a++) {
            const __m256 w = _mm256_set1_ps(p[(int64_t)a * p_stride + i]);
            acc[a][0] = _mm256_add_ps(acc[a][0], _mm256_mul_ps(w, v0));
            acc[a][1] = _mm256_add_ps(acc[a][1], _mm256_mul_ps(w, v1));
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < m; a++) {
        _mm256_storeu_ps(out + (int64_t)a * out_stride + j0, acc[a][0]);
        _mm256_storeu_ps(out + (int64_t)a * out_stride + j0 + 8, acc[a][1]);
    }
}

/* Positions taken MIX_POSITIONS at a time, so the head_dim / 16 passes over them read lines the
 * first pass brought into L1 (32 binary16 rows of 64 values: 4 KiB). Blocks of 64 rows summed the
 * values of 4,096 positions (tools/attention_bench.c) in 4.0-4.2 ms a token, of 32 in 3.6-3.7, of
 * 128 in 4.9-5.0: the shorter the block, the sooner its later passes find its lines. */
#define MIX_POSITIONS 32

/* The weighted sum of values: heads of the group four at a time, sixteen dimensions a pass
 * (mix_heads16); a head width that is not a multiple of 16 takes eight dimensions per vector for
 * one head at a time, then the scalar chain for the rest. Every out[j] adds p_i * v_i[j] over the
 * positions in order, whatever the grouping. */
__attribute__((always_inline)) static inline void mix_avx2(float *out, int out_stride, const float *p, int p_stride,
                                                           int n_q, const void *values, int stride, int n,
                                                           int head_dim, const int half)
{
    if (head_dim % 16 == 0) {
        for (int i0 = 0; i0 < n; i0 += MIX_POSITIONS) {
            const int count = n - i0 < MIX_POSITIONS ? n - i0 : MIX_POSITIONS;
            const void *rows = half ? (const void *)((const KernelHalf *)values + (int64_t)i0 * stride)
                                    : (const void *)((const float *)values + (int64_t)i0 * stride);
            for (int a0 = 0; a0 < n_q; a0 += 4) {
                float *o = out + (int64_t)a0 * out_stride;
                const float *w = p + (int64_t)a0 * p_stride + i0;
                for (int j0 = 0; j0 < head_dim; j0 += 16) {
                    switch (n_q - a0 < 4 ? n_q - a0 : 4) {
                    case 1: mix_heads16(o, out_stride, w, p_stride, 1, rows, stride, count, j0, half); break;
                    case 2: mix_heads16(o, out_stride, w, p_stride, 2, rows, stride, count, j0, half); break;
                    case 3: mix_heads16(o, out_stride, w, p_stride, 3, rows, stride, count, j0, half); break;
                    default: mix_heads16(o, out_stride, w, p_stride, 4, rows, stride, count, j0, half); break;
                    }
                }
            }
        }
        return;
    }
    for (int a = 0; a < n_q; a++) {
        float *o = out + (int64_t)a * out_stride;
        const float *w = p + (int64_t)a * p_stride;
        int j0 = 0;
        for (; j0 + 8 <= head_dim; j0 += 8) {
            __m256 acc = _mm256_loadu_ps(o + j0);
            for (int i = 0; i < n; i++) {
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[i]), kv_load8(values, (int64_t)i * stride + j0, half)));
            }
            _mm256_storeu_ps(o + j0, acc);
        }
        for (; j0 < head_dim; j0++) {
            float acc = o[j0];
            for (int i = 0; i < n; i++) {
                acc = acc + w[i] * kv_load1(values, (int64_t)i * stride + j0, half);
            }
            o[j0] = acc;
        }
    }
}

void attention_mix_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q,
                        const float *values, int stride, int n, int head_dim)
{
    mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, 0);
}

void attention_mix_f16_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q,
                            const KernelHalf *values, int stride, int n, int head_dim)
{
    mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, 1);
}

X86_AVX2_END
