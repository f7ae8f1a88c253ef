/* The kept GGUF block types of the x86_avx2 set (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL,
 * IQ4_XS, MXFP4) decoded, eight 32-value blocks at a time (a superblock, or eight blocks of a
 * 32-value type), into 32 bytes per block in value order and each block's float32 scales and
 * offsets: what blocks.c's matvec and per-token batches and blocks_lanes.c's lanes kernel multiply.
 * Static inline, in this header's own AVX2 region (x86_avx2.h). */
#ifndef COLIBRI_KERNELS_X86_AVX2_BLOCKS_H
#define COLIBRI_KERNELS_X86_AVX2_BLOCKS_H

#include "x86_avx2.h"

X86_AVX2_BEGIN /* from here to X86_AVX2_END: compiled for AVX2 and F16C */

__attribute__((always_inline)) static inline __m256i load8_i32(const int32_t *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* The binary16 at p (any alignment) widened by F16C: the same float as kernel_half_at. */
__attribute__((always_inline)) static inline float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
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


/* Batched (prefill) from BLOCKS_LANES_FROM tokens on, the unsigned kept types: blocks_lanes.c's
 * lanes kernel (blocks.c's blocks_batched takes the rest, and fewer tokens). */
#define BLOCKS_LANES_FROM 8 /* tokens: fewer leave lanes idle, and blocks_matmul takes them */
void blocks_lanes_batched(enum block_kind kind, float *out, int out_stride, const uint8_t *w, const int8_t *x_qs,
                          const float *x_d, int n_tok, int rows, int cols);

X86_AVX2_END

#endif
