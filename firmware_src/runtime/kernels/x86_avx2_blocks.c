/* x86-64 kernels for the GGUF block types kept as the file holds them (Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4): the second file of the x86_avx2 kernel set, as ggml's
 * arch/x86/ splits its kernels. x86_avx2.c names these entry points among the set's
 * KERNEL_HAS_<ENTRY> and includes fallback.h once for the set; this file defines them: the AVX2
 * kernels when the CPU has AVX2 and F16C (x86_avx2_usable), the scalar reference otherwise. */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

/* The AVX2 region, as x86_avx2.c's: every function up to the pop below is compiled for AVX2 and
 * F16C (not FMA), and only the entry points after it, compiled for baseline x86-64, call into it
 * once the CPU was checked. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#include "x86_avx2.h"

/* The GGUF block types kept as the file holds them (kernels.h, "GGUF block types"): decode kernels
 * that read each weight byte once, with the bits of kernels/scalar.c. For every type a block of 32
 * values is turned into 32 unsigned bytes u (the quants, or the quants plus a bias the type's
 * formula takes off again as bias * sum(x), an exact integer identity), and maddubs + madd give
 * the exact int32 sums (no pair of products can saturate int16: the largest u is 63, Q6_K's, and
 * 2 * 63 * 127 = 16002; IQ4's and MXFP4's signed table values go through the sign trick with
 * |v| <= 127, at most 2 * 127 * 127 = 32258). A 256-value superblock is exactly eight 32-value blocks, so its
 * eight block terms are one float vector whose lane j is block 8s + j: it is added to the row's
 * eight partials as it stands (block b -> partial b % 8, in block order). The 32-value types take
 * eight blocks per vector, the q8_0 way. Every term is the contract's formula, a separate
 * multiply or add per step in its order, lane by lane. Activation sums (whole blocks and their
 * halves) are made once per call. The matvec and the short batches take the maddubs path; the
 * lanes kernel for eight tokens and more (blocks_lanes) takes vpdpbusd where the CPU has it (the
 * same exact sums; the tests run both paths). Measured against the scalar kernels (thread CPU time, rows of 2048 values held in L2,
 * an AMD EPYC KVM guest): 10x (Q4_K, Q5_K) to 45x (Q6_K, Q2_K); from memory Q4_K, Q5_K, Q6_K and
 * Q5_0 read 7-8 GB/s where the q8_0 kernel reads 10, while Q3_K, Q2_K and IQ4_XS stay compute bound
 * at 4-6 GB/s. Q5_0 (the Gemma 3 270M file's rows of 640 values) cost ~1.7x q8_0's time per byte
 * while its matvec decoded eight blocks before multiplying them (they spilled to the stack); each
 * block multiplied as soon as it is decoded, and its nibbles spread by one broadcast and one
 * shift, it ran 1.2-1.4x faster (2048 x 640 from memory, thread CPU time, alternating builds). */

/* The q8_0 input's quant sums per 32-value block b: whole, values 0-15 and values 16-31. Lanes
 * past the last block up to a multiple of eight are 0, so eight blocks' sums load as one vector. */
struct block_input {
    int32_t sum[MAX_BLOCKS];
    int32_t lo[MAX_BLOCKS];
    int32_t hi[MAX_BLOCKS];
};

static void block_input_prepare(struct block_input *in, const int8_t *x_qs, int nb)
{
    for (int b = 0; b < nb; b++) {
        const int8_t *x = x_qs + b * KERNEL_QK;
        int32_t lo = 0, hi = 0;
        for (int l = 0; l < 16; l++) {
            lo += x[l];
            hi += x[16 + l];
        }
        in->lo[b] = lo;
        in->hi[b] = hi;
        in->sum[b] = lo + hi;
    }
    for (int b = nb; b % 8 != 0; b++) {
        in->lo[b] = in->hi[b] = in->sum[b] = 0;
    }
}

__attribute__((always_inline)) static inline __m256i load8_i32(const int32_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Lanes 0 .. n - 1 set (n <= 8). */
__attribute__((always_inline)) static inline __m256i lane_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The binary16 at p (any alignment) widened by F16C: the same float as kernel_half_at. */
__attribute__((always_inline)) static inline float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* u: unsigned bytes (each <= 63 here), x: q8_0 quants; 8 int32 lanes, lanes 0-3 the products of
 * values 0-15, lanes 4-7 of values 16-31. */
__attribute__((always_inline)) static inline __m256i dot_block(__m256i u, const int8_t *x)
{
    return dot_u8s8(u, _mm256_loadu_si256((const __m256i *)x), 0);
}

/* Signed values v (|v| <= 127, IQ4's table) times x: |v| unsigned, x taking v's sign. */
__attribute__((always_inline)) static inline __m256i dot_block_signed(__m256i v, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return dot_u8s8(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v), 0);
}

/* u (unsigned bytes <= 31) times x: 16 int16 lanes, each the sum of two products (lanes 0-7 values
 * 0-15, lanes 8-15 values 16-31); none saturates (2 * 31 * 128 = 7936). */
__attribute__((always_inline)) static inline __m256i pairs_block(__m256i u, const int8_t *x)
{
    return _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)x));
}

/* Signed values v (|v| <= 31, MXFP4's table) times x, as pairs_block's: |v| unsigned, x taking v's sign. */
__attribute__((always_inline)) static inline __m256i pairs_block_signed(__m256i v, const int8_t *x)
{
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v));
}

/* Eight blocks' pair sums totalled: lane i of the result is the sum of p[i]'s 16 int16 lanes. The
 * first two steps add in int16, which stays exact for bytes <= 31: a sum of eight products is at
 * most 8 * 31 * 128 = 31744 in size. Two horizontal steps fewer than widening each block to int32
 * first (block_sums8), and integer adds: the same sums in any order. */
__attribute__((always_inline)) static inline __m256i pair_sums8(const __m256i p[8])
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i q0123 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    const __m256i q4567 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7]));
    const __m256i h0123 = _mm256_madd_epi16(q0123, ones); /* lanes 0-3 values 0-15 of blocks 0-3, 4-7 values 16-31 */
    const __m256i h4567 = _mm256_madd_epi16(q4567, ones);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* Eight blocks' lane sums split by halves: lane j of *a is the total of v[j]'s lanes 0-3 (values
 * 0-15), of *b its lanes 4-7 (values 16-31); block_sums8 without its last add. */
__attribute__((always_inline)) static inline void half_sums8(const __m256i v[8], __m256i *a, __m256i *b)
{
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    *a = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    *b = _mm256_permute2x128_si256(h0123, h4567, 0x31);
}

/* 16 bytes of nibbles as 32 bytes in value order: low nibbles values 0-15, high ones 16-31. */
__attribute__((always_inline)) static inline __m256i nibbles32(const uint8_t *qs)
{
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* Q5_0's and Q5_1's 32 five-bit quants (0..31) in value order: the nibbles, and bit l of the
 * 32-bit qh as bit 4 of value l (byte l of the vector gets qh's byte l / 8, then its bit l % 8). */
__attribute__((always_inline)) static inline __m256i q5_quants(const uint8_t *qh, const uint8_t *qs)
{
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nibbles32(qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* IQ4_NL's and IQ4_XS's 32 values of 16 nibble bytes through kvalues_iq4nl (a byte shuffle). */
__attribute__((always_inline)) static inline __m256i iq4_values32(const uint8_t *qs)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_iq4nl_values));
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

/* MXFP4's 32 values of 16 nibble bytes through kvalues_mxfp4, the same shuffle. */
__attribute__((always_inline)) static inline __m256i mxfp4_values32(const uint8_t *qs)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_mxfp4_values));
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

/* Eight MXFP4 blocks' scales 2^(e - 128) from their e8m0 bytes, as kernel_e8m0_half: the float32
 * bits (e - 1) << 23, or 0x00200000 << e for the subnormals e = 0 and 1 (e8 holds 0 past block n). */
__attribute__((always_inline)) static inline __m256 e8m0_half8(const int32_t e8[8])
{
    const __m256i e = load8_i32(e8);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, is_subnormal));
}

/* The ten kept types, as one decode per group of eight 32-value blocks (a superblock, or eight
 * consecutive blocks of a 32-value type) and one product that every type shares. */
enum block_kind {
    KIND_Q5_0,
    KIND_Q5_1,
    KIND_Q4_K,
    KIND_Q5_K,
    KIND_Q6_K,
    KIND_Q3_K,
    KIND_Q2_K,
    KIND_IQ4_NL,
    KIND_IQ4_XS,
    KIND_MXFP4
};

/* A group decoded: block k's 32 bytes u[k] in value order (unsigned quants, or IQ4's and MXFP4's
 * signed table values), and per block (lane k) the float32 scales of its two halves and, for the affine types,
 * their offsets (the one-scale types use sa and oa alone). */
struct group8 {
    __m256i u[8];
    __m256 sa, sb, oa, ob;
};

/* What each type's term looks like (kernels.h's KERNEL_ONE_SCALE / KERNEL_TWO_SCALES, affine), and
 * the bias its bytes carry: u = q + 2^bias_shift, taken off as 2^bias_shift * sum(x). */
__attribute__((always_inline)) static inline int kind_two_scales(enum block_kind k)
{
    return k == KIND_Q6_K || k == KIND_Q3_K || k == KIND_Q2_K;
}

__attribute__((always_inline)) static inline int kind_affine(enum block_kind k)
{
    return k == KIND_Q5_1 || k == KIND_Q4_K || k == KIND_Q5_K || k == KIND_Q2_K;
}

__attribute__((always_inline)) static inline int kind_signed(enum block_kind k)
{
    return k == KIND_IQ4_NL || k == KIND_IQ4_XS || k == KIND_MXFP4;
}

/* Whether a block's values are small enough (|u| <= 31: Q5_0, Q5_1, Q4_K, Q5_K, MXFP4) for the
 * int16 sums of pair_sums8. The two-scale types need their halves apart, and IQ4's table reaches 127. */
__attribute__((always_inline)) static inline int kind_int16_sums(enum block_kind k)
{
    return k == KIND_Q5_0 || k == KIND_Q5_1 || k == KIND_Q4_K || k == KIND_Q5_K || k == KIND_MXFP4;
}

__attribute__((always_inline)) static inline int kind_bias_shift(enum block_kind k)
{
    return k == KIND_Q5_0 ? 4 : k == KIND_Q6_K ? 5 : k == KIND_Q3_K ? 2 : 0; /* 16, 32, 4, none */
}

/* Values and bytes per block as kernels.h states them. */
__attribute__((always_inline)) static inline int kind_values(enum block_kind k)
{
    return k == KIND_Q5_0 || k == KIND_Q5_1 || k == KIND_IQ4_NL || k == KIND_MXFP4 ? 32 : 256;
}

__attribute__((always_inline)) static inline int kind_bytes(enum block_kind k)
{
    switch (k) {
    case KIND_Q5_0: return KERNEL_Q5_0_BYTES;
    case KIND_Q5_1: return KERNEL_Q5_1_BYTES;
    case KIND_Q4_K: return KERNEL_Q4_K_BYTES;
    case KIND_Q5_K: return KERNEL_Q5_K_BYTES;
    case KIND_Q6_K: return KERNEL_Q6_K_BYTES;
    case KIND_Q3_K: return KERNEL_Q3_K_BYTES;
    case KIND_Q2_K: return KERNEL_Q2_K_BYTES;
    case KIND_IQ4_NL: return KERNEL_IQ4_NL_BYTES;
    case KIND_IQ4_XS: return KERNEL_IQ4_XS_BYTES;
    case KIND_MXFP4: return KERNEL_MXFP4_BYTES;
    }
    return 0;
}

/* The scale fields of up to eight blocks of a 32-value type as the file holds them: binary16 d
 * (and Q5_1's m), or MXFP4's e8m0 exponent; blocks not read stay 0. */
struct small_scales {
    uint16_t d[8], m[8];
    int32_t e[8];
};

/* Block k of a Q5_0, Q5_1, IQ4_NL or MXFP4 group at blk: its scale fields into sc, its 32 bytes u
 * in value order returned (Q5_0's u is q + 16). */
__attribute__((always_inline)) static inline __m256i small_block(enum block_kind kind, const uint8_t *blk,
                                                                 struct small_scales *sc, int k)
{
    if (kind == KIND_MXFP4) {
        sc->e[k] = blk[0];
        return mxfp4_values32(blk + 1);
    }
    memcpy(&sc->d[k], blk, 2);
    if (kind == KIND_Q5_0) {
        return q5_quants(blk + 2, blk + 6);
    }
    if (kind == KIND_Q5_1) {
        memcpy(&sc->m[k], blk + 2, 2);
        return q5_quants(blk + 4, blk + 8);
    }
    return iq4_values32(blk + 2);
}

/* The group's float32 scales (and offsets) per block from their fields: one per block, both halves. */
__attribute__((always_inline)) static inline void small_scales_set(enum block_kind kind, const struct small_scales *sc,
                                                                   struct group8 *g)
{
    if (kind == KIND_MXFP4) {
        g->sa = g->sb = e8m0_half8(sc->e);
        g->oa = g->ob = _mm256_setzero_ps();
        return;
    }
    const uint16_t *d = sc->d, *m = sc->m;
    g->sa = g->sb = _mm256_cvtph_ps(_mm_setr_epi16((short)d[0], (short)d[1], (short)d[2], (short)d[3], (short)d[4],
                                                   (short)d[5], (short)d[6], (short)d[7]));
    g->oa = g->ob = _mm256_cvtph_ps(_mm_setr_epi16((short)m[0], (short)m[1], (short)m[2], (short)m[3], (short)m[4],
                                                   (short)m[5], (short)m[6], (short)m[7]));
}

/* Blocks b .. b + n - 1 (n <= 8) of a Q5_0, Q5_1, IQ4_NL or MXFP4 row: nothing past block b + n - 1
 * is read; blocks past n decode as zeros. */
__attribute__((always_inline)) static inline void small_decode(enum block_kind kind, const uint8_t *row, int b, int n,
                                                               struct group8 *g)
{
    const int bytes = kind_bytes(kind);
    struct small_scales sc = {{0}, {0}, {0}};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        g->u[k] = k < n ? small_block(kind, row + (int64_t)(b + k) * bytes, &sc, k) : _mm256_setzero_si256();
    }
    small_scales_set(kind, &sc, g);
}

/* Q4_K's and Q5_K's eight 6-bit scales and minimums (kernel_k_scale_min for j = 0..7) from the 12
 * bytes after d and dmin, as ggml unpacks them: four 32-bit words rearranged so that bytes 0-7 are
 * the scales and bytes 8-15 the minimums. Then s_j = d * (float)sc_j and o_j = -(dmin * (float)m_j). */
__attribute__((always_inline)) static inline void k_scales(const uint8_t *blk, __m256 *s, __m256 *o)
{
    uint32_t u[4];
    memcpy(u, blk + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t mins_low = u[1] & 0x3F3F3F3F;
    u[1] = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = mins_low;
    u[0] &= 0x3F3F3F3F;
    const __m128i bytes = _mm_loadu_si128((const __m128i *)u);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    *s = _mm256_mul_ps(_mm256_set1_ps(half_at(blk)), sc);
    *o = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(half_at(blk + 2)), mn), _mm256_set1_ps(-0.0f));
}

/* A Q4_K or Q5_K superblock: pair i's 32 bytes of qs hold sub-block 2i in their low nibbles and
 * 2i + 1 in their high ones; Q5_K's bit j of qh[l] is bit 4 of sub-block j's value l. */
__attribute__((always_inline)) static inline void k_decode(const uint8_t *blk, int qh5, struct group8 *g)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const uint8_t *qs = blk + (qh5 ? 48 : 16);
    __m256i high = qh5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        __m256i lo = _mm256_and_si256(packed, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
        if (qh5) { /* bits 2i and 2i + 1 of each qh byte, then the next pair down: the 16-bit shift
                    * carries the upper byte's bits into bits 6-7 only, masked off */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 1), one), 4));
            high = _mm256_srli_epi16(high, 2);
        }
        g->u[2 * i] = lo;
        g->u[2 * i + 1] = hi;
    }
    k_scales(blk, &g->sa, &g->oa);
    g->sb = g->sa;
    g->ob = g->oa;
}

/* Sixteen int8 scales, one per 16 values (scale 2j for sub-block j's values 0-15, 2j + 1 for
 * 16-31), as the float vectors lane j = scale 2j (*a) and 2j + 1 (*b). */
__attribute__((always_inline)) static inline void split_scales16(__m128i sc, __m256 *a, __m256 *b)
{
    const __m128i even_odd = _mm_shuffle_epi8(sc, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    *a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(even_odd));
    *b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(even_odd, 8)));
}

/* Q6_K: run j = 4 * half + k; u = the nibble of ql (low for k < 2, from ql + 32 for odd k) with
 * bits 2k, 2k + 1 of qh as bits 4-5: 0..63, the value u - 32. Scales d * (float)sc, sc int8. */
__attribute__((always_inline)) static inline void q6_k_decode(const uint8_t *blk, struct group8 *g)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * half));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * half + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
        /* bits 2k, 2k + 1 of qh moved to bits 4-5 (16-bit shifts: what crosses from the
         * neighbouring byte lands outside bits 4-5 and is masked off) */
        const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), two);
        const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 2), two);
        const __m256i h2 = _mm256_and_si256(qh, two);
        const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), two);
        g->u[4 * half + 0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), h0);
        g->u[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), h1);
        g->u[4 * half + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), h2);
        g->u[4 * half + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), h3);
    }
    __m256 sa, sb;
    split_scales16(_mm_loadu_si128((const __m128i *)(blk + 192)), &sa, &sb);
    const __m256 d = _mm256_set1_ps(half_at(blk + 208));
    g->sa = _mm256_mul_ps(d, sa);
    g->sb = _mm256_mul_ps(d, sb);
}

/* Q3_K: u = the 2 bits (bits 2(j % 4), 2(j % 4) + 1 of qs[32 * (j / 4) + l]) + 4 * (bit j of
 * hmask[l]), 0..7, the value u - 4. Its sixteen 6-bit scales (kernel_q3_k_scale) unpacked as ggml
 * does, four 32-bit words at a time, then minus 32; times d. */
__attribute__((always_inline)) static inline void q3_k_decode(const uint8_t *blk, struct group8 *g)
{
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hmask = _mm256_loadu_si256((const __m256i *)blk);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const int j = 4 * h + k;
            const __m256i crumb = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), three);
            /* bit j of hmask moved to bit 2 (what the 16-bit shift carries across bytes is masked off) */
            const __m256i lift = j >= 2 ? _mm256_srli_epi16(hmask, j - 2) : _mm256_slli_epi16(hmask, 2 - j);
            g->u[j] = _mm256_or_si256(crumb, _mm256_and_si256(lift, four));
        }
    }
    uint32_t a[4];
    memcpy(a, blk + 96, 12);
    const uint32_t tmp = a[2];
    a[2] = ((a[0] >> 4) & 0x0F0F0F0F) | (((tmp >> 4) & 0x03030303) << 4);
    a[3] = ((a[1] >> 4) & 0x0F0F0F0F) | (((tmp >> 6) & 0x03030303) << 4);
    a[0] = (a[0] & 0x0F0F0F0F) | (((tmp >> 0) & 0x03030303) << 4);
    a[1] = (a[1] & 0x0F0F0F0F) | (((tmp >> 2) & 0x03030303) << 4);
    __m256 sa, sb;
    split_scales16(_mm_sub_epi8(_mm_loadu_si128((const __m128i *)a), _mm_set1_epi8(32)), &sa, &sb);
    const __m256 d = _mm256_set1_ps(half_at(blk + 108));
    g->sa = _mm256_mul_ps(d, sa);
    g->sb = _mm256_mul_ps(d, sb);
}

/* Q2_K: u = the 2 bits, 0..3, the value itself; scale byte 2j + h: d * (low nibble) per 16 values,
 * offset -(dmin * (high nibble)). */
__attribute__((always_inline)) static inline void q2_k_decode(const uint8_t *blk, struct group8 *g)
{
    const __m256i three = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            g->u[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), three);
        }
    }
    const __m128i bytes = _mm_loadu_si128((const __m128i *)blk);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    __m256 sca, scb, mna, mnb; /* the nibbles as int8 (0..15) through split_scales16 */
    split_scales16(_mm_and_si128(bytes, low4), &sca, &scb);
    split_scales16(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), &mna, &mnb);
    const __m256 d = _mm256_set1_ps(half_at(blk + 80)), dmin = _mm256_set1_ps(half_at(blk + 82));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    g->sa = _mm256_mul_ps(d, sca);
    g->sb = _mm256_mul_ps(d, scb);
    g->oa = _mm256_xor_ps(_mm256_mul_ps(dmin, mna), sign);
    g->ob = _mm256_xor_ps(_mm256_mul_ps(dmin, mnb), sign);
}

/* IQ4_XS: sub-block j's 16 nibble bytes at qs + 16 j through the table, scale d * (ls_j - 32), ls_j
 * four bits of scales_l[j / 2] and two of scales_h. */
__attribute__((always_inline)) static inline void iq4_xs_decode(const uint8_t *blk, struct group8 *g)
{
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        g->u[j] = iq4_values32(blk + 8 + 16 * j);
    }
    const int scales_h = blk[2] | blk[3] << 8;
    int32_t ls[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
    }
    g->sa = _mm256_mul_ps(_mm256_set1_ps(half_at(blk)), _mm256_cvtepi32_ps(load8_i32(ls)));
    g->sb = g->sa;
}

/* The group of blocks b .. b + n - 1 of a row (b a multiple of 8; n < 8 only for a 32-value
 * type's last group), its weight bytes prefetched ahead. */
__attribute__((always_inline)) static inline void group_decode(enum block_kind kind, const uint8_t *row, int b, int n,
                                                               struct group8 *g)
{
    const int group_bytes = 256 / kind_values(kind) * kind_bytes(kind);
    const uint8_t *blk = row + (int64_t)(b * KERNEL_QK / kind_values(kind)) * kind_bytes(kind); /* its first block */
    prefetch_ahead(blk, (group_bytes + 63) / 64);
    switch (kind) {
    case KIND_Q5_0:
    case KIND_Q5_1:
    case KIND_IQ4_NL:
    case KIND_MXFP4: small_decode(kind, row, b, n, g); break;
    case KIND_Q4_K: k_decode(blk, 0, g); break;
    case KIND_Q5_K: k_decode(blk, 1, g); break;
    case KIND_Q6_K: q6_k_decode(blk, g); break;
    case KIND_Q3_K: q3_k_decode(blk, g); break;
    case KIND_Q2_K: q2_k_decode(blk, g); break;
    case KIND_IQ4_XS: iq4_xs_decode(blk, g); break;
    }
}

/* The terms of a group of blocks from their integer products v (kind_dot's; lane k = block b + k),
 * each the contract's formula in its order (kernel_unpacked_term); lanes past n are -0.0f, which
 * leaves a partial as it was.
 *   one scale:  (float)isum * (s * x_d) [+ (float)xsum * (o * x_d)]
 *   two scales: (float)isum_a * (s_a * x_d) + (float)isum_b * (s_b * x_d)
 *               [+ (float)xsum_a * (o_a * x_d)] [+ (float)xsum_b * (o_b * x_d)] */
__attribute__((always_inline)) static inline __m256 dots_terms(enum block_kind kind, const __m256i v[8],
                                                               const struct group8 *g, const float *x_d,
                                                               const struct block_input *in, int b, int n)
{
    const int shift = kind_bias_shift(kind);
    const __m256i mask = lane_mask(n);
    const __m256 xd = n == 8 ? _mm256_loadu_ps(x_d + b) : _mm256_maskload_ps(x_d + b, mask);
    __m256 terms;
    if (kind_two_scales(kind)) {
        __m256i ia, ib;
        half_sums8(v, &ia, &ib);
        if (shift) {
            ia = _mm256_sub_epi32(ia, _mm256_slli_epi32(load8_i32(in->lo + b), shift));
            ib = _mm256_sub_epi32(ib, _mm256_slli_epi32(load8_i32(in->hi + b), shift));
        }
        terms = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(g->sa, xd)),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(g->sb, xd)));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->lo + b)), _mm256_mul_ps(g->oa, xd)));
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->hi + b)), _mm256_mul_ps(g->ob, xd)));
        }
    } else {
        __m256i isums = kind_int16_sums(kind) ? pair_sums8(v) : block_sums8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        if (shift) {
            isums = _mm256_sub_epi32(isums, _mm256_slli_epi32(load8_i32(in->sum + b), shift));
        }
        terms = _mm256_mul_ps(_mm256_cvtepi32_ps(isums), _mm256_mul_ps(g->sa, xd));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(in->sum + b)), _mm256_mul_ps(g->oa, xd)));
        }
    }
    if (n < 8) {
        terms = _mm256_blendv_ps(_mm256_set1_ps(-0.0f), terms, _mm256_castsi256_ps(mask));
    }
    return terms;
}

/* Block k's quants (or table values) times token's x: 16 int16 pair sums for the kinds of
 * kind_int16_sums (pairs_block's), 8 int32 lanes for the others (dot_block's); dots_terms totals
 * either. */
__attribute__((always_inline)) static inline __m256i kind_dot(enum block_kind kind, __m256i u, const int8_t *x)
{
    if (kind_int16_sums(kind)) {
        return kind_signed(kind) ? pairs_block_signed(u, x) : pairs_block(u, x);
    }
    return kind_signed(kind) ? dot_block_signed(u, x) : dot_block(u, x);
}

/* A decoded group's terms against one token's input (x_qs, x_d, its sums). */
__attribute__((always_inline)) static inline __m256 group_terms(enum block_kind kind, const struct group8 *g,
                                                                const int8_t *x_qs, const float *x_d,
                                                                const struct block_input *in, int b, int n)
{
    __m256i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        v[k] = k < n ? kind_dot(kind, g->u[k], x_qs + (b + k) * KERNEL_QK) : _mm256_setzero_si256();
    }
    return dots_terms(kind, v, g, x_d, in, b, n);
}

/* The same terms for a 32-value type's group in the matvec, each block multiplied as soon as it
 * is decoded: holding eight decoded blocks for the product spilled them to the stack, and Q5_0
 * (rows of 640 values in the Gemma 3 270M file) ran slower per value than q8_0. */
__attribute__((always_inline)) static inline __m256 small_group_terms(enum block_kind kind, const uint8_t *row,
                                                                      const int8_t *x_qs, const float *x_d,
                                                                      const struct block_input *in, int b, int n)
{
    const int bytes = kind_bytes(kind);
    prefetch_ahead(row + (int64_t)b * bytes, (8 * bytes + 63) / 64);
    struct small_scales sc = {{0}, {0}, {0}};
    __m256i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        v[k] = k < n ? kind_dot(kind, small_block(kind, row + (int64_t)(b + k) * bytes, &sc, k), x_qs + (b + k) * KERNEL_QK)
                     : _mm256_setzero_si256();
    }
    struct group8 g;
    small_scales_set(kind, &sc, &g);
    return dots_terms(kind, v, &g, x_d, in, b, n);
}

/* One row's eight partials: group after group, in block order. */
__attribute__((always_inline)) static inline __m256 row_group(enum block_kind kind, __m256 acc, const uint8_t *row,
                                                              const int8_t *x_qs, const float *x_d,
                                                              const struct block_input *in, int b, int n)
{
    if (kind_values(kind) == 32) {
        return _mm256_add_ps(acc, small_group_terms(kind, row, x_qs, x_d, in, b, n));
    }
    struct group8 g;
    group_decode(kind, row, b, n, &g);
    return _mm256_add_ps(acc, group_terms(kind, &g, x_qs, x_d, in, b, n));
}

__attribute__((always_inline)) static inline __m256 blocks_row(enum block_kind kind, const uint8_t *row,
                                                               const int8_t *x_qs, const float *x_d,
                                                               const struct block_input *in, int nb)
{
    __m256 acc = _mm256_set1_ps(-0.0f);
    int b = 0;
    for (; b + 8 <= nb; b += 8) {
        acc = row_group(kind, acc, row, x_qs, x_d, in, b, 8);
    }
    /* A 32-value type's last 1-7 blocks (a superblock type has none), their count a constant in
     * each case: a variable count cost a branch per block, and rows of 640 values (20 blocks, the
     * Gemma 3 270M shape) ran at 2/3 of the speed of rows of 2048. */
    switch (kind_values(kind) == 32 ? nb - b : 0) {
    case 1: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 1); break;
    case 2: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 2); break;
    case 3: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 3); break;
    case 4: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 4); break;
    case 5: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 5); break;
    case 6: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 6); break;
    case 7: acc = row_group(kind, acc, row, x_qs, x_d, in, b, 7); break;
    default: break;
    }
    return acc;
}

/* A kept GGUF type's matvec: eight rows at a time (a short last group repeats its first row,
 * computed and dropped), each row's blocks streamed in order, the eight rows' partials combined by
 * sum_partials8 (the tree of kernels.h). cols / 32 <= MAX_BLOCKS. */
__attribute__((always_inline)) static inline void blocks_matvec(enum block_kind kind, float *out, const uint8_t *w,
                                                                const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    struct block_input in;
    block_input_prepare(&in, x_qs, nb);
    for (int r = 0; r < rows; r += 8) {
        const int n = rows - r < 8 ? rows - r : 8;
        int row[8];
        group_rows8(row, r, n);
        __m256 acc[8];
        for (int i = 0; i < 8; i++) {
            acc[i] = blocks_row(kind, w + (int64_t)row[i] * row_bytes, x_qs, x_d, &in, nb);
        }
        store_rows(out + r, sum_partials8(acc), n);
    }
}

/* Batched (prefill): each weight row is read and decoded once per pass of up to BLOCKS_TOKENS
 * tokens, and every group of it, once decoded, serves all of them: token t's eight partials are
 * acc[t] (lane k = partial k), the same additions in the same order as the matvec's, so the same
 * bits; eight tokens' partials are combined together by sum_partials8 (lane t = token t). A pass's
 * token count is rounded up to eight with repeats of its first token (computed and dropped). */
#define BLOCKS_TOKENS 16

struct blocks_batch {
    struct block_input in[BLOCKS_TOKENS];
};

/* One per thread: each thread of the pool runs the kernel on its own rows. */
static _Thread_local struct blocks_batch blocks_batch;

/* Blocks b .. b + n - 1 of a row decoded once, their terms added to every token's partials. */
__attribute__((always_inline)) static inline void matmul_group(enum block_kind kind, __m256 *acc, int lanes,
                                                               const uint8_t *row, int b, int n,
                                                               const int8_t *const *xq, const float *const *xd,
                                                               const struct block_input *in)
{
    struct group8 g;
    group_decode(kind, row, b, n, &g);
    for (int t = 0; t < lanes; t++) {
        acc[t] = _mm256_add_ps(acc[t], group_terms(kind, &g, xq[t], xd[t], &in[t], b, n));
    }
}

__attribute__((always_inline)) static inline void blocks_matmul(enum block_kind kind, float *out, int out_stride,
                                                                const uint8_t *w, const int8_t *x_qs, const float *x_d,
                                                                int n_tok, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    struct blocks_batch *bt = &blocks_batch;
    for (int t0 = 0; t0 < n_tok; t0 += BLOCKS_TOKENS) {
        const int nt = n_tok - t0 < BLOCKS_TOKENS ? n_tok - t0 : BLOCKS_TOKENS;
        const int lanes = (nt + 7) / 8 * 8;
        const int8_t *xq[BLOCKS_TOKENS];
        const float *xd[BLOCKS_TOKENS];
        for (int t = 0; t < lanes; t++) {
            const int tok = t0 + (t < nt ? t : 0);
            xq[t] = x_qs + (int64_t)tok * cols;
            xd[t] = x_d + (int64_t)tok * nb;
            block_input_prepare(&bt->in[t], xq[t], nb);
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w + (int64_t)r * row_bytes;
            __m256 acc[BLOCKS_TOKENS];
            for (int t = 0; t < lanes; t++) {
                acc[t] = _mm256_set1_ps(-0.0f);
            }
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                matmul_group(kind, acc, lanes, row, b, 8, xq, xd, bt->in);
            }
            switch (kind_values(kind) == 32 ? nb - b : 0) { /* the last 1-7 blocks, as blocks_row's */
            case 1: matmul_group(kind, acc, lanes, row, b, 1, xq, xd, bt->in); break;
            case 2: matmul_group(kind, acc, lanes, row, b, 2, xq, xd, bt->in); break;
            case 3: matmul_group(kind, acc, lanes, row, b, 3, xq, xd, bt->in); break;
            case 4: matmul_group(kind, acc, lanes, row, b, 4, xq, xd, bt->in); break;
            case 5: matmul_group(kind, acc, lanes, row, b, 5, xq, xd, bt->in); break;
            case 6: matmul_group(kind, acc, lanes, row, b, 6, xq, xd, bt->in); break;
            case 7: matmul_group(kind, acc, lanes, row, b, 7, xq, xd, bt->in); break;
            default: break;
            }
            for (int t = 0; t < lanes; t += 8) {
                float sums[8];
                _mm256_storeu_ps(sums, sum_partials8(acc + t));
                for (int i = 0; i < 8 && t + i < nt; i++) {
                    out[(int64_t)(t0 + t + i) * out_stride + r] = sums[i];
                }
            }
        }
    }
}

/* Batched (prefill) from eight tokens on, the unsigned types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K,
 * Q2_K: u <= 63): x86_avx2.c's lanes layout for the GGUF blocks. The tokens of a pass are laid out
 * once (lanes_block: lane t = token t, with each token's half-block sums); the rows of a tile are
 * decoded once per pass into their bytes u (group_decode's) and each block's float32 scales and
 * offsets; then, for each group of eight tokens, four rows' block sums accumulate with a row's four
 * bytes broadcast to every lane (vpdpbusd, or maddubs + madd), a block's two halves apart for the
 * two-scale types. Each lane's terms are dots_terms's formula in its order and go to the partials
 * of the reduction tree as the matvec's do (block b -> partial b % 8, then the sequential combine),
 * so every token gets the matvec's bits; no horizontal sums are left. The per-token kernel above
 * (blocks_matmul) keeps the short batches and the signed types (IQ4's and MXFP4's table values). */
#define BLOCKS_LANES_FROM 8        /* tokens: fewer leave lanes idle, and blocks_matmul takes them */
#define BLOCKS_LANE_TOKENS 32      /* tokens per pass; longer batches take several */
#define BLOCKS_LANE_TILE_BYTES 16384 /* decoded bytes of a row tile, kept in L1 while every token passes */
#define BLOCKS_LANE_TILE_MAX (4 * MAX_BLOCKS * KERNEL_QK > BLOCKS_LANE_TILE_BYTES ? 4 * MAX_BLOCKS * KERNEL_QK \
                                                                                  : BLOCKS_LANE_TILE_BYTES)

struct blocks_lanes {
    int8_t xt[BLOCKS_LANE_TOKENS * MAX_BLOCKS * KERNEL_QK]; /* group g, block b: eight steps of 8 tokens x 4 values */
    float xd[BLOCKS_LANE_TOKENS * MAX_BLOCKS];              /* group g, block b: 8 tokens' x_d */
    int32_t lo[BLOCKS_LANE_TOKENS * MAX_BLOCKS];            /* and their quant sums of values 0-15, */
    int32_t hi[BLOCKS_LANE_TOKENS * MAX_BLOCKS];            /* 16-31, */
    int32_t sum[BLOCKS_LANE_TOKENS * MAX_BLOCKS];           /* and all 32 */
    uint8_t u[BLOCKS_LANE_TILE_MAX];                        /* the tile's decoded bytes, row after row */
    float scales[BLOCKS_LANE_TILE_MAX / KERNEL_QK * 4];     /* per block of the tile: sa, sb, oa, ob */
};

_Static_assert(sizeof(struct blocks_lanes) <= X86_LANES_SCRATCH_BYTES, "the layout fits the set's lanes scratch");

/* Tokens t0 .. t0 + nt - 1 laid out; a short last group repeats its first token (computed and
 * dropped). */
static void blocks_lanes_tokens(struct blocks_lanes *bt, const int8_t *x_qs, const float *x_d, int t0, int nt, int nb)
{
    for (int g = 0; g * 8 < nt; g++) {
        const int8_t *x[8];
        lanes_group_inputs(x, bt->xd + (int64_t)g * nb * 8, x_qs, x_d, t0, nt, g, nb);
        for (int b = 0; b < nb; b++) {
            const int64_t gb = (int64_t)g * nb + b;
            __m256i lo, hi;
            lanes_block(bt->xt + gb * 8 * 32, x, b, &lo, &hi);
            _mm256_storeu_si256((__m256i *)(bt->lo + gb * 8), lo);
            _mm256_storeu_si256((__m256i *)(bt->hi + gb * 8), hi);
            _mm256_storeu_si256((__m256i *)(bt->sum + gb * 8), _mm256_add_epi32(lo, hi));
        }
    }
}

/* Rows r .. r + n - 1 decoded: their bytes u in value order and each block's sa, sb, oa, ob. */
__attribute__((always_inline)) static inline void blocks_lanes_rows(struct blocks_lanes *bt, enum block_kind kind,
                                                                    const uint8_t *w, int64_t row_bytes, int r, int n,
                                                                    int nb)
{
    for (int i = 0; i < n; i++) {
        const uint8_t *row = w + (int64_t)(r + i) * row_bytes;
        for (int b = 0; b < nb; b += 8) {
            const int m = nb - b < 8 ? nb - b : 8; /* below 8 only for a 32-value type's last group */
            struct group8 g;
            group_decode(kind, row, b, m, &g);
            float sa[8], sb[8], oa[8] = {0}, ob[8] = {0}; /* the offsets: the affine types' only */
            _mm256_storeu_ps(sa, g.sa);
            _mm256_storeu_ps(sb, g.sb);
            if (kind_affine(kind)) {
                _mm256_storeu_ps(oa, g.oa);
                _mm256_storeu_ps(ob, g.ob);
            }
            for (int k = 0; k < m; k++) {
                const int64_t blk = (int64_t)i * nb + b + k;
                _mm256_storeu_si256((__m256i *)(bt->u + blk * KERNEL_QK), g.u[k]);
                float *s = bt->scales + blk * 4;
                s[0] = sa[k], s[1] = sb[k], s[2] = oa[k], s[3] = ob[k];
            }
        }
    }
}

/* Block b's term for the eight tokens of a group (lane t), from its half sums ia, ib: dots_terms's
 * formula lane by lane, s = the block's sa, sb, oa, ob. */
__attribute__((always_inline)) static inline __m256 lanes_term(enum block_kind kind, __m256i ia, __m256i ib,
                                                               const float *s, __m256 xd, const int32_t *lo,
                                                               const int32_t *hi, const int32_t *sum)
{
    const int shift = kind_bias_shift(kind);
    if (kind_two_scales(kind)) {
        if (shift) {
            ia = _mm256_sub_epi32(ia, _mm256_slli_epi32(load8_i32(lo), shift));
            ib = _mm256_sub_epi32(ib, _mm256_slli_epi32(load8_i32(hi), shift));
        }
        __m256 terms = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(_mm256_set1_ps(s[0]), xd)),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(_mm256_set1_ps(s[1]), xd)));
        if (kind_affine(kind)) {
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(lo)),
                                                       _mm256_mul_ps(_mm256_set1_ps(s[2]), xd)));
            terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(hi)),
                                                       _mm256_mul_ps(_mm256_set1_ps(s[3]), xd)));
        }
        return terms;
    }
    __m256i isum = _mm256_add_epi32(ia, ib);
    if (shift) {
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(load8_i32(sum), shift));
    }
    __m256 terms = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(s[0]), xd));
    if (kind_affine(kind)) {
        terms = _mm256_add_ps(terms, _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(sum)),
                                                   _mm256_mul_ps(_mm256_set1_ps(s[2]), xd)));
    }
    return terms;
}

/* R (1 or 4) decoded rows against one group of eight tokens (gb: the group's first block index). */
__attribute__((always_inline)) static inline void blocks_lanes_group(float *out, int out_stride, int n_valid,
                                                                     const struct blocks_lanes *bt, enum block_kind kind,
                                                                     int vnni, int r, int64_t gb, int nb, int R)
{
    const int cols = nb * KERNEL_QK;
    __m256 part[4][8];
    for (int i = 0; i < R; i++) {
        for (int k = 0; k < 8; k++) {
            part[i][k] = _mm256_set1_ps(-0.0f);
        }
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *ub = bt->u + (int64_t)r * cols + b * KERNEL_QK;
        const int8_t *xb = bt->xt + (gb + b) * 8 * 32;
        /* named, to stay in registers: row i's sums of the block's values 0-15 (lo_i) and 16-31 (hi_i) */
        __m256i lo0 = _mm256_setzero_si256(), lo1 = lo0, lo2 = lo0, lo3 = lo0;
        __m256i hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i xl = _mm256_loadu_si256((const __m256i *)(xb + 32 * k));
            const __m256i xh = _mm256_loadu_si256((const __m256i *)(xb + 32 * (k + 4)));
            lo0 = lanes_step(lo0, bcast4(ub + 4 * k), xl, vnni);
            hi0 = lanes_step(hi0, bcast4(ub + 16 + 4 * k), xh, vnni);
            if (R == 4) {
                lo1 = lanes_step(lo1, bcast4(ub + cols + 4 * k), xl, vnni);
                hi1 = lanes_step(hi1, bcast4(ub + cols + 16 + 4 * k), xh, vnni);
                lo2 = lanes_step(lo2, bcast4(ub + 2 * cols + 4 * k), xl, vnni);
                hi2 = lanes_step(hi2, bcast4(ub + 2 * cols + 16 + 4 * k), xh, vnni);
                lo3 = lanes_step(lo3, bcast4(ub + 3 * cols + 4 * k), xl, vnni);
                hi3 = lanes_step(hi3, bcast4(ub + 3 * cols + 16 + 4 * k), xh, vnni);
            }
        }
        const __m256i lo[4] = {lo0, lo1, lo2, lo3}, hi[4] = {hi0, hi1, hi2, hi3};
        const __m256 xd = _mm256_loadu_ps(bt->xd + (gb + b) * 8);
        const int32_t *tlo = bt->lo + (gb + b) * 8, *thi = bt->hi + (gb + b) * 8, *tsum = bt->sum + (gb + b) * 8;
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const float *s = bt->scales + ((int64_t)(r + i) * nb + b) * 4;
            part[i][b % 8] = _mm256_add_ps(part[i][b % 8], lanes_term(kind, lo[i], hi[i], s, xd, tlo, thi, tsum));
        }
    }
    lanes_store_rows(out, out_stride, n_valid, part, R);
}

__attribute__((always_inline)) static inline void blocks_lanes(enum block_kind kind, int vnni, float *out,
                                                               int out_stride, const uint8_t *w, const int8_t *x_qs,
                                                               const float *x_d, int n_tok, int rows, int cols)
{
    struct blocks_lanes *bt = x86_lanes_scratch(); /* this thread's, shared with x86_avx2.c's lanes kernel */
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / kind_values(kind)) * kind_bytes(kind);
    int tile = BLOCKS_LANE_TILE_BYTES / cols / 4 * 4;
    tile = tile < 4 ? 4 : tile;
    for (int t0 = 0; t0 < n_tok; t0 += BLOCKS_LANE_TOKENS) {
        const int nt = n_tok - t0 < BLOCKS_LANE_TOKENS ? n_tok - t0 : BLOCKS_LANE_TOKENS;
        blocks_lanes_tokens(bt, x_qs, x_d, t0, nt, nb);
        for (int r0 = 0; r0 < rows; r0 += tile) {
            const int nr = rows - r0 < tile ? rows - r0 : tile;
            blocks_lanes_rows(bt, kind, w, row_bytes, r0, nr, nb);
            for (int g = 0; g * 8 < nt; g++) {
                const int n_valid = nt - 8 * g < 8 ? nt - 8 * g : 8;
                float *o = out + (int64_t)(t0 + 8 * g) * out_stride + r0;
                int r = 0;
                for (; r + 4 <= nr; r += 4) {
                    blocks_lanes_group(o + r, out_stride, n_valid, bt, kind, vnni, r, (int64_t)g * nb, nb, 4);
                }
                for (; r < nr; r++) {
                    blocks_lanes_group(o + r, out_stride, n_valid, bt, kind, vnni, r, (int64_t)g * nb, nb, 1);
                }
            }
        }
    }
}

/* The batched product of a kept type: the lanes kernel from BLOCKS_LANES_FROM tokens on for the
 * unsigned types (each way to vpdpbusd compiled apart), the per-token one otherwise. */
__attribute__((always_inline)) static inline void blocks_batched(enum block_kind kind, float *out, int out_stride,
                                                                 const uint8_t *w, const int8_t *x_qs, const float *x_d,
                                                                 int n_tok, int rows, int cols)
{
    if (n_tok < BLOCKS_LANES_FROM || kind_signed(kind)) {
        blocks_matmul(kind, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
        return;
    }
    switch (x86_avx2_vnni()) {
    case KERNEL_VNNI_VEX: blocks_lanes(kind, KERNEL_VNNI_VEX, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    case KERNEL_VNNI_EVEX: blocks_lanes(kind, KERNEL_VNNI_EVEX, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    default: blocks_lanes(kind, 0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols); break;
    }
}

/* Each kept type's own kernels, compiled with its kind a constant. */
static void matvec_q5_0_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_0, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q5_0_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q5_1_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_1, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q5_1_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q4_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q4_K, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q4_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q4_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q5_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q5_K, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q5_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q5_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q6_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q6_K, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q6_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q6_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q3_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q3_K, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q3_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q3_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_q2_k_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_Q2_K, out, w, x_qs, x_d, rows, cols);
}

static void matmul_q2_k_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_batched(KIND_Q2_K, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_iq4_nl_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_IQ4_NL, out, w, x_qs, x_d, rows, cols);
}

static void matmul_iq4_nl_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_matmul(KIND_IQ4_NL, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_mxfp4_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_MXFP4, out, w, x_qs, x_d, rows, cols);
}

static void matmul_mxfp4_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                              int rows, int cols)
{
    blocks_matmul(KIND_MXFP4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

static void matvec_iq4_xs_avx2(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    blocks_matvec(KIND_IQ4_XS, out, w, x_qs, x_d, rows, cols);
}

static void matmul_iq4_xs_avx2(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                           int rows, int cols)
{
    blocks_matmul(KIND_IQ4_XS, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* The kept GGUF types: the AVX2 kernel when the CPU has it and a row fits the activation sums'
 * arrays (16384 values), the scalar reference otherwise. */
static int blocks_avx2(int cols)
{
    return x86_avx2_usable() && cols / KERNEL_QK <= MAX_BLOCKS;
}

/* A batched product the AVX2 kernel does not take (rows of more than 16384 values): the matvec,
 * the scalar reference there, once per token. */
static void matmul_by_token(KernelBlocksMatvec matvec, float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                            const float *x_d, int n_tok, int rows, int cols)
{
    for (int t = 0; t < n_tok; t++) {
        matvec(out + (int64_t)t * out_stride, w, x_qs + (int64_t)t * cols, x_d + (int64_t)t * (cols / KERNEL_QK), rows, cols);
    }
}

void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_0_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_0(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_1_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q4_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q5_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q6_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q6_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q3_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q3_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_q2_k_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_iq4_nl_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_iq4_nl(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_iq4_xs_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_iq4_xs(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_0(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_0_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_0, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_1(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_1_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_1, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q4_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q4_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q4_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q5_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q5_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q5_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q6_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q6_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q6_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q3_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q3_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q3_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_q2_k(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_q2_k_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_q2_k, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_iq4_nl(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_iq4_nl_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_iq4_nl, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_iq4_xs(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_iq4_xs_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_iq4_xs, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}

void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    if (blocks_avx2(cols)) {
        matvec_mxfp4_avx2(out, w, x_qs, x_d, rows, cols);
    } else {
        kernel_scalar_matvec_mxfp4(out, w, x_qs, x_d, rows, cols);
    }
}

void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                         int rows, int cols)
{
    if (n_tok == 1) {
        kernel_matvec_mxfp4(out, w, x_qs, x_d, rows, cols);
    } else if (blocks_avx2(cols)) {
        matmul_mxfp4_avx2(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        matmul_by_token(kernel_matvec_mxfp4, out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    }
}
