/* x86-64 kernels: AVX2 integer dot products for q8_0 and q4_0 (AVX-VNNI where the CPU has it) and
 * for the kept GGUF block types (Q5_0 ... MXFP4: x86_avx2_blocks.c, the set's second file),
 * f32 products eight rows at a time, SwiGLU and activation quantization, chosen at run time
 * (cpuid); the scalar kernels otherwise. Same bits as kernels/scalar.c: each block's int32 sum is
 * exact, the binary16 weight scales are widened exactly by F16C (vcvtph2ps, eight blocks' scales
 * per instruction), and the float terms (float)isum * (w_d * x_d) follow the reduction tree of
 * kernels.h, the eight partials of a row being the eight lanes of one vector; an f32 row's
 * products are added one column after another, each vector lane carrying a different row. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "x86_vnni.h"

/* This set's own entry points (fallback.h defines the rest). */
#define KERNEL_HAS_MATVEC_F32
#define KERNEL_HAS_MATVEC_Q8_0
#define KERNEL_HAS_MATVEC_Q4_0
#define KERNEL_HAS_MATMUL_F32
#define KERNEL_HAS_MATMUL_Q8_0
#define KERNEL_HAS_MATMUL_Q4_0
#define KERNEL_HAS_MATVEC_Q4_1
#define KERNEL_HAS_MATMUL_Q4_1
#define KERNEL_HAS_SWIGLU
#define KERNEL_HAS_GELU_TANH_MUL
#define KERNEL_HAS_DELTA_RULE_STEP
#define KERNEL_HAS_QUANTIZE_Q8_0
#define KERNEL_HAS_ATTENTION_SCORES
#define KERNEL_HAS_ATTENTION_MIX
#define KERNEL_HAS_ATTENTION_SCORES_TOKENS
#define KERNEL_HAS_ATTENTION_F16
#define KERNEL_HAS_WIDEN_F16
#define KERNEL_HAS_SOFTMAX
#define KERNEL_HAS_SOFTMAX_ROWS
#define KERNEL_HAS_WIDEN_Q8_0
/* the kept GGUF types, defined in x86_avx2_blocks.c (the same kernel set) */
#define KERNEL_HAS_MATVEC_Q5_0
#define KERNEL_HAS_MATMUL_Q5_0
#define KERNEL_HAS_MATVEC_Q5_1
#define KERNEL_HAS_MATMUL_Q5_1
#define KERNEL_HAS_MATVEC_Q4_K
#define KERNEL_HAS_MATMUL_Q4_K
#define KERNEL_HAS_MATVEC_Q5_K
#define KERNEL_HAS_MATMUL_Q5_K
#define KERNEL_HAS_MATVEC_Q6_K
#define KERNEL_HAS_MATMUL_Q6_K
#define KERNEL_HAS_MATVEC_Q3_K
#define KERNEL_HAS_MATMUL_Q3_K
#define KERNEL_HAS_MATVEC_Q2_K
#define KERNEL_HAS_MATMUL_Q2_K
#define KERNEL_HAS_MATVEC_IQ4_NL
#define KERNEL_HAS_MATMUL_IQ4_NL
#define KERNEL_HAS_MATVEC_IQ4_XS
#define KERNEL_HAS_MATMUL_IQ4_XS
#define KERNEL_HAS_MATVEC_MXFP4
#define KERNEL_HAS_MATMUL_MXFP4
#include "fallback.h"

/* AVX2 and F16C, both or neither: every kernel of the AVX2 region below is compiled for the two.
 * Every CPU with AVX2 has F16C, but a hypervisor may hide either; then the scalar kernels run. */
static int have_avx2_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 1 : 0;
    }
    return known;
}

/* The same checks for the set's other file (x86_avx2_blocks.c). */
int x86_avx2_usable(void)
{
    return have_avx2_f16c();
}

static int have_vnni(void);

int x86_avx2_vnni(void)
{
    return have_vnni();
}

const char *kernel_set(void)
{
    return have_avx2_f16c() ? "avx2" : "scalar";
}

const char *kernel_cpu_features(void)
{
    if (!have_avx2_f16c()) {
        return "none";
    }
    return have_vnni() == KERNEL_VNNI_VEX ? "avx2,f16c,avxvnni" : have_vnni() ? "avx2,f16c,avx512vnni" : "avx2,f16c";
}

/* The integer dot products of quantized blocks. With vpdpbusd (four u8 x s8 products summed into
 * each int32 lane, exactly) a block takes one instruction fewer than with AVX2's maddubs (pairs
 * into int16) + madd (pairs into int32); both give the exact int32 sums. AVX-VNNI encodes it with
 * VEX; a CPU with AVX512-VNNI and AVX512VL but not AVX-VNNI (AMD Zen 4) runs the same instruction
 * on ymm registers EVEX encoded (libgcc reports the AVX-512 features only where the OS saves their
 * state). The choice is made at run time (KERNEL_VNNI_VEX, KERNEL_VNNI_EVEX or 0); KERNEL_NO_VNNI
 * builds the AVX2 path alone (tests run both). */
static int have_vnni(void)
{
#ifdef KERNEL_NO_VNNI
    return 0;
#else
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avxvnni")                                              ? KERNEL_VNNI_VEX
                : __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? KERNEL_VNNI_EVEX
                                                                                               : 0;
    }
    return known;
#endif
}

/* The AVX2 region: from here to the pop below, every function is compiled for AVX2 and F16C
 * (not FMA: the f32 and float terms must stay separate multiplies and adds). Nothing here may be
 * reached before the CPU was checked: only the dispatchers after the region call into it, and they
 * are compiled for baseline x86-64, like the scalar kernels of fallback.h above. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#include "x86_avx2.h" /* the helpers this file shares with x86_avx2_blocks.c */

/* The same for two pairs (a0, b0) and (a1, b1) summed: the q4_0 kernel's two halves of a block. */
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
static inline __m256i pair_sums8(__m256i v01, __m256i v23, __m256i v45, __m256i v67)
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

/* dst[i] = src[i] widened, i < n: for the batched kernels, which broadcast one block's scale to
 * every token lane and so want float32s in memory. */
static void widen_halves(float *dst, const KernelHalf *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_halves8(src + i));
    }
    if (i < n) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(dst + i, mask, load_halves(src + i, n - i));
    }
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

/* One q8_0 row's eight partials (reduction tree, kernels.h). */
__attribute__((always_inline)) static inline __m256
q8_row(const int8_t *wq, const KernelHalf *wd, const int8_t *x_qs, const float *x_d, int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const int8_t *w = wq + b * KERNEL_QK, *x = x_qs + b * KERNEL_QK;
        prefetch_ahead(w, 4);
        const __m256i isums = block_sums8(q8_block(w, x, vnni), q8_block(w + 32, x + 32, vnni),
                                          q8_block(w + 64, x + 64, vnni), q8_block(w + 96, x + 96, vnni),
                                          q8_block(w + 128, x + 128, vnni), q8_block(w + 160, x + 160, vnni),
                                          q8_block(w + 192, x + 192, vnni), q8_block(w + 224, x + 224, vnni));
        acc = add_terms(acc, isums, wd + b, x_d + b, 8);
    }
    if (b < nb) { /* unrolled, so the blocks stay in registers (a 640-value row's last 4 of 20) */
        __m256i v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            v[k] = b + k < nb ? q8_block(wq + (b + k) * KERNEL_QK, x_qs + (b + k) * KERNEL_QK, vnni)
                              : _mm256_setzero_si256();
        }
        const __m256i isums = block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        acc = add_terms(acc, isums, wd + b, x_d + b, nb - b);
    }
    return acc;
}

/* Eight rows at a time, each row's blocks streamed in order (one stream per row for the hardware
 * prefetcher, plus the software prefetch); their partials combined together. */
__attribute__((always_inline)) static inline void
matvec_q8_0_rows(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs, const float *x_d,
                 int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            acc[i] = q8_row(w_qs + (int64_t)row[i] * cols, w_d + (int64_t)row[i] * nb, x_qs, x_d, nb, vnni);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

static void matvec_q8_0_vnni(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

static void matvec_q8_0_avx2(float *out, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int rows, int cols)
{
    matvec_q8_0_rows(out, w_qs, w_d, x_qs, x_d, rows, cols, 0);
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

static void q4_prepare(struct q4_input *in, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        const int8_t *x = x_qs + b * KERNEL_QK;
        int8_t *p = in->pairs + (b & ~1) * KERNEL_QK + (b & 1) * 16;
        int32_t s = 0;
        for (int i = 0; i < 16; i++) {
            p[i] = x[i];
            p[32 + i] = x[16 + i];
            s += x[i] + x[16 + i];
        }
        in->sum8[b] = 8 * s;
    }
    if (nb & 1) { /* the odd last block's missing partner: zeros, whose products are 0 */
        memset(in->pairs + (nb - 1) * KERNEL_QK + 16, 0, 16);
        memset(in->pairs + (nb - 1) * KERNEL_QK + 48, 0, 16);
    }
}

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
    return pair_sums8(q4_pair(_mm256_loadu_si256((const __m256i *)w), xp, vnni),
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

/* One q4_0 row's eight partials. */
__attribute__((always_inline)) static inline __m256
q4_row(const uint8_t *wq, const KernelHalf *wd, const struct q4_input *in, const float *x_d, int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256i s = q4_nibble_sums8(wq, in, b, vnni);
        const __m256i isums = _mm256_sub_epi32(s, _mm256_loadu_si256((const __m256i *)(in->sum8 + b)));
        acc = add_terms(acc, isums, wd + b, x_d + b, 8);
    }
    if (b < nb) {
        __m256i v[4];
        q4_tail_pairs(v, wq, in, b, nb, vnni);
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i sum8 = _mm256_maskload_epi32(in->sum8 + b, mask);
        acc = add_terms(acc, _mm256_sub_epi32(pair_sums8(v[0], v[1], v[2], v[3]), sum8), wd + b, x_d + b, n);
    }
    return acc;
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

/* One q4_1 row's eight partials, read as q4_row reads q4_0: two blocks' nibbles per 32-byte load
 * against the pair-laid-out activations, the unsigned nibble products being isum itself; xsum is
 * q4_prepare's 8 * sum(x) shifted back (an exact multiple of 8). */
__attribute__((always_inline)) static inline __m256
q4_1_row(const uint8_t *wq, const KernelHalf *wd, const KernelHalf *wm, const struct q4_input *in, const float *x_d,
         int nb, int vnni)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256i isums = q4_nibble_sums8(wq, in, b, vnni);
        const __m256i xsums = _mm256_srai_epi32(_mm256_loadu_si256((const __m256i *)(in->sum8 + b)), 3);
        acc = add_q4_1_terms(acc, isums, xsums, wd + b, wm + b, x_d + b, 8);
    }
    if (b < nb) {
        __m256i v[4];
        q4_tail_pairs(v, wq, in, b, nb, vnni);
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i xsums = _mm256_srai_epi32(_mm256_maskload_epi32(in->sum8 + b, mask), 3);
        acc = add_q4_1_terms(acc, pair_sums8(v[0], v[1], v[2], v[3]), xsums, wd + b, wm + b, x_d + b, n);
    }
    return acc;
}

/* q4_0 and q4_1 decoding, eight rows at a time: each row's partials in the lanes of one vector,
 * eight rows combined by sum_partials8. w_m is NULL for q4_0 (a constant in every caller, so each
 * compiles to its own straight loop). */
__attribute__((always_inline)) static inline void
matvec_q4_rows(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m, const int8_t *x_qs,
               const float *x_d, int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    struct q4_input in;
    q4_prepare(&in, x_qs, nb);
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *wq = w_q4 + (int64_t)row[i] * (cols / 2);
            const int64_t first_block = (int64_t)row[i] * nb;
            acc[i] = w_m == NULL ? q4_row(wq, w_d + first_block, &in, x_d, nb, vnni)
                                 : q4_1_row(wq, w_d + first_block, w_m + first_block, &in, x_d, nb, vnni);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

static void matvec_q4_0_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

static void matvec_q4_0_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int rows, int cols)
{
    matvec_q4_rows(out, w_q4, w_d, NULL, x_qs, x_d, rows, cols, 0);
}

/* Batched (prefill), q8_0, q4_0 and q4_1, for eight tokens and more: no horizontal sums at all. The
 * activations of up to LANE_TOKENS tokens are transposed once per call so that one vector holds
 * the same four values of a block for each of eight tokens (lane t: token t's values 4k .. 4k + 3 of
 * the block); a row's four weights 4k .. 4k + 3 are broadcast to every lane, and the eight k of a
 * block accumulate into lane t: token t's whole block sum, exact, in one lane. Four rows share each
 * activation vector. The rows of a tile are prepared once for every token that passes over it:
 *   without AVX-VNNI, q8_0: |w| (maddubs' unsigned operand; the activations take w's sign from the
 *     row itself), four products a step, madd to int32;
 *   without AVX-VNNI, q4_0 and q4_1: the nibble q (q4_0's value q - 8); a block's eight steps of
 *     pair sums stay int16 (8 * 2 * 15 * 127 = 30480), one madd a block; q4_0 takes 8 * sum(x)
 *     off, q4_1's term takes sum(x) as its xsum (kernel_q4_1_term);
 *   with it: vpdpbusd on u = w + 128 (q8_0) or q, 128 (q8_0) or 8 (q4_0) times sum(x) taken off.
 * Each lane then follows the reduction tree exactly as the matvec kernel does, so the bits are the
 * same. It replaced one weight row at a time against eight tokens' lanes, whose block sums took
 * seven hadds per eight blocks and token: 1,536 x 576 weights x 64 tokens, one thread, alternating
 * builds, q8_0 22-35 -> 34-45 G multiply-adds a second, q4_0 20-28 -> 39-72, q4_1 20-27 -> 38-69. */
#define LANE_TOKENS 64 /* tokens per pass; longer batches take several */
enum lane_kind { LANE_Q8_0, LANE_Q4_0, LANE_Q4_1 };
#define LANE_TILE_BYTES 16384 /* prepared weights of a row tile, kept in L1 while every token passes */
/* the largest tile: LANE_TILE_BYTES, or four rows when they are longer */
#define LANE_TILE_MAX (4 * MAX_BLOCKS * KERNEL_QK > LANE_TILE_BYTES ? 4 * MAX_BLOCKS * KERNEL_QK : LANE_TILE_BYTES)

struct lane_batch {
    int8_t xt[LANE_TOKENS * MAX_BLOCKS * KERNEL_QK]; /* group g, block b, k: 8 tokens x 4 values */
    float scales[LANE_TOKENS * MAX_BLOCKS];           /* group g, block b: 8 tokens' x_d */
    int32_t bias_sums[LANE_TOKENS * MAX_BLOCKS];      /* group g, block b: 8 tokens' bias * sum(x) */
    uint8_t u[LANE_TILE_MAX];
    float wd[LANE_TILE_MAX / KERNEL_QK]; /* the tile's weight scales widened, once for every token */
    float wm[LANE_TILE_MAX / KERNEL_QK]; /* and q4_1's minimums */
};

_Static_assert(sizeof(struct lane_batch) == X86_LANES_SCRATCH_BYTES, "the lanes scratch x86_avx2.h states");

/* One per thread: each thread of the pool runs the kernel on its own rows; the GGUF types' lanes
 * kernel (x86_avx2_blocks.c) uses the same bytes. */
static _Thread_local struct lane_batch lane_batch;

void *x86_lanes_scratch(void)
{
    return &lane_batch;
}

/* Tokens t0 .. t0 + nt - 1 in the transposed layout; a short last group repeats its first token
 * (lanes computed and dropped). A block of eight tokens is an 8 x 8 matrix of 4-byte groups, so one
 * transpose8 lays it out; each token's quant sum (exact in int32) is the byte pairs' sums of its
 * lane, added over the eight steps. */
static void lane_prepare_tokens(struct lane_batch *bt, const int8_t *x_qs, const float *x_d, int t0, int nt, int nb,
                                int bias)
{
    for (int g = 0; g * 8 < nt; g++) {
        const int8_t *x[8];
        lanes_group_inputs(x, bt->scales + (int64_t)g * nb * 8, x_qs, x_d, t0, nt, g, nb);
        for (int b = 0; b < nb; b++) {
            const int64_t gb = (int64_t)g * nb + b;
            __m256i lo, hi;
            lanes_block(bt->xt + gb * 8 * 32, x, b, &lo, &hi);
            const __m256i sum = _mm256_add_epi32(lo, hi);
            _mm256_storeu_si256((__m256i *)(bt->bias_sums + gb * 8), _mm256_mullo_epi32(sum, _mm256_set1_epi32(bias)));
        }
    }
}

/* Rows r .. r + n - 1 as unsigned bytes in value order: q8_0 |w| (w + 128 with VNNI), q4_0 the
 * nibbles. */
static void lane_prepare_rows(uint8_t *restrict u, const uint8_t *restrict w, enum lane_kind kind, int vnni, int r, int n,
                              int cols)
{
    const int64_t blocks = (int64_t)n * cols / KERNEL_QK;
    if (kind == LANE_Q8_0) {
        const uint8_t *src = w + (int64_t)r * cols;
        for (int64_t blk = 0; blk < blocks; blk++) { /* two's complement w + 128: the sign bit flipped */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(src + blk * 32));
            const __m256i prepared = vnni ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : _mm256_sign_epi8(v, v);
            _mm256_storeu_si256((__m256i *)(u + blk * 32), prepared);
        }
        return;
    }
    const uint8_t *src = w + (int64_t)r * (cols / 2);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t blk = 0; blk < blocks; blk++) {
        const __m128i packed = _mm_loadu_si128((const __m128i *)(src + blk * 16));
        _mm_storeu_si128((__m128i *)(u + blk * 32), _mm_and_si128(packed, low4));
        _mm_storeu_si128((__m128i *)(u + blk * 32 + 16), _mm_and_si128(_mm_srli_epi16(packed, 4), low4));
    }
}

/* Step k of a block for one row: acc + the products of the row's four prepared weights at u (its
 * signed q8_0 quants at w) with the eight tokens' four values xv. q4_0 without VNNI accumulates
 * int16 pair sums (madd once a block, in lane_block_sum). */
__attribute__((always_inline)) static inline __m256i lane_step(__m256i acc, const uint8_t *u, const uint8_t *w,
                                                               __m256i xv, enum lane_kind kind, int vnni)
{
    if (vnni) {
        return vpdpbusd(acc, bcast4(u), xv, vnni);
    }
    if (kind != LANE_Q8_0) {
        return _mm256_add_epi16(acc, _mm256_maddubs_epi16(bcast4(u), xv));
    }
    const __m256i signed_x = _mm256_sign_epi8(xv, bcast4(w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(bcast4(u), signed_x), _mm256_set1_epi16(1)));
}

/* A block's sum from its even and odd steps' accumulators. */
__attribute__((always_inline)) static inline __m256i lane_block_sum(__m256i even, __m256i odd, enum lane_kind kind,
                                                                    int vnni)
{
    if (kind != LANE_Q8_0 && !vnni) { /* int16 pair sums: each half widened, then added */
        const __m256i ones = _mm256_set1_epi16(1);
        return _mm256_add_epi32(_mm256_madd_epi16(even, ones), _mm256_madd_epi16(odd, ones));
    }
    return _mm256_add_epi32(even, odd);
}

/* R (1 or 4) rows of the tile against one group of eight tokens; w: the first row's q8_0 quants
 * as the file holds them (read for their signs without VNNI). */
__attribute__((always_inline)) static inline void
lane_rows(float *out, int out_stride, int n_valid, const uint8_t *u, const uint8_t *w, int cols, const float *wd,
          const float *wm, int nb, const int8_t *xt, const float *scales, const int32_t *bias_sums, int R,
          enum lane_kind kind, int vnni)
{
    __m256 part[4][8];
    for (int i = 0; i < R; i++) {
        for (int k = 0; k < 8; k++) {
            part[i][k] = _mm256_set1_ps(-0.0f);
        }
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *ub = u + b * KERNEL_QK, *wb = w + b * KERNEL_QK;
        const int8_t *xb = xt + (int64_t)b * 8 * 32;
        __m256i acc[4];
        /* named: kept in registers. Each row's even and odd steps go to their own accumulator
         * (integer sums, exact in any order): eight dependency chains of four steps instead of
         * four of eight, as vpdpbusd's latency is several of its issue slots. */
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        __m256i b0 = a0, b1 = a0, b2 = a0, b3 = a0;
#pragma GCC unroll 1
        for (int k = 0; k < 8; k += 2) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + 32 * k));
            const __m256i xw = _mm256_loadu_si256((const __m256i *)(xb + 32 * k + 32));
            a0 = lane_step(a0, ub + 4 * k, wb + 4 * k, xv, kind, vnni);
            b0 = lane_step(b0, ub + 4 * k + 4, wb + 4 * k + 4, xw, kind, vnni);
            if (R == 4) {
                a1 = lane_step(a1, ub + cols + 4 * k, wb + cols + 4 * k, xv, kind, vnni);
                b1 = lane_step(b1, ub + cols + 4 * k + 4, wb + cols + 4 * k + 4, xw, kind, vnni);
                a2 = lane_step(a2, ub + 2 * cols + 4 * k, wb + 2 * cols + 4 * k, xv, kind, vnni);
                b2 = lane_step(b2, ub + 2 * cols + 4 * k + 4, wb + 2 * cols + 4 * k + 4, xw, kind, vnni);
                a3 = lane_step(a3, ub + 3 * cols + 4 * k, wb + 3 * cols + 4 * k, xv, kind, vnni);
                b3 = lane_step(b3, ub + 3 * cols + 4 * k + 4, wb + 3 * cols + 4 * k + 4, xw, kind, vnni);
            }
        }
        acc[0] = lane_block_sum(a0, b0, kind, vnni);
        acc[1] = lane_block_sum(a1, b1, kind, vnni);
        acc[2] = lane_block_sum(a2, b2, kind, vnni);
        acc[3] = lane_block_sum(a3, b3, kind, vnni);
        const __m256i bias = _mm256_loadu_si256((const __m256i *)(bias_sums + b * 8));
        const __m256 xs = _mm256_loadu_ps(scales + b * 8);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const __m256 d = _mm256_set1_ps(wd[(int64_t)i * nb + b]);
            const __m256 terms =
                kind == LANE_Q4_1 ? q4_1_terms(acc[i], bias, d, _mm256_set1_ps(wm[(int64_t)i * nb + b]), xs)
                                  : _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i], bias)), _mm256_mul_ps(d, xs));
            part[i][b % 8] = _mm256_add_ps(part[i][b % 8], terms);
        }
    }
    lanes_store_rows(out, out_stride, n_valid, part, R);
}

/* w_m: q4_1's minimums (NULL for the others). */
__attribute__((always_inline)) static inline void matmul_lanes(float *out, int out_stride, const uint8_t *w,
                                                               enum lane_kind kind, int vnni, const KernelHalf *w_d,
                                                               const KernelHalf *w_m, const int8_t *x_qs,
                                                               const float *x_d, int n_tok, int rows, int cols)
{
    struct lane_batch *bt = &lane_batch;
    const int nb = cols / KERNEL_QK;
    const int row_bytes = kind == LANE_Q8_0 ? cols : cols / 2;
    const int bias = kind == LANE_Q4_0 ? 8 : kind == LANE_Q4_1 ? 1 : vnni ? 128 : 0; /* q4_1: its xsum */
    int tile = LANE_TILE_BYTES / cols / 4 * 4;
    tile = tile < 4 ? 4 : tile;
    for (int t0 = 0; t0 < n_tok; t0 += LANE_TOKENS) {
        const int nt = n_tok - t0 < LANE_TOKENS ? n_tok - t0 : LANE_TOKENS;
        lane_prepare_tokens(bt, x_qs, x_d, t0, nt, nb, bias);
        for (int r0 = 0; r0 < rows; r0 += tile) {
            const int nr = rows - r0 < tile ? rows - r0 : tile;
            lane_prepare_rows(bt->u, w, kind, vnni, r0, nr, cols);
            widen_halves(bt->wd, w_d + (int64_t)r0 * nb, nr * nb);
            if (kind == LANE_Q4_1) {
                widen_halves(bt->wm, w_m + (int64_t)r0 * nb, nr * nb);
            }
            /* The next tile's weights are asked for into L2 a slice per token group while this
             * tile is computed: otherwise preparing it would wait on memory for all of them. */
            const int next_rows = rows - r0 - nr < tile ? rows - r0 - nr : tile;
            const uint8_t *next = w + (int64_t)(r0 + nr) * row_bytes;
            const int64_t next_bytes = (int64_t)next_rows * row_bytes;
            const int groups = (nt + 7) / 8;
            for (int g = 0; g * 8 < nt; g++) {
                const int n_valid = nt - 8 * g < 8 ? nt - 8 * g : 8;
                for (int64_t off = next_bytes * g / groups & ~63; off < next_bytes * (g + 1) / groups; off += 64) {
                    _mm_prefetch((const char *)next + off, _MM_HINT_T1);
                }
                const int64_t gb = (int64_t)g * nb;
                float *o = out + (int64_t)(t0 + 8 * g) * out_stride + r0;
                const uint8_t *wr = w + (int64_t)r0 * row_bytes; /* the signs: q8_0 without VNNI only */
                int r = 0;
                for (; r + 4 <= nr; r += 4) {
                    lane_rows(o + r, out_stride, n_valid, bt->u + (int64_t)r * cols, wr + (int64_t)r * cols, cols,
                              bt->wd + (int64_t)r * nb, bt->wm + (int64_t)r * nb, nb, bt->xt + gb * 8 * 32,
                              bt->scales + gb * 8, bt->bias_sums + gb * 8, 4, kind, vnni);
                }
                for (; r < nr; r++) {
                    lane_rows(o + r, out_stride, n_valid, bt->u + (int64_t)r * cols, wr + (int64_t)r * cols, cols,
                              bt->wd + (int64_t)r * nb, bt->wm + (int64_t)r * nb, nb, bt->xt + gb * 8 * 32,
                              bt->scales + gb * 8, bt->bias_sums + gb * 8, 1, kind, vnni);
                }
            }
        }
    }
}

static void matmul_q8_0_avx2(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
}

static void matmul_q8_0_vnni(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, KERNEL_VNNI_EVEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, (const uint8_t *)w_qs, LANE_Q8_0, KERNEL_VNNI_VEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    }
}

static void matmul_q4_0_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
}

static void matmul_q4_0_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const int8_t *x_qs,
                             const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, KERNEL_VNNI_EVEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_0, KERNEL_VNNI_VEX, w_d, NULL, x_qs, x_d, n_tok, rows, cols);
    }
}

/* q4_1 products. The quants are unsigned (0..15), which is what maddubs (and vpdpbusd) take as
 * their first operand: each pair of quant * int8 activation products sums to at most 2 * 15 * 127
 * in magnitude, well inside int16, and madd widens them to int32, so isum is exact without the
 * sign trick of q8_0. The minimum's part needs xsum, the sum of each activation block's 32 quants,
 * which does not depend on the row: it is computed once per call, for all the rows (decoding:
 * q4_prepare's sums; batched: the lanes kernel's per-token sums above; rows of up to 16384 values,
 * longer rows take the scalar kernel). The terms are kernel_q4_1_term's operations, eight blocks
 * (or eight tokens) per vector, on the binary16 scales and minimums widened by F16C, and they go
 * to the partials of the reduction tree (kernels.h) lane by lane. Decoding reads the nibbles as
 * q4_0's kernel does, two blocks per load, with a row's partials in vector lanes: 1.3-2.1 times
 * the decode speed of one block per load with its terms added block by block (SmolLM2-135M
 * shape, one thread, four alternating runs of each build). */
static void matvec_q4_1_vnni(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                             const int8_t *x_qs, const float *x_d, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, KERNEL_VNNI_EVEX);
    } else {
        matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, KERNEL_VNNI_VEX);
    }
}

static void matvec_q4_1_avx2(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                             const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    matvec_q4_rows(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, 0);
}

/* Short batches (a speculative pass checks 2 to 8 tokens): up to PASS_TOKENS tokens against the
 * same rows in one pass. Each weight block comes from memory once and is multiplied into every
 * token's partials while it sits in L1, so the later tokens' arithmetic runs under the memory
 * stream of the first. Tiles of the matvec (the tokens one after another over a tile of rows) left
 * the memory idle while the later tokens computed: a pass of 2 tokens cost 1.65 single-token
 * passes on the SmolLM2-135M shape. Each (row, token) sum is the matvec kernel's: the same terms
 * into the same partials, eight rows combined by sum_partials8. */
#define PASS_TOKENS 4
#define SHORT_BATCH_MAX 4 /* MATMUL_LANES_FROM - 1: from five tokens on, the batched kernels */

/* One q8_0 row against nt tokens: acc[t] gets token t's eight partials, as q8_row makes them. */
__attribute__((always_inline)) static inline void
q8_row_tokens(__m256 acc[PASS_TOKENS], const int8_t *wq, const KernelHalf *wd, const int8_t *const x_qs[],
              const float *const x_d[], int nt, int nb, int vnni)
{
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_set1_ps(-0.0f);
    }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        const int8_t *w = wq + b * KERNEL_QK;
        prefetch_ahead(w, 4);
        for (int t = 0; t < nt; t++) {
            const int8_t *x = x_qs[t] + b * KERNEL_QK;
            const __m256i isums = block_sums8(q8_block(w, x, vnni), q8_block(w + 32, x + 32, vnni),
                                              q8_block(w + 64, x + 64, vnni), q8_block(w + 96, x + 96, vnni),
                                              q8_block(w + 128, x + 128, vnni), q8_block(w + 160, x + 160, vnni),
                                              q8_block(w + 192, x + 192, vnni), q8_block(w + 224, x + 224, vnni));
            acc[t] = add_terms(acc[t], isums, wd + b, x_d[t] + b, 8);
        }
    }
    if (b < nb) {
        for (int t = 0; t < nt; t++) {
            __m256i v[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                v[k] = b + k < nb ? q8_block(wq + (b + k) * KERNEL_QK, x_qs[t] + (b + k) * KERNEL_QK, vnni)
                                  : _mm256_setzero_si256();
            }
            const __m256i isums = block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            acc[t] = add_terms(acc[t], isums, wd + b, x_d[t] + b, nb - b);
        }
    }
}

/* One q4_0 (w_m NULL) or q4_1 row against nt tokens, as q4_row and q4_1_row make each. */
__attribute__((always_inline)) static inline void
q4_row_tokens(__m256 acc[PASS_TOKENS], const uint8_t *wq, const KernelHalf *wd, const KernelHalf *wm,
              const struct q4_input *const in[], const float *const x_d[], int nt, int nb, int vnni)
{
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_set1_ps(-0.0f);
    }
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        for (int t = 0; t < nt; t++) {
            const __m256i s = q4_nibble_sums8(wq, in[t], b, vnni);
            const __m256i sum8 = _mm256_loadu_si256((const __m256i *)(in[t]->sum8 + b));
            acc[t] = wm == NULL ? add_terms(acc[t], _mm256_sub_epi32(s, sum8), wd + b, x_d[t] + b, 8)
                                : add_q4_1_terms(acc[t], s, _mm256_srai_epi32(sum8, 3), wd + b, wm + b, x_d[t] + b, 8);
        }
    }
    if (b < nb) {
        const int n = nb - b;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int t = 0; t < nt; t++) {
            __m256i v[4];
            q4_tail_pairs(v, wq, in[t], b, nb, vnni);
            const __m256i s = pair_sums8(v[0], v[1], v[2], v[3]);
            const __m256i sum8 = _mm256_maskload_epi32(in[t]->sum8 + b, mask);
            acc[t] = wm == NULL ? add_terms(acc[t], _mm256_sub_epi32(s, sum8), wd + b, x_d[t] + b, n)
                                : add_q4_1_terms(acc[t], s, _mm256_srai_epi32(sum8, 3), wd + b, wm + b, x_d[t] + b, n);
        }
    }
}

/* The nt tokens' sums of rows r .. r + n - 1 (a group of eight, rows past n repeating row r) into
 * out, token t's at out + t * out_stride. `q4` and `w_m == NULL` are constants in every caller. */
__attribute__((always_inline)) static inline void
short_pass(float *out, int out_stride, const uint8_t *w, int q4, const KernelHalf *w_d, const KernelHalf *w_m,
           const int8_t *const x_qs[], const struct q4_input *const in[], const float *const x_d[], int nt, int r,
           int n, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = q4 ? cols / 2 : cols;
    int row[8];
    group_rows8(row, r, n);
    __m256 acc[8][PASS_TOKENS];
    for (int i = 0; i < 8; i++) {
        const uint8_t *wq = w + (int64_t)row[i] * row_bytes;
        const int64_t first_block = (int64_t)row[i] * nb;
        if (q4) {
            q4_row_tokens(acc[i], wq, w_d + first_block, w_m == NULL ? NULL : w_m + first_block, in, x_d, nt, nb, vnni);
        } else {
            q8_row_tokens(acc[i], (const int8_t *)wq, w_d + first_block, x_qs, x_d, nt, nb, vnni);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m256 token[8];
        for (int i = 0; i < 8; i++) {
            token[i] = acc[i][t];
        }
        store_rows(out + (int64_t)t * out_stride + r, sum_partials8(token), n);
    }
}

/* The q4 activations of a short batch, laid out once per call (q4_prepare), per thread. */
static _Thread_local struct q4_input short_batch_q4[SHORT_BATCH_MAX];

/* 2 .. SHORT_BATCH_MAX tokens: each group of eight rows passes under every token, PASS_TOKENS at a
 * time (a second pass finds the group's weights in L1), with nt a constant in each copy. */
__attribute__((always_inline)) static inline void
matmul_short(float *out, int out_stride, const uint8_t *w, int q4, const KernelHalf *w_d, const KernelHalf *w_m,
             const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    const int nb = cols / KERNEL_QK;
    const int8_t *xq[SHORT_BATCH_MAX];
    const float *xd[SHORT_BATCH_MAX];
    const struct q4_input *in[SHORT_BATCH_MAX];
    for (int t = 0; t < n_tok; t++) {
        xq[t] = x_qs + (int64_t)t * cols;
        xd[t] = x_d + (int64_t)t * nb;
        in[t] = &short_batch_q4[t];
        if (q4) {
            q4_prepare(&short_batch_q4[t], xq[t], nb);
        }
    }
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        for (int t0 = 0; t0 < n_tok; t0 += PASS_TOKENS) {
            const int nt = n_tok - t0 < PASS_TOKENS ? n_tok - t0 : PASS_TOKENS;
            float *o = out + (int64_t)t0 * out_stride;
            switch (nt) {
            case 1:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 1, r, n, cols, vnni);
                break;
            case 2:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 2, r, n, cols, vnni);
                break;
            case 3:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, 3, r, n, cols, vnni);
                break;
            default:
                short_pass(o, out_stride, w, q4, w_d, w_m, xq + t0, in + t0, xd + t0, PASS_TOKENS, r, n, cols, vnni);
                break;
            }
        }
    }
}

static void matmul_short_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, (const uint8_t *)w_qs, 0, w_d, NULL, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

static void matmul_short_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, w_q4, 1, w_d, NULL, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

static void matmul_short_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                              const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows,
                              int cols, int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_EVEX);
    } else if (vnni) {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, KERNEL_VNNI_VEX);
    } else {
        matmul_short(out, out_stride, w_q4, 1, w_d, w_m, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

static void matmul_q4_1_avx2(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                             const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, 0, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
}

static void matmul_q4_1_vnni(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                             const KernelHalf *w_m, const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols,
                             int vnni)
{
    if (vnni == KERNEL_VNNI_EVEX) {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, KERNEL_VNNI_EVEX, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_lanes(out, out_stride, w_q4, LANE_Q4_1, KERNEL_VNNI_VEX, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}

/* f32 products. A row's sum is one chain of dependent float32 additions in column order
 * (docs/numerics.md), which no vector can shorten; so the vectors run across rows instead: lane i
 * holds row i's running sum, and step j adds w[i][j] * x[j] in all eight lanes at once. Each lane
 * does exactly the scalar kernel's multiplications and additions in its order, so the bits are
 * the same. The weights are stored row after row, so every 8x8 tile (8 rows, 8 columns) is
 * transposed in registers first. The functions are compiled for avx2 without fma: the compiler
 * has no fused multiply-add to turn a _mm256_mul_ps and _mm256_add_ps into. */

/* Rows r .. r + n - 1 of w as the `lanes` lanes of a row group; lanes past n repeat row r, are
 * computed and dropped, so that a short last group takes the same code. */
static inline void group_rows(const float **p, int lanes, const float *w, int r, int n, int cols)
{
    for (int i = 0; i < lanes; i++) {
        p[i] = w + (int64_t)(r + (i < n ? i : 0)) * cols;
    }
}

/* The tile of rows p[0..7] at columns c .. c + 7, transposed: col[j] lane i = p[i][c + j]. Rows i
 * and i + 4 are loaded into the two 128-bit halves of one register, so that the rest of the
 * transpose (unpack, shuffle) stays within the halves, where shuffles are cheap. */
__attribute__((always_inline)) static inline void transpose_tile(__m256 col[8], const float *const p[8], int c)
{
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        __m256 r[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p[i] + c + h)), _mm_loadu_ps(p[i + 4] + c + h),
                                        1);
        }
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]); /* rows 0 1 0 1, columns h h h+1 h+1 */
        const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]); /* columns h+2 h+2 h+3 h+3 */
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
        const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
        col[h] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
        col[h + 1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
        col[h + 2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
        col[h + 3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* The last k < 8 columns of the rows p[0..7], from column c: copied into a zero-padded 8x8 tile so
 * that the same transpose applies. Only col[0 .. k-1] are used; the padding is never added. */
static void transpose_partial_tile(__m256 col[8], const float *const p[8], int c, int k)
{
    float tile[8][8] = {{0.0f}};
    const float *q[8];
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < k; j++) {
            tile[i][j] = p[i][c + j];
        }
        q[i] = tile[i];
    }
    transpose_tile(col, q, 0);
}

/* Lane i: acc = acc + col[j] * x[j] for j = 0 .. k-1 in order, the scalar kernel's chain for eight
 * rows at once. With `first` (column 0 is col[0]) the sum starts from the first product itself, as
 * the scalar kernel does: 0.0f + (-0.0f) would be +0.0f, so a row of -0.0 products would differ. */
__attribute__((always_inline)) static inline __m256 add_products(__m256 acc, const __m256 col[8], const float *x, int k,
                                                                 int first)
{
    int j = 0;
    if (first) {
        acc = _mm256_mul_ps(col[0], _mm256_broadcast_ss(x));
        j = 1;
    }
#pragma GCC unroll 8
    for (; j < k; j++) {
        acc = _mm256_add_ps(acc, _mm256_mul_ps(col[j], _mm256_broadcast_ss(x + j)));
    }
    return acc;
}

/* Sixteen rows at a time, as two groups of eight whose additions are independent chains, so that
 * one chain's latency is hidden behind the other's. One group's transposed tile (8 registers) is
 * used up before the other's is made: both at once would not fit the 16 registers. The sixteen
 * rows are sixteen streams through memory, which the hardware prefetcher follows poorly; asking for
 * the next group of rows while this one is summed, into L2 (_MM_HINT_T1: 36-96 KB ahead on the
 * SmolLM2 shapes, more than L1 holds), made decoding ~25 % faster than no prefetch and 10-25 %
 * faster than asking for each row's line 1-2 KiB ahead as the q8_0 kernel does, whose last
 * requests in a row fetch the next row, already being read (an Intel Xeon host, 538 MB of f32
 * weights per token). Past the last row it asks for whatever follows; a prefetch never faults. */
static void matvec_f32_avx2(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r += 16) {
        const int n = rows - r < 16 ? rows - r : 16;
        const float *p[16];
        group_rows(p, 16, w, r, n, cols);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int c = 0;
        if (cols >= 8) {
            __m256 col[8];
            transpose_tile(col, p, 0);
            acc0 = add_products(acc0, col, x, 8, 1);
            transpose_tile(col, p + 8, 0);
            acc1 = add_products(acc1, col, x, 8, 1);
            c = 8;
        }
        for (; c + 8 <= cols; c += 8) {
            /* The next sixteen rows are one block of 64 * cols bytes; each step asks for the next
             * 512 bytes of it, so the whole block is requested while this group is summed. */
            const char *next = (const char *)(w + (int64_t)(r + 16) * cols) + (int64_t)c * 64;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                _mm_prefetch(next + 64 * i, _MM_HINT_T1);
            }
            __m256 col[8];
            transpose_tile(col, p, c);
            acc0 = add_products(acc0, col, x + c, 8, 0);
            transpose_tile(col, p + 8, c);
            acc1 = add_products(acc1, col, x + c, 8, 0);
        }
        if (c < cols) {
            __m256 col[8];
            transpose_partial_tile(col, p, c, cols - c);
            acc0 = add_products(acc0, col, x + c, cols - c, c == 0);
            transpose_partial_tile(col, p + 8, c, cols - c);
            acc1 = add_products(acc1, col, x + c, cols - c, c == 0);
        }
        if (n == 16) {
            _mm256_storeu_ps(out + r, acc0);
            _mm256_storeu_ps(out + r + 8, acc1);
        } else {
            float lanes[16];
            _mm256_storeu_ps(lanes, acc0);
            _mm256_storeu_ps(lanes + 8, acc1);
            for (int i = 0; i < n; i++) {
                out[r + i] = lanes[i];
            }
        }
    }
}

/* Batched f32: tokens per pass over the weights; their partial sums wait in a stack array. */
#define F32_TOKENS 64

/* sums[t] lanes: acc + col[j] * x_t[j] for j < k, x_t = x + t * cols, for the nt tokens. */
__attribute__((always_inline)) static inline void
add_products_tokens(__m256 *sums, const __m256 col[8], const float *x, int cols, int nt, int k, int first)
{
    for (int t = 0; t < nt; t++) {
        sums[t] = add_products(sums[t], col, x + (int64_t)t * cols, k, first);
    }
}

/* Eight rows at a time: each 8x8 tile is transposed once and then serves every token of the pass
 * (token t's running sums of the eight rows are sums[t], kept between tiles), so the weights are
 * read once per pass and a transpose costs 1/n_tok of what it does when decoding. Eight rows, not
 * sixteen: the tile, a token's sums and x[j] then fit the 16 registers. Each lane is the matvec
 * kernel's chain for its (row, token), so the bits are the same. */
static void matmul_f32_avx2(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    __m256 sums[F32_TOKENS];
    for (int t0 = 0; t0 < n_tok; t0 += F32_TOKENS) {
        const int nt = n_tok - t0 < F32_TOKENS ? n_tok - t0 : F32_TOKENS;
        const float *xt = x + (int64_t)t0 * cols;
        for (int r = 0; r < rows; r += 8) {
            const int n = rows - r < 8 ? rows - r : 8;
            const float *p[8];
            group_rows(p, 8, w, r, n, cols);
            int c = 0;
            if (cols >= 8) {
                __m256 col[8];
                transpose_tile(col, p, 0);
                add_products_tokens(sums, col, xt, cols, nt, 8, 1);
                c = 8;
            }
            for (; c + 8 <= cols; c += 8) {
                __m256 col[8];
                transpose_tile(col, p, c);
                add_products_tokens(sums, col, xt + c, cols, nt, 8, 0);
            }
            if (c < cols) {
                __m256 col[8];
                transpose_partial_tile(col, p, c, cols - c);
                add_products_tokens(sums, col, xt + c, cols, nt, cols - c, c == 0);
            }
            for (int t = 0; t < nt; t++) {
                float lanes[8];
                _mm256_storeu_ps(lanes, sums[t]);
                for (int i = 0; i < n; i++) {
                    out[(int64_t)(t0 + t) * out_stride + r + i] = lanes[i];
                }
            }
        }
    }
}

/* The scalar quantizer's operations, eight values at a time: the block maximum (order does not
 * matter for a maximum), the same scale and reciprocal, the same rounding by adding and
 * subtracting 1.5 * 2^23, the same clamp. */
static void quantize_q8_0_avx2(int8_t *qs, float *d, const float *x, int n)
{
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    /* packs interleaves 128-bit lanes; this puts the 32 quants back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float scale = _mm_cvtss_f32(m4) / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v[i], vinv), magic), magic);
            q[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
        }
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qs + b * KERNEL_QK), _mm256_permutevar8x32_epi32(bytes, order));
    }
}

/* op_expf eight lanes at a time, with its operations in its order (ops.c): n = x/ln2 rounded half
 * to even (cvtps under the default rounding mode, as lrintf), the two-part ln2 reduction, the
 * degree-6 polynomial, 2^n from the exponent bits; below -87 e^x is 0 (NaN stays NaN), above 88 x
 * is clamped. Every step is one IEEE single-precision operation, so each lane is the scalar result
 * bit for bit. */
static inline __m256 expf8(__m256 x)
{
    const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NGE_UQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 v = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256i n = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)));
    const __m256 nf = _mm256_cvtepi32_ps(n);
    __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(nf, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(nf, _mm256_set1_ps(1.42860676533018e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    const __m256 e = _mm256_mul_ps(p, scale);
    return _mm256_blendv_ps(e, _mm256_and_ps(nan, x), below); /* 0, or the NaN itself */
}

/* op_silu eight lanes at a time: x / (1 + e^-x), e^-x as expf8 computes it. */
static inline __m256 silu8(__m256 x)
{
    const __m256 e = expf8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* op_softmax eight exponentials and divisions at a time, each lane expf8's steps (x - max is never
 * above 0, so only the low end's case applies); the maximum and the sum stay scalar, in order, as
 * op_softmax computes them. */
/* The maximum of x[0 .. n - 1] as op_softmax finds it, eight lanes at a time; 0 if some value is
 * NaN (the caller then takes op_softmax's loop, where a NaN's place decides). Without NaNs the
 * maximum is the same number in any order, except that the sign of a zero maximum may differ,
 * which changes nothing after it: x - (+0) and x - (-0) are x for x != 0, and e^(+0) = e^(-0) = 1. */
static int max_avx2(const float *x, int n, float *max)
{
    __m256 m = _mm256_set1_ps(x[0]), unordered = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    float lanes[8], best = x[0];
    _mm256_storeu_ps(lanes, m);
    for (int k = 0; k < 8; k++) {
        best = lanes[k] > best ? lanes[k] : best;
    }
    int nan = _mm256_movemask_ps(unordered) != 0 || x[0] != x[0];
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    *max = best;
    return !nan;
}

/* x[i] = e^(x[i] - max), eight at a time (expf8), the rest as op_softmax computes them. */
static void exp_shifted_avx2(float *x, int n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax)));
    }
    for (; i < n; i++) {
        const float v = x[i] - max;
        x[i] = v >= -87.0f ? op_expf_in_range(v) : (v != v ? v : 0.0f);
    }
}

static void divide_avx2(float *x, int n, float sum)
{
    const __m256 vsum = _mm256_set1_ps(sum);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vsum));
    }
    for (; i < n; i++) {
        x[i] = x[i] / sum;
    }
}

/* m <= 4 rows (stride apart) of n values: each row's maximum, exponentials, their sum in order
 * and the divisions, as op_softmax. The m sums run interleaved, one add of each row per position:
 * a row's sum is one chain of dependent adds, and m of them fill the adder that one leaves idle. */
__attribute__((always_inline)) static inline void softmax_rows_avx2(float *x, int stride, const int m, int n)
{
    for (int r = 0; r < m; r++) {
        float *row = x + (int64_t)r * stride;
        float max;
        if (!max_avx2(row, n, &max)) {
            max = row[0];
            for (int i = 1; i < n; i++) {
                if (row[i] > max) {
                    max = row[i];
                }
            }
        }
        exp_shifted_avx2(row, n, max);
    }
    float sum[4] = {-0.0f, -0.0f, -0.0f, -0.0f};
    for (int t = 0; t < n; t++) {
#pragma GCC unroll 4
        for (int r = 0; r < m; r++) {
            sum[r] = sum[r] + x[(int64_t)r * stride + t];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < m; r++) {
        divide_avx2(x + (int64_t)r * stride, n, sum[r]);
    }
}

static void softmax_avx2(float *x, int n)
{
    softmax_rows_avx2(x, 0, 1, n);
}

static void softmax_many_avx2(float *x, int stride, int rows, int n)
{
    for (int r0 = 0; r0 < rows; r0 += 4) {
        float *x0 = x + (int64_t)r0 * stride;
        switch (rows - r0 < 4 ? rows - r0 : 4) {
        case 1: softmax_rows_avx2(x0, stride, 1, n); break;
        case 2: softmax_rows_avx2(x0, stride, 2, n); break;
        case 3: softmax_rows_avx2(x0, stride, 3, n); break;
        default: softmax_rows_avx2(x0, stride, 4, n); break;
        }
    }
}

static void swiglu_avx2(float *up, const float *gate, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 s = silu8(_mm256_loadu_ps(gate + i));
        _mm256_storeu_ps(up + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    kernel_scalar_swiglu(up + i, gate + i, n - i);
}

/* op_gelu_tanh eight lanes at a time, its operations in its order: inner = c * (x + a * ((x * x) *
 * x)), tanh(inner) = 1 - 2 / (e^(2 inner) + 1) with e^ as expf8 computes it, then (0.5 * x) *
 * (1 + tanh). */
static inline __m256 gelu_tanh8(__m256 x)
{
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                       _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715f), cube)));
    const __m256 e = expf8(_mm256_mul_ps(_mm256_set1_ps(2.0f), inner));
    const __m256 tanh = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                      _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh));
}

static void gelu_tanh_mul_avx2(float *up, const float *gate, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = gelu_tanh8(_mm256_loadu_ps(gate + i));
        _mm256_storeu_ps(up + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
    }
    kernel_scalar_gelu_tanh_mul(up + i, gate + i, n - i);
}

/* The delta rule eight value columns per vector: lane l carries column j + l's chains, each
 * operation the scalar one (a multiply, then an add), so the sums are the scalar kernel's. */
static void delta_rule_step_avx2(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                                 float beta, float *memory, int key_dim, int value_dim)
{
    const __m256 vdecay = _mm256_set1_ps(decay), vbeta = _mm256_set1_ps(beta);
    for (int j = 0; j < value_dim; j += 8) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(state + j), vdecay);
        _mm256_storeu_ps(state + j, s);
        __m256 m = _mm256_mul_ps(s, _mm256_set1_ps(k[0]));
        for (int i = 1; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = _mm256_mul_ps(_mm256_loadu_ps(row), vdecay);
            _mm256_storeu_ps(row, s);
            m = _mm256_add_ps(m, _mm256_mul_ps(s, _mm256_set1_ps(k[i])));
        }
        m = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + j), m), vbeta);
        _mm256_storeu_ps(memory + j, m);
        __m256 o = _mm256_setzero_ps();
        for (int i = 0; i < key_dim; i++) {
            float *row = state + (int64_t)i * value_dim + j;
            s = _mm256_add_ps(_mm256_loadu_ps(row), _mm256_mul_ps(_mm256_set1_ps(k[i]), m));
            _mm256_storeu_ps(row, s);
            const __m256 term = _mm256_mul_ps(s, _mm256_set1_ps(q[i]));
            o = (i == 0) ? term : _mm256_add_ps(o, term);
        }
        _mm256_storeu_ps(out + j, o);
    }
}

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

static void attention_scores_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                  const float *keys, int stride, int n, int head_dim, float scale)
{
    scores_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, 0);
}

static void attention_scores_f16_avx2(float *att, int att_stride, const float *q, int q_stride, int n_q,
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
#define TOKENS_ROWS_MAX 64
#define TOKENS_HEAD_MAX 256

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

static void attention_scores_tokens_avx2(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride,
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

static void attention_mix_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q,
                               const float *values, int stride, int n, int head_dim)
{
    mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, 0);
}

static void attention_mix_f16_avx2(float *out, int out_stride, const float *p, int p_stride, int n_q,
                                   const KernelHalf *values, int stride, int n, int head_dim)
{
    mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, 1);
}

/* binary16 -> float32 with F16C (vcvtph2ps: exact, subnormals included). */
static void widen_f16_avx2(float *out, const KernelHalf *h, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    }
    for (; i < n; i++) {
        out[i] = kernel_half_to_float(h[i]);
    }
}

/* q8_0 -> float32: each quant widened to float32 and times its block's widened scale (exact). */
static void widen_q8_0_avx2(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const __m256 scale = _mm256_set1_ps(kernel_half_to_float(d[b]));
        for (int i = 0; i < KERNEL_QK; i += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + b * KERNEL_QK + i)));
            _mm256_storeu_ps(out + b * KERNEL_QK + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* The entry points: the CPU's features checked once (cpuid), then the AVX2 kernel, or the scalar
 * one of fallback.h. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_avx2_f16c() && have_vnni()) {
        matvec_q8_0_vnni(out, w_qs, w_d, x_qs, x_d, rows, cols, have_vnni());
    } else if (have_avx2_f16c()) {
        matvec_q8_0_avx2(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS && have_vnni()) {
        matvec_q4_0_vnni(out, w_q4, w_d, x_qs, x_d, rows, cols, have_vnni());
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matvec_q4_0_avx2(out, w_q4, w_d, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
    }
}

/* The batched kernels give each of eight tokens a float lane and compute all eight lanes for any
 * count: below five tokens the short-batch kernels (every token under one pass over the rows) cost
 * less, from five the lanes do (q8_0, 1,536 x 576, five tokens: 0.28 ms short, 0.17 ms as eight
 * lanes; four: 0.21 and 0.24). A speculative pass checks 2 to 8 tokens; a prompt batch has 64. */
#define MATMUL_LANES_FROM 5
_Static_assert(SHORT_BATCH_MAX == MATMUL_LANES_FROM - 1, "the short batches end where the lanes begin");

void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && have_avx2_f16c()) {
        matmul_short_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS && have_vnni()) {
        matmul_q8_0_vnni(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q8_0_avx2(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_short_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS && have_vnni()) {
        matmul_q4_0_vnni(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q4_0_avx2(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS && have_vnni()) {
        matvec_q4_1_vnni(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols, have_vnni());
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matvec_q4_1_avx2(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_1(out, w_q4, w_d, w_m, x_qs, x_d, rows, cols);
    } else if (n_tok < MATMUL_LANES_FROM && have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_short_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (n_tok < MATMUL_LANES_FROM) {
        kernel_tiled_matmul_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS && have_vnni()) {
        matmul_q4_1_vnni(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols, have_vnni());
    } else if (have_avx2_f16c() && cols / KERNEL_QK <= MAX_BLOCKS) {
        matmul_q4_1_avx2(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_q4_1(out, out_stride, w_q4, w_d, w_m, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    if (have_avx2_f16c()) {
        matvec_f32_avx2(out, w, x, rows, cols);
    } else {
        kernel_scalar_matvec_f32(out, w, x, rows, cols);
    }
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_f32(out, w, x, rows, cols);
    } else if (have_avx2_f16c()) {
        matmul_f32_avx2(out, out_stride, w, x, n_tok, rows, cols);
    } else {
        kernel_tiled_matmul_f32(out, out_stride, w, x, n_tok, rows, cols);
    }
}

void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim)
{
    if (have_avx2_f16c() && value_dim % 8 == 0) {
        delta_rule_step_avx2(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
    } else {
        kernel_scalar_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
    }
}

void kernel_swiglu(float *up, const float *gate, int n)
{
    if (have_avx2_f16c()) {
        swiglu_avx2(up, gate, n);
    } else {
        kernel_scalar_swiglu(up, gate, n);
    }
}

void kernel_gelu_tanh_mul(float *up, const float *gate, int n)
{
    if (have_avx2_f16c()) {
        gelu_tanh_mul_avx2(up, gate, n);
    } else {
        kernel_scalar_gelu_tanh_mul(up, gate, n);
    }
}

void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    if (have_avx2_f16c()) {
        quantize_q8_0_avx2(qs, d, x, n);
    } else {
        kernel_scalar_quantize_q8_0(qs, d, x, n);
    }
}

void kernel_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q, const float *keys,
                             int stride, int n, int head_dim, float scale)
{
    if (have_avx2_f16c()) {
        attention_scores_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    } else {
        kernel_scalar_attention_scores(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    }
}

void kernel_attention_scores_tokens(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale)
{
    if (have_avx2_f16c() && n_tok >= 2 && n <= TOKENS_ROWS_MAX && head_dim <= TOKENS_HEAD_MAX && head_dim % 8 == 0) {
        attention_scores_tokens_avx2(tokens, n_tok, att_stride, q_stride, n_q, keys, stride, n, head_dim, scale);
        return;
    }
    fallback_scores_token_by_token(tokens, n_tok, att_stride, q_stride, n_q, keys, stride, head_dim, scale);
}

void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim)
{
    if (have_avx2_f16c()) {
        attention_mix_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    } else {
        kernel_scalar_attention_mix(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    }
}

void kernel_attention_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                 const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                                 int tile_rows)
{
    if (have_avx2_f16c()) {
        attention_scores_f16_avx2(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale);
    } else {
        fallback_widened_scores_f16(att, att_stride, q, q_stride, n_q, keys, stride, n, head_dim, scale, tile,
                                    tile_rows);
    }
}

void kernel_attention_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                              const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows)
{
    if (have_avx2_f16c()) {
        attention_mix_f16_avx2(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim);
    } else {
        fallback_widened_mix_f16(out, out_stride, p, p_stride, n_q, values, stride, n, head_dim, tile, tile_rows);
    }
}

void kernel_softmax_rows(float *x, int stride, int rows, int n)
{
    if (have_avx2_f16c()) {
        softmax_many_avx2(x, stride, rows, n);
    } else {
        for (int r = 0; r < rows; r++) {
            op_softmax(x + (int64_t)r * stride, n);
        }
    }
}

void kernel_softmax(float *x, int n)
{
    if (have_avx2_f16c()) {
        softmax_avx2(x, n);
    } else {
        op_softmax(x, n);
    }
}

void kernel_widen_f16(float *out, const KernelHalf *h, int n)
{
    if (have_avx2_f16c()) {
        widen_f16_avx2(out, h, n);
    } else {
        kernel_scalar_widen_f16(out, h, n);
    }
}

void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    if (have_avx2_f16c()) {
        widen_q8_0_avx2(out, qs, d, n);
    } else {
        kernel_scalar_widen_q8_0(out, qs, d, n);
    }
}
