/* The rv32 set's products of the other kept GGUF block types (Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4),
 * read in place four rows at once, with the scalar kernel's bits. */
#include "rv32.h"

/* Q5_0 and Q5_1 read in place, four rows at once. Byte j of a block's qs holds the nibbles of
 * values j and j + 16, whose fifth bits are bits j and j + 16 of qh; interleaved once per block and
 * row (bit j to 2j, bit j + 16 to 2j + 1: q5_pair_bits, through a 512-byte table), the two bits of byte j sit side by side,
 * and one shift and one andi put them beside the byte as bits 8 and 9: the index of both 5-bit
 * quants in Q5_K's tables (rv32_q5k_quants, kquants.c). So a byte's two multiply-adds cost lbu, slli, andi, or, add,
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
        const uint8_t *t = rv32_q5k_quants + (p##r[j] | ((z##r << (8 - 2 * (j))) & 0x300)); \
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
