/* The arm_neon set's kernels for the kept GGUF block types: each type decoded into int8 vectors
 * and float scales, its matvec and its batched product, and their entry points. */
#include "arm_neon.h"

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
 * product is the matvec. Each type has its SDOT instances of blocks_matvec and blocks_matmul
 * (compiled for the extension) and two entries, which the two functions below make: inlined into
 * each, with the type a constant, they are that type's own code. */

typedef void (*BlocksMatmul)(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                             int n_tok, int rows, int cols);

static inline __attribute__((always_inline)) void blocks_matvec_entry(int type, KernelBlocksMatvec matvec_dotprod,
                                                                      KernelBlocksMatvec scalar, float *out,
                                                                      const uint8_t *w, const int8_t *x_qs,
                                                                      const float *x_d, int rows, int cols)
{
    if (blocks_affine(type) && cols / KERNEL_QK > BLOCKS_ROW_MAX) {
        scalar(out, w, x_qs, x_d, rows, cols);
    } else if (arm_neon_have_dotprod()) {
        matvec_dotprod(out, w, x_qs, x_d, rows, cols);
    } else {
        blocks_matvec(type, out, w, x_qs, x_d, rows, cols, 0);
    }
}

static inline __attribute__((always_inline)) void blocks_matmul_entry(int type, BlocksMatmul matmul_dotprod,
                                                                      KernelBlocksMatvec matvec, float *out,
                                                                      int out_stride, const uint8_t *w,
                                                                      const int8_t *x_qs, const float *x_d,
                                                                      int n_tok, int rows, int cols)
{
    if (n_tok == 1 || (blocks_affine(type) && cols / KERNEL_QK > BLOCKS_ROW_MAX)) {
        arm_neon_tiled_matmul_blocks(matvec, (int64_t)(cols / blocks_values(type)) * blocks_bytes(type), out,
                                     out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else if (arm_neon_have_dotprod()) {
        matmul_dotprod(out, out_stride, w, x_qs, x_d, n_tok, rows, cols);
    } else {
        blocks_matmul(type, out, out_stride, w, x_qs, x_d, n_tok, rows, cols, 0);
    }
}

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
    blocks_matvec_entry(BLOCKS_Q5_0, matvec_q5_0_dotprod, kernel_scalar_matvec_q5_0, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q5_0, matmul_q5_0_dotprod, kernel_matvec_q5_0, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q5_1, matvec_q5_1_dotprod, kernel_scalar_matvec_q5_1, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q5_1, matmul_q5_1_dotprod, kernel_matvec_q5_1, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q4_K, matvec_q4_k_dotprod, kernel_scalar_matvec_q4_k, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q4_K, matmul_q4_k_dotprod, kernel_matvec_q4_k, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q5_K, matvec_q5_k_dotprod, kernel_scalar_matvec_q5_k, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q5_K, matmul_q5_k_dotprod, kernel_matvec_q5_k, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q6_K, matvec_q6_k_dotprod, kernel_scalar_matvec_q6_k, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q6_K, matmul_q6_k_dotprod, kernel_matvec_q6_k, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q3_K, matvec_q3_k_dotprod, kernel_scalar_matvec_q3_k, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q3_K, matmul_q3_k_dotprod, kernel_matvec_q3_k, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_Q2_K, matvec_q2_k_dotprod, kernel_scalar_matvec_q2_k, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                        int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_Q2_K, matmul_q2_k_dotprod, kernel_matvec_q2_k, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_IQ4_NL, matvec_iq4_nl_dotprod, kernel_scalar_matvec_iq4_nl, out, w, x_qs,
                        x_d, rows, cols);
}

void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                          int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_IQ4_NL, matmul_iq4_nl_dotprod, kernel_matvec_iq4_nl, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_MXFP4, matvec_mxfp4_dotprod, kernel_scalar_matvec_mxfp4, out, w, x_qs, x_d, rows, cols);
}

void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                         int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_MXFP4, matmul_mxfp4_dotprod, kernel_matvec_mxfp4, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
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
    blocks_matvec_entry(BLOCKS_IQ4_XS, matvec_iq4_xs_dotprod, kernel_scalar_matvec_iq4_xs, out, w, x_qs,
                        x_d, rows, cols);
}

void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d,
                          int n_tok, int rows, int cols)
{
    blocks_matmul_entry(BLOCKS_IQ4_XS, matmul_iq4_xs_dotprod, kernel_matvec_iq4_xs, out, out_stride, w, x_qs, x_d,
                        n_tok, rows, cols);
}
