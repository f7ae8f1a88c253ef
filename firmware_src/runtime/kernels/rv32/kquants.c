/* The rv32 set's K-quant products (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K), the GGUF superblocks read in
 * place, two or four rows at once, with the scalar kernel's bits. */
#include "rv32.h"

/* The sum of every 16 activation quants, as activation_sums (rv32.h) of every 32 (Q6_K's scales
 * cover 16 values). */
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
 * 1 KiB tables (rv32_q5k_quants: low value at [index], high at [1024 + index], one add of the table's
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

/* [b << 8 | byte]: the low nibble plus 16 times bit 0 of b; then [1024 + (b << 8 | byte)]: the
 * high nibble plus 16 times bit 1 of b. */
const uint8_t rv32_q5k_quants[2048] = {
    NIBBLE_X16(Q5K_SEQ16(0)), NIBBLE_X16(Q5K_SEQ16(16)), NIBBLE_X16(Q5K_SEQ16(0)), NIBBLE_X16(Q5K_SEQ16(16)),
    Q5K_EACH16(0),            Q5K_EACH16(0),             Q5K_EACH16(16),           Q5K_EACH16(16),
};

#define Q5K_ROW(r, l)                                                                \
    do {                                                                             \
        const int32_t h = q##r[(l) - 32 * (i + 1)];                                  \
        const uint8_t *t = rv32_q5k_quants + (q##r[l] | ((h << (8 - 2 * i)) & 0x300));    \
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
