/* The x86_avx2 kernel set's own header (the set is this folder, one file per role: kernels.h):
 * the CPU checks (cpu.c), the limits and scratch the files share, the AVX2 kernels that set.c's
 * entry points call once the CPU was checked, and the static inline helpers several files'
 * kernels use. Those are compiled for AVX2 and F16C in this header's own AVX2 region, as every
 * kernel is in its file's region (not FMA: the float terms must stay separate multiplies and
 * adds); the CPU checks and the entry points are compiled for baseline x86-64. */
#ifndef COLIBRI_KERNELS_X86_AVX2_H
#define COLIBRI_KERNELS_X86_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "../kernels.h"

/* The ways to reach vpdpbusd: the value of the kernels' `vnni` argument (a constant in each
 * compiled copy) and of x86_avx2_vnni(); 0 is not at all (maddubs + madd). AVX-VNNI's VEX
 * encoding, or AVX512-VNNI's EVEX encoding of the same instruction on ymm registers (with
 * AVX512VL: CPUs with AVX-512 but without AVX-VNNI, such as AMD Zen 4). Both give the same exact
 * int32 sums. */
#define KERNEL_VNNI_VEX 1
#define KERNEL_VNNI_EVEX 2

/* 1 when the CPU has AVX2 and F16C (cpuid, checked once): only then may a kernel of an AVX2
 * region run. */
int x86_avx2_usable(void);
/* How this CPU reaches vpdpbusd (KERNEL_VNNI_VEX, KERNEL_VNNI_EVEX, or 0 for maddubs + madd;
 * always 0 in a KERNEL_NO_VNNI build), checked once. */
int x86_avx2_vnni(void);

#define MAX_BLOCKS 512 /* the batched kernels and the q4_0 activation layout: rows of up to 16384 values */
#define SHORT_BATCH_MAX 4 /* MATMUL_LANES_FROM - 1 (set.c): from five tokens on, the batched kernels */
/* The tile of positions and the head width of attention_scores_tokens_avx2's transposed keys. */
#define TOKENS_ROWS_MAX 64
#define TOKENS_HEAD_MAX 256

/* The AVX2 region of a file (and of this header): every function declared or defined between
 * X86_AVX2_BEGIN and X86_AVX2_END is compiled for AVX2 and F16C, not FMA (the float terms must stay
 * separate multiplies and adds). None may run before x86_avx2_usable() said yes: only set.c's entry
 * points, compiled for baseline x86-64 like the scalar kernels of fallback.h, call into a region. */
#if defined(__clang__)
#define X86_AVX2_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2,f16c\"))), apply_to = function)")
#define X86_AVX2_END _Pragma("clang attribute pop")
#else
#define X86_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,f16c\")")
#define X86_AVX2_END _Pragma("GCC pop_options")
#endif

X86_AVX2_BEGIN

/* The per-thread scratch of the batched kernels in lanes: matmul.c's (q8_0, q4_0, q4_1) and
 * blocks_lanes.c's (the GGUF types) lay their tokens and rows out in the same bytes, since a
 * thread runs one product at a time. A buffer each would cost every thread of the firmware that much
 * more resident memory (the C runtime zeroes thread-local storage when a thread starts), which a run
 * under a memory budget does not have to spare. X86_LANES_SCRATCH_BYTES is matmul.c's layout's
 * size (asserted there); blocks_lanes.c asserts that its own fits. */
#define X86_LANES_SCRATCH_BYTES 1392640
void *x86_lanes_scratch(void);

/* The kernels of set.c's entry points, by file; a `vnni` argument is KERNEL_VNNI_VEX or
 * KERNEL_VNNI_EVEX, the _avx2 kernels take maddubs + madd. */
/* matvec.c */
void matvec_q8_0_vnni(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                      int rows, int cols, int vnni);
void matvec_q8_0_avx2(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                      int rows, int cols);
void matvec_q4_0_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                      int rows, int cols, int vnni);
void matvec_q4_0_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                      int rows, int cols);
void matvec_q4_1_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m, const int8_t *x_qs,
                      const float *x_d, int rows, int cols, int vnni);
void matvec_q4_1_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m, const int8_t *x_qs,
                      const float *x_d, int rows, int cols);
/* matmul.c: the lanes kernels, and the short batches (2 .. SHORT_BATCH_MAX tokens; any `vnni`) */
void matmul_q8_0_vnni(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols, int vnni);
void matmul_q8_0_avx2(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols);
void matmul_q4_0_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols, int vnni);
void matmul_q4_0_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                      const float *x_d, int n_tok, int rows, int cols);
void matmul_q4_1_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                      const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni);
void matmul_q4_1_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                      const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);
void matmul_short_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                       const float *x_d, int n_tok, int rows, int cols, int vnni);
void matmul_short_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                       const float *x_d, int n_tok, int rows, int cols, int vnni);
void matmul_short_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                       const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni);
/* f32.c */
void matvec_f32_avx2(float *out, const float *w, const float *x, int rows, int cols);
void matmul_f32_avx2(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols);
/* vector.c */
void quantize_q8_0_avx2(int8_t *qs, float *d, const float *x, int n);
void softmax_avx2(float *x, int n);
void softmax_many_avx2(float *x, int stride, int rows, int n);
void swiglu_avx2(float *up, const float *gate, int n);
void gelu_tanh_mul_avx2(float *up, const float *gate, int n);
void delta_rule_step_avx2(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                          float beta, float *memory, int key_dim, int value_dim);
void widen_f16_avx2(float *out, const KernelHalf *h, int n);
void widen_q8_0_avx2(float *out, const int8_t *qs, const KernelHalf *d, int n);
/* attention.c */
void attention_scores_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q, const float *keys,
                           int stride, int n, int head_dim, float scale);
void attention_scores_f16_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q,
                               const KernelHalf *keys, int stride, int n, int head_dim, float scale);
void attention_scores_tokens_avx2(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride, int n_q,
                                  const float *keys, int stride, int n, int head_dim, float scale);
void attention_mix_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                        int stride, int n, int head_dim);
void attention_mix_f16_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q,
                            const KernelHalf *values, int stride, int n, int head_dim);
/* blocks.c: the kept GGUF block types, rows of up to MAX_BLOCKS blocks of 32 values */
void matvec_q5_0_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q5_1_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q4_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q5_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q6_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q3_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_q2_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_iq4_nl_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_iq4_xs_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matvec_mxfp4_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void matmul_q5_0_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q5_1_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q4_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q5_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q6_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q3_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_q2_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                      int rows, int cols);
void matmul_iq4_nl_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void matmul_iq4_xs_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void matmul_mxfp4_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                       int rows, int cols);

/* The helpers several files' kernels share. */

/* acc + the four adjacent u8 x s8 products of a and b per int32 lane (vpdpbusd, encoded as `vnni`
 * says). Written as one instruction of inline assembly so that every function here is compiled
 * for AVX2 and F16C alone: the compiler cannot then use VNNI or AVX-512 anywhere the CPU was not
 * checked for it. */
__attribute__((always_inline)) static inline __m256i vpdpbusd(__m256i acc, __m256i a, __m256i b, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    } else {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    }
    return acc;
}

/* Unsigned a times signed b, four adjacent products per int32 lane: vpdpbusd, or maddubs + madd
 * (whose int16 pair sums cannot saturate here: |a| <= 127 with q8_0 quants, a <= 15 with nibbles,
 * |b| <= 127). `vnni` is a constant in every caller, so each path compiles to straight code. */
__attribute__((always_inline)) static inline __m256i dot_u8s8(__m256i a, __m256i b, int vnni)
{
    if (vnni) {
        return vpdpbusd(_mm256_setzero_si256(), a, b, vnni);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* The 8 int32 lanes of each of v0..v7 summed: lane i of the result is the total of v_i (integer
 * adds: exact in any order). */
static inline __m256i block_sums8(__m256i v0, __m256i v1, __m256i v2, __m256i v3,
                                  __m256i v4, __m256i v5, __m256i v6, __m256i v7)
{
    __m256i h01 = _mm256_hadd_epi32(v0, v1);
    __m256i h23 = _mm256_hadd_epi32(v2, v3);
    __m256i h45 = _mm256_hadd_epi32(v4, v5);
    __m256i h67 = _mm256_hadd_epi32(v6, v7);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23);
    __m256i h4567 = _mm256_hadd_epi32(h45, h67);
    __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* An 8x8 transpose: afterwards r[k] lane i is what r[i] lane k was. */
__attribute__((always_inline)) static inline void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    /* u_k: elements k (low half) and k + 4 (high half) of rows 0-3 (u0..u3) or 4-7 (u4..u7) */
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The combine of the reduction tree (kernels.h) for eight rows at once: acc[i] holds row i's eight
 * partials; the result's lane i is ((p0 + p1) + p2) + ... + p7 of row i. The 8x8 transpose puts
 * partial k of every row in col[k]; then seven vertical adds in order. (The q4_1 and any later
 * block type reuse this.) */
static inline __m256 sum_partials8(const __m256 acc[8])
{
    __m256 col[8];
    for (int k = 0; k < 8; k++) {
        col[k] = acc[k];
    }
    transpose8(col);
    __m256 sum = col[0];
    for (int k = 1; k < 8; k++) {
        sum = _mm256_add_ps(sum, col[k]);
    }
    return sum;
}

/* Decoding streams every weight once from memory. Asking for the lines that lie PREFETCH_BYTES
 * ahead of the ones being used keeps more requests in flight than the hardware prefetcher does on
 * its own: the SmolLM2-135M shape's q8_0 matrices took 19 ms per token without it, 13 ms at 2 KiB
 * and 11-12 ms at 6-8 KiB ahead (thread CPU time, an Intel Xeon KVM guest, alternating builds;
 * the scales were float32 then). The distance is counted in quant bytes, which binary16 scales did
 * not change; the scales are a stream of their own, 2 bytes per 32 weights (1/16 of q8_0's quants,
 * 1/8 of q4's), sequential across a matrix's rows, which the hardware prefetcher keeps up with.
 * It crosses rows and matrices freely; a prefetch never faults. always_inline: a function that
 * only prefetches looks side-effect free to GCC, which then deleted every call to it (the kernels
 * before this one had no software prefetch at all, whatever their source said). */
#define PREFETCH_BYTES 8192

__attribute__((always_inline)) static inline void prefetch_ahead(const void *p, int lines)
{
    const char *c = (const char *)p + PREFETCH_BYTES;
    for (int i = 0; i < lines; i++) {
        _mm_prefetch(c + 64 * i, _MM_HINT_T0);
    }
}

/* Rows r .. r + n - 1 of a matrix as the eight rows of a group; rows past n repeat row r and are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows8(int *row, int r, int n)
{
    for (int i = 0; i < 8; i++) {
        row[i] = r + (i < n ? i : 0);
    }
}

/* The lanes layout of the batched kernels (matmul.c's matmul_lanes, blocks_lanes.c's
 * blocks_lanes): block b of eight tokens' q8_0 inputs x[0..7] as eight steps of 32 bytes at xt,
 * step k lane t = token t's values 4k .. 4k + 3, made by one 8x8 transpose of 4-byte groups.
 * Returns each token's quant sums (exact int32, lane t) of the block's values 0-15 in *lo and
 * 16-31 in *hi. */
__attribute__((always_inline)) static inline void lanes_block(int8_t *xt, const int8_t *const x[8], int b, __m256i *lo,
                                                              __m256i *hi)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256 r[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        r[t] = _mm256_loadu_ps((const float *)(x[t] + b * KERNEL_QK));
    }
    transpose8(r);
    __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i step = _mm256_castps_si256(r[k]);
        _mm256_storeu_si256((__m256i *)(xt + 32 * k), step);
        sums[k / 4] = _mm256_add_epi32(sums[k / 4], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, step), ones16));
    }
    *lo = sums[0];
    *hi = sums[1];
}

/* Group g of the tokens t0 .. t0 + nt - 1 (eight of them; a short last group repeats its first
 * token, computed and dropped): their q8_0 rows into x, and their block scales into xd in the lanes
 * layout (block b: the eight tokens' x_d at xd + 8 b). */
static inline void lanes_group_inputs(const int8_t *x[8], float *xd, const int8_t *x_qs, const float *x_d, int t0,
                                      int nt, int g, int nb)
{
    for (int t = 0; t < 8; t++) {
        const int tok = t0 + 8 * g + (8 * g + t < nt ? t : 0);
        x[t] = x_qs + (int64_t)tok * nb * KERNEL_QK;
        for (int b = 0; b < nb; b++) {
            xd[b * 8 + t] = x_d[(int64_t)tok * nb + b];
        }
    }
}

/* The combine of the reduction tree for R rows of eight tokens in lanes: part[i][k] holds row i's
 * partial k of every token (lane t); each row's total, ((p0 + p1) + p2) + ... + p7 lane by lane,
 * goes to out[t * out_stride + i] for the n_valid tokens. */
__attribute__((always_inline)) static inline void lanes_store_rows(float *out, int out_stride, int n_valid,
                                                                   __m256 part[4][8], int R)
{
    for (int i = 0; i < R; i++) {
        __m256 sum = part[i][0];
        for (int k = 1; k < 8; k++) {
            sum = _mm256_add_ps(sum, part[i][k]);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, sum);
        for (int t = 0; t < n_valid; t++) {
            out[(int64_t)t * out_stride + i] = lanes[t];
        }
    }
}

/* acc + the four adjacent u8 x s8 products of u and x per int32 lane, exact: vpdpbusd, or maddubs +
 * madd, whose int16 pair sums cannot saturate when u <= 128 (2 * 128 * 127 < 32768). */
__attribute__((always_inline)) static inline __m256i lanes_step(__m256i acc, __m256i u, __m256i x, int vnni)
{
    if (vnni) {
        return vpdpbusd(acc, u, x, vnni);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}

/* Four bytes at p broadcast to every int32 lane. */
__attribute__((always_inline)) static inline __m256i bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline void store_rows(float *out, __m256 v, int n)
{
    if (n == 8) {
        _mm256_storeu_ps(out, v);
    } else {
        float lanes[8];
        _mm256_storeu_ps(lanes, v);
        for (int i = 0; i < n; i++) {
            out[i] = lanes[i];
        }
    }
}

/* The q8_0, q4_0 and q4_1 helpers of matvec.c's kernels and matmul.c's (whose short batches give
 * each (row, token) the matvec's sum). */

/* dot_u8s8 for two pairs (a0, b0) and (a1, b1) summed: the q4_0 kernel's two halves of a block. */
__attribute__((always_inline)) static inline __m256i dot2_u8s8(__m256i a0, __m256i b0, __m256i a1, __m256i b1, int vnni)
{
    if (vnni) {
        return vpdpbusd(vpdpbusd(_mm256_setzero_si256(), a0, b0, vnni), a1, b1, vnni);
    }
    /* each maddubs lane is at most 2 * 15 * 127 in magnitude, so their sum fits int16 */
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(a0, b0), _mm256_maddubs_epi16(a1, b1)),
                             _mm256_set1_epi16(1));
}

/* Four vectors each holding two blocks (lanes 0-3: block 2i, lanes 4-7: block 2i + 1) -> the eight
 * block totals in block order. The hadds give blocks 0 2 4 6 | 1 3 5 7; one permute orders them. */
static inline __m256i q4_pair_sums8(__m256i v01, __m256i v23, __m256i v45, __m256i v67)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v01, v23), _mm256_hadd_epi32(v45, v67));
    return _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Eight consecutive binary16 scales (16 bytes) widened to float32, exactly: one vcvtph2ps, which
 * takes its operand from memory, so a row's eight scales cost as many instructions as the float32
 * load they replace. */
__attribute__((always_inline)) static inline __m256 load_halves8(const KernelHalf *h)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* The first n < 8 of them, lanes past n 0.0f, reading nothing past the n-th: a 16-byte load could
 * run past the end of the scales (and of the mapped image). Pairs of halves come in as the int32
 * lanes of a masked load, an odd last one broadcast and blended into its lane; no copy, so no call
 * to memcpy in the row loop of a matrix whose rows end in a short group (576 columns: 18 blocks). */
__attribute__((always_inline)) static inline __m256 load_halves(const KernelHalf *h, int n)
{
    __m128i v = _mm_maskload_epi32((const int *)h, _mm_cmpgt_epi32(_mm_set1_epi32(n / 2), _mm_setr_epi32(0, 1, 2, 3)));
    if (n & 1) {
        const __m128i last = _mm_cmpeq_epi16(_mm_set1_epi16((short)(n - 1)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        v = _mm_blendv_epi8(v, _mm_set1_epi16((short)h[n - 1]), last);
    }
    return _mm256_cvtph_ps(v);
}

/* Adds the terms of blocks b .. b + n - 1 (n <= 8, lane k = block b + k) to the row's partials:
 * partial k of the row gets block b + k, b being a multiple of 8. Lanes past n get -0.0f, which
 * leaves a partial exactly as it was. */
__attribute__((always_inline)) static inline __m256 add_terms(__m256 acc, __m256i isums, const KernelHalf *wd,
                                                              const float *xd, int n)
{
    if (n == 8) {
        const __m256 scales = _mm256_mul_ps(load_halves8(wd), _mm256_loadu_ps(xd));
        return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isums), scales));
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 scales = _mm256_mul_ps(load_halves(wd, n), _mm256_maskload_ps(xd, mask));
    const __m256 terms = _mm256_mul_ps(_mm256_cvtepi32_ps(isums), scales);
    return _mm256_add_ps(acc, _mm256_blendv_ps(_mm256_set1_ps(-0.0f), terms, _mm256_castsi256_ps(mask)));
}

/* q8_0: the 32 products of weight block w and activation block x, as 8 int32 lane sums. |w| is
 * the unsigned operand and x takes w's sign. */
__attribute__((always_inline)) static inline __m256i q8_block(const int8_t *w, const int8_t *x, int vnni)
{
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return dot_u8s8(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv), vnni);
}

/* q4_0 decoding reads two blocks' 32 bytes with one load: the low nibbles are values 0-15 of both
 * blocks and the high nibbles values 16-31, so the activations are laid out to match once per call
 * (Q4_PAIRS: for each pair of blocks, x values 0-15 of both, then 16-31 of both). Nibbles are
 * multiplied as the unsigned quants (0..15) and 8 * sum(x) is taken off each block's total, an
 * exact integer identity: sum((q - 8) x) = sum(q x) - 8 sum(x). */

/* The q4_0 activations of one call: x in pair layout and 8 * each block's quant sum. */
struct q4_input {
    int8_t pairs[MAX_BLOCKS * KERNEL_QK];
    int32_t sum8[MAX_BLOCKS];
};

/* in laid out from x_qs's nb blocks (matvec.c; once per call, not per row) */
void q4_prepare(struct q4_input *in, const int8_t *x_qs, int nb);

/* Blocks b and b + 1 (lanes 0-3 and 4-7), from their 32 packed bytes and the pair-laid-out x. */
__attribute__((always_inline)) static inline __m256i q4_pair(__m256i packed, const int8_t *xp, int vnni)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(packed, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    return dot2_u8s8(lo, _mm256_loadu_si256((const __m256i *)xp), hi, _mm256_loadu_si256((const __m256i *)(xp + 32)),
                     vnni);
}

/* Blocks b .. b + 7 of a row: the sums of their unsigned nibbles times the activations, in block
 * order (four 32-byte loads, two blocks each), the weights 8 KiB ahead prefetched. */
__attribute__((always_inline)) static inline __m256i
q4_nibble_sums8(const uint8_t *wq, const struct q4_input *in, int b, int vnni)
{
    const uint8_t *w = wq + b * (KERNEL_QK / 2);
    const int8_t *xp = in->pairs + b * KERNEL_QK;
    prefetch_ahead(w, 2);
    return q4_pair_sums8(q4_pair(_mm256_loadu_si256((const __m256i *)w), xp, vnni),
                      q4_pair(_mm256_loadu_si256((const __m256i *)(w + 32)), xp + 64, vnni),
                      q4_pair(_mm256_loadu_si256((const __m256i *)(w + 64)), xp + 128, vnni),
                      q4_pair(_mm256_loadu_si256((const __m256i *)(w + 96)), xp + 192, vnni));
}

/* The unsigned nibble products of a row's last 1-7 blocks from block b on, as q4_pair gives them
 * for whole pairs: whole pairs, then an odd block read alone (no load past the row), zeros after. */
__attribute__((always_inline)) static inline void
q4_tail_pairs(__m256i v[4], const uint8_t *wq, const struct q4_input *in, int b, int nb, int vnni)
{
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const int blk = b + 2 * k;
        __m256i packed = _mm256_setzero_si256();
        if (blk + 1 < nb) {
            packed = _mm256_loadu_si256((const __m256i *)(wq + blk * (KERNEL_QK / 2)));
        } else if (blk < nb) {
            packed = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(wq + blk * (KERNEL_QK / 2))));
        }
        v[k] = blk < nb ? q4_pair(packed, in->pairs + blk * KERNEL_QK, vnni) : _mm256_setzero_si256();
    }
}

/* Eight blocks' terms: (float)isum * (w_d * x_d) + (float)xsum * (w_m * x_d), lane by lane. */
static inline __m256 q4_1_terms(__m256i isum, __m256i xsum, __m256 w_d, __m256 w_m, __m256 x_d)
{
    return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w_d, x_d)),
                         _mm256_mul_ps(_mm256_cvtepi32_ps(xsum), _mm256_mul_ps(w_m, x_d)));
}

/* Adds blocks b .. b + n - 1's q4_1 terms (n <= 8, lane k = block b + k) to a row's partials, as
 * add_terms does for q8_0: partial k gets block b + k, and lanes past n get -0.0f. */
__attribute__((always_inline)) static inline __m256 add_q4_1_terms(__m256 acc, __m256i isums, __m256i xsums,
                                                                   const KernelHalf *wd, const KernelHalf *wm,
                                                                   const float *xd, int n)
{
    if (n == 8) {
        return _mm256_add_ps(acc, q4_1_terms(isums, xsums, load_halves8(wd), load_halves8(wm), _mm256_loadu_ps(xd)));
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 terms = q4_1_terms(isums, xsums, load_halves(wd, n), load_halves(wm, n), _mm256_maskload_ps(xd, mask));
    return _mm256_add_ps(acc, _mm256_blendv_ps(_mm256_set1_ps(-0.0f), terms, _mm256_castsi256_ps(mask)));
}

X86_AVX2_END

#endif
