/* The rv32 set's quantized matrix-vector products: q8_0 (sixteen rows at once for 64- and
 * 128-column matrices, else eight, four and one) and q4_1 read in place (eight and four rows at
 * once), each row's binary16 scales widened by half_scaled (rv32.h). */
#include "rv32.h"

/* xs[b] = x_d[b] * 2^112 for the nb blocks; 0 if some block's X_b would not be exact. */
static int prescale(float *xs, const float *x_d, int nb)
{
    int exact = 1;
    for (int b = 0; b < nb; b++) {
        exact &= fabsf(x_d[b]) < 0x1p16f;
        xs[b] = x_d[b] * 0x1p112f;
    }
    return exact;
}

/* v, which the compiler cannot see through (an empty asm statement that might change it): a row
 * pass walks its rows' scales with one pointer and this stride, an add per row, where GCC would
 * otherwise keep one induction variable per row and spill them. */
static inline int opaque(int v)
{
    __asm__("" : "+r"(v));
    return v;
}

/* Every row's accumulator starts at -0.0f and every block term is added to it: -0.0f + t == t
 * for every float t (+0.0f included), so this is the scalar kernel's "first term is the initial
 * value" without a branch. (The 16-row passes start from their first terms instead.) */
#define ACC_START (-0.0f)

/* How many partial sums a row pass keeps: the reduction tree's eight (kernels.h), except for rows
 * of at most eight blocks, where each partial holds one block and the tree is the sequential sum:
 * one partial then, its blocks in order, and the pass sets up its loop once instead of per block. */
static inline int row_parts(int nb)
{
    return nb <= KERNEL_PARTIALS ? 1 : KERNEL_PARTIALS;
}

/* One row: the reduction tree (kernels.h) as two loops: partial k sums the blocks k, k + 8, ...
 * in order, and is then added to the row's total. Rows of at most 8 blocks run each inner loop
 * once, which is the plain sequential sum. */
static void one_row(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs, const float *xs, int nb)
{
    float total = ACC_START;
    for (int k = 0; k < nb && k < KERNEL_PARTIALS; k++) {
        float acc = ACC_START;
        for (int b = k; b < nb; b += KERNEL_PARTIALS) {
            int32_t s = 0;
            for (int i = 0; i < KERNEL_QK; i++) {
                s += (int32_t)w[b * KERNEL_QK + i] * (int32_t)x_qs[b * KERNEL_QK + i];
            }
            acc = acc + (float)s * (half_scaled(wd[b]) * xs[b]);
        }
        total = total + acc;
    }
    *out = total;
}

/* Eight rows side by side: one load of each activation quant serves eight products, and each
 * row keeps its own int32 block sum and float accumulator. Written out row by row (no arrays),
 * so that GCC keeps all of it in registers; the rows' scales are reached by one pointer stepping
 * nb halves (opaque), the partial sums as row_parts says. 3.67 instructions per multiply-add at
 * 32x288 (nine blocks: eight partials, each set up on its own), 3.62 with float32 scales. */
#define MAC8(i)                                                                                     \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p0[i] * xi;                                                                           \
        s1 += p1[i] * xi;                                                                           \
        s2 += p2[i] * xi;                                                                           \
        s3 += p3[i] * xi;                                                                           \
        s4 += p4[i] * xi;                                                                           \
        s5 += p5[i] * xi;                                                                           \
        s6 += p6[i] * xi;                                                                           \
        s7 += p7[i] * xi;                                                                           \
    } while (0)

__attribute__((noinline)) static void rows8(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs,
                                            const float *xs, int cols)
{
    const int nb = cols / KERNEL_QK;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    float t4 = ACC_START, t5 = ACC_START, t6 = ACC_START, t7 = ACC_START;
    /* partial k of every row: blocks k, k + parts, ... (the reduction tree, kernels.h) */
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const int8_t *p0 = w + k * KERNEL_QK, *p1 = p0 + cols, *p2 = p1 + cols, *p3 = p2 + cols;
        const int8_t *p4 = p3 + cols, *p5 = p4 + cols, *p6 = p5 + cols, *p7 = p6 + cols;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        float a4 = ACC_START, a5 = ACC_START, a6 = ACC_START, a7 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma GCC unroll 8
            for (int i = 0; i < KERNEL_QK; i += 4) {
                MAC8(i);
                MAC8(i + 1);
                MAC8(i + 2);
                MAC8(i + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b;
            const int step = opaque(nb);
            a0 = a0 + (float)s0 * (half_scaled(*d) * xd);
            d += step;
            a1 = a1 + (float)s1 * (half_scaled(*d) * xd);
            d += step;
            a2 = a2 + (float)s2 * (half_scaled(*d) * xd);
            d += step;
            a3 = a3 + (float)s3 * (half_scaled(*d) * xd);
            d += step;
            a4 = a4 + (float)s4 * (half_scaled(*d) * xd);
            d += step;
            a5 = a5 + (float)s5 * (half_scaled(*d) * xd);
            d += step;
            a6 = a6 + (float)s6 * (half_scaled(*d) * xd);
            d += step;
            a7 = a7 + (float)s7 * (half_scaled(*d) * xd);
            p0 += parts * KERNEL_QK;
            p1 += parts * KERNEL_QK;
            p2 += parts * KERNEL_QK;
            p3 += parts * KERNEL_QK;
            p4 += parts * KERNEL_QK;
            p5 += parts * KERNEL_QK;
            p6 += parts * KERNEL_QK;
            p7 += parts * KERNEL_QK;
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
        t4 = t4 + a4;
        t5 = t5 + a5;
        t6 = t6 + a6;
        t7 = t7 + a7;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
    out[4] = t4;
    out[5] = t5;
    out[6] = t6;
    out[7] = t7;
}

/* The same for the last four rows of a matrix whose row count is not a multiple of eight. */
#define MAC4(i)                                                                                     \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p0[i] * xi;                                                                           \
        s1 += p1[i] * xi;                                                                           \
        s2 += p2[i] * xi;                                                                           \
        s3 += p3[i] * xi;                                                                           \
    } while (0)

__attribute__((noinline)) static void rows4(float *out, const int8_t *w, const int16_t *wd, const int8_t *x_qs,
                                            const float *xs, int cols)
{
    const int nb = cols / KERNEL_QK;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const int8_t *p0 = w + k * KERNEL_QK, *p1 = p0 + cols, *p2 = p1 + cols, *p3 = p2 + cols;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma GCC unroll 8
            for (int i = 0; i < KERNEL_QK; i += 4) {
                MAC4(i);
                MAC4(i + 1);
                MAC4(i + 2);
                MAC4(i + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b;
            const int step = opaque(nb);
            a0 = a0 + (float)s0 * (half_scaled(*d) * xd);
            d += step;
            a1 = a1 + (float)s1 * (half_scaled(*d) * xd);
            d += step;
            a2 = a2 + (float)s2 * (half_scaled(*d) * xd);
            d += step;
            a3 = a3 + (float)s3 * (half_scaled(*d) * xd);
            p0 += parts * KERNEL_QK;
            p1 += parts * KERNEL_QK;
            p2 += parts * KERNEL_QK;
            p3 += parts * KERNEL_QK;
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
}

/* Sixteen rows of a matrix with COLS columns known at compile time (a small model's, COLS <=
 * 128): all sixteen rows are reached from one pointer with constant offsets (15 * 128 + 31 fits
 * a load's 12-bit offset), which leaves the registers for sixteen sums, so one load of each
 * activation quant serves sixteen products. Such rows have at most 4 blocks, one per partial of
 * the reduction tree, so adding every term to one running sum in block order is that tree. Block
 * 0's terms start the sums (FIRST_TERM) instead of being added to -0.0f, which changes no bits and
 * saves a group of sixteen rows 16 fmv.s and 16 fadd.s: a branch per block between two copies of
 * the sixteen terms (not of the block's 1,500 multiply-adds). Per row and block: 32 lb, 32 mul and
 * 31 add, 2 lb of the shared activation quants, lh, slli, and, fmv.w.x, fmul (w_d * x_d),
 * fcvt.s.w, fmul and fadd (not in block 0); measured 3.31 (512x64) to 3.33 (64x64) instructions
 * per multiply-add with the calls' own costs, 3.25-3.27 with float32 scales. */
#define MAC16(i)                                                                                    \
    do {                                                                                            \
        const int32_t xi = x[i];                                                                    \
        s0 += p[0 * COLS + (i)] * xi;                                                               \
        s1 += p[1 * COLS + (i)] * xi;                                                               \
        s2 += p[2 * COLS + (i)] * xi;                                                               \
        s3 += p[3 * COLS + (i)] * xi;                                                               \
        s4 += p[4 * COLS + (i)] * xi;                                                               \
        s5 += p[5 * COLS + (i)] * xi;                                                               \
        s6 += p[6 * COLS + (i)] * xi;                                                               \
        s7 += p[7 * COLS + (i)] * xi;                                                               \
        s8 += p[8 * COLS + (i)] * xi;                                                               \
        s9 += p[9 * COLS + (i)] * xi;                                                               \
        s10 += p[10 * COLS + (i)] * xi;                                                             \
        s11 += p[11 * COLS + (i)] * xi;                                                             \
        s12 += p[12 * COLS + (i)] * xi;                                                             \
        s13 += p[13 * COLS + (i)] * xi;                                                             \
        s14 += p[14 * COLS + (i)] * xi;                                                             \
        s15 += p[15 * COLS + (i)] * xi;                                                             \
    } while (0)

#define FIRST_TERM(k) a##k = (float)s##k * (half_scaled(d[(k) * NB]) * xd)
#define ADD_TERM(k) a##k = a##k + (float)s##k * (half_scaled(d[(k) * NB]) * xd)

#if defined(__GNUC__) && !defined(__clang__)
/* Block 0 sets every accumulator before any block adds to it; x86-64 GCC 12 does not see that
 * (riscv64-unknown-elf-gcc 12 does). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* `groups` groups of sixteen rows, one after another. */
#define ROWS16_FIXED(NAME, COLS_VALUE)                                                              \
    __attribute__((noinline)) static void NAME(float *out, const int8_t *w, const int16_t *wd,       \
                                               const int8_t *x_qs, const float *xs, int groups)     \
    {                                                                                               \
        enum { COLS = COLS_VALUE, NB = COLS_VALUE / KERNEL_QK };                                    \
        _Static_assert(NB <= KERNEL_PARTIALS, "one block per partial: the sequential sum is the tree"); \
        for (; groups > 0; groups--, out += 16, w += 16 * COLS, wd += 16 * NB) {                    \
        const int8_t *x = x_qs;                                                                     \
        float a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15;                \
        const int8_t *p = w;                                                                        \
        for (int b = 0; b < NB; b++) {                                                              \
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;                \
            int32_t s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;           \
            _Pragma("GCC unroll 8") for (int i = 0; i < KERNEL_QK; i += 4)                          \
            {                                                                                       \
                MAC16(i);                                                                           \
                MAC16(i + 1);                                                                       \
                MAC16(i + 2);                                                                       \
                MAC16(i + 3);                                                                       \
            }                                                                                       \
            const float xd = xs[b];                                                                 \
            const int16_t *d = wd + b;                                                              \
            if (b == 0) {                                                                           \
                FIRST_TERM(0);                                                                      \
                FIRST_TERM(1);                                                                      \
                FIRST_TERM(2);                                                                      \
                FIRST_TERM(3);                                                                      \
                FIRST_TERM(4);                                                                      \
                FIRST_TERM(5);                                                                      \
                FIRST_TERM(6);                                                                      \
                FIRST_TERM(7);                                                                      \
                FIRST_TERM(8);                                                                      \
                FIRST_TERM(9);                                                                      \
                FIRST_TERM(10);                                                                     \
                FIRST_TERM(11);                                                                     \
                FIRST_TERM(12);                                                                     \
                FIRST_TERM(13);                                                                     \
                FIRST_TERM(14);                                                                     \
                FIRST_TERM(15);                                                                     \
            } else {                                                                                \
                ADD_TERM(0);                                                                        \
                ADD_TERM(1);                                                                        \
                ADD_TERM(2);                                                                        \
                ADD_TERM(3);                                                                        \
                ADD_TERM(4);                                                                        \
                ADD_TERM(5);                                                                        \
                ADD_TERM(6);                                                                        \
                ADD_TERM(7);                                                                        \
                ADD_TERM(8);                                                                        \
                ADD_TERM(9);                                                                        \
                ADD_TERM(10);                                                                       \
                ADD_TERM(11);                                                                       \
                ADD_TERM(12);                                                                       \
                ADD_TERM(13);                                                                       \
                ADD_TERM(14);                                                                       \
                ADD_TERM(15);                                                                       \
            }                                                                                       \
            p += KERNEL_QK;                                                                         \
            x += KERNEL_QK;                                                                         \
        }                                                                                           \
        out[0] = a0;                                                                                \
        out[1] = a1;                                                                                \
        out[2] = a2;                                                                                \
        out[3] = a3;                                                                                \
        out[4] = a4;                                                                                \
        out[5] = a5;                                                                                \
        out[6] = a6;                                                                                \
        out[7] = a7;                                                                                \
        out[8] = a8;                                                                                \
        out[9] = a9;                                                                                \
        out[10] = a10;                                                                              \
        out[11] = a11;                                                                              \
        out[12] = a12;                                                                              \
        out[13] = a13;                                                                              \
        out[14] = a14;                                                                              \
        out[15] = a15;                                                                              \
        }                                                                                           \
    }

ROWS16_FIXED(rows16_cols64, 64)
ROWS16_FIXED(rows16_cols128, 128)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* Rows in every pass that fits: sixteen, then eight, four and one at a time. */
__attribute__((noinline)) static void matvec_q8_0_rows(float *out, const int8_t *w_qs, const int16_t *wd,
                                                       const int8_t *x_qs, const float *xs, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int r = 0;
    if (cols == 64) {
        rows16_cols64(out, w_qs, wd, x_qs, xs, rows / 16);
        r = rows / 16 * 16;
    } else if (cols == 128) {
        rows16_cols128(out, w_qs, wd, x_qs, xs, rows / 16);
        r = rows / 16 * 16;
    }
    for (; r + 8 <= rows; r += 8) {
        rows8(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, cols);
    }
    if (r + 4 <= rows) {
        rows4(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, cols);
        r += 4;
    }
    for (; r < rows; r++) {
        one_row(out + r, w_qs + (int64_t)r * cols, wd + (int64_t)r * nb, x_qs, xs, nb);
    }
}

/* A small model's products are short (1,000 to 33,000 multiply-adds a call for the default one),
 * so their fixed costs count: a matrix of whole sixteen-row groups (all of the default model's)
 * goes from here straight to its pass, about 100 instructions a call beyond the passes' own. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    float xs[XS_BLOCKS];
    if (nb > XS_BLOCKS || !prescale(xs, x_d, nb)) {
        kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
    } else if (cols == 64 && rows % 16 == 0) {
        rows16_cols64(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows / 16);
    } else if (cols == 128 && rows % 16 == 0) {
        rows16_cols128(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows / 16);
    } else {
        matvec_q8_0_rows(out, w_qs, (const int16_t *)w_d, x_qs, xs, rows, cols);
    }
}

/* q4_1, read in place (two quants per byte), eight rows at once. A byte holds quant lo of value j
 * (low nibble) and hi of value j + 16 (high nibble): byte = lo + 16 * hi. Writing x = x_qs[j] and
 * y = x_qs[j + 16],
 *     16 * (lo * x + hi * y) = lo * (16 * x - y) + byte * y,
 * so with a = 16 * x - y, made once per byte for all eight rows, a row needs only the low nibble
 * (an andi) and two multiply-adds per byte, never the high nibble (no shift): lbu, andi, mul, add,
 * mul, add for two multiply-adds, 3 instructions per multiply-add. The 16 bytes of a block sum to
 * 16 * isum exactly (|sum| < 2^21) and an arithmetic shift by 4 gives isum. The activation blocks'
 * sums xsum do not depend on the row: kernel_matvec_q4_1 makes them once per call, for all the
 * rows, into XS_BLOCKS int32s on the stack next to the prescaled activation scales (2 KiB
 * together: rows of up to 8192 values; longer rows take the scalar kernel). Each row's term is
 * kernel_q4_1_term with its scale and minimum as half_scaled and the activation scale prescaled
 * (the same two real products, so the same bits), summed by the reduction tree as rows8 sums
 * q8_0's (row_parts), so the bits are the scalar kernel's. With each row's widening of its scale
 * and minimum (eight instructions), two float products, two additions and its conversions per
 * block, it measures 4.19-4.37 instructions per multiply-add (tests/c/rv32_selftest.c; 4.28-4.40
 * with float32 scales, before row_parts and the stepping scale pointer): q8_0 takes 3.31, and q4_0
 * read in place (the scalar kernel; boards with room read an int8 copy with the q8_0 kernel
 * instead) 8.2-8.8. */
#define Q41_MAC8(j)                                                                                 \
    do {                                                                                            \
        const int32_t xj = x[j], yj = x[(j) + KERNEL_QK / 2];                                       \
        const int32_t aj = xj * 16 - yj;                                                            \
        s0 += (p0[j] & 0x0F) * aj + p0[j] * yj;                                                     \
        s1 += (p1[j] & 0x0F) * aj + p1[j] * yj;                                                     \
        s2 += (p2[j] & 0x0F) * aj + p2[j] * yj;                                                     \
        s3 += (p3[j] & 0x0F) * aj + p3[j] * yj;                                                     \
        s4 += (p4[j] & 0x0F) * aj + p4[j] * yj;                                                     \
        s5 += (p5[j] & 0x0F) * aj + p5[j] * yj;                                                     \
        s6 += (p6[j] & 0x0F) * aj + p6[j] * yj;                                                     \
        s7 += (p7[j] & 0x0F) * aj + p7[j] * yj;                                                     \
    } while (0)

/* isum from 16 * isum: an exact multiple of 16, so the arithmetic shift (GCC's >> on a negative
 * int) divides exactly. */
static inline int32_t q4_1_isum(int32_t sum16)
{
    return sum16 >> 4;
}

__attribute__((noinline)) static void rows8_q4_1(float *out, const uint8_t *w, const int16_t *wd, const int16_t *wm,
                                                 const int8_t *x_qs, const float *xs, const int32_t *x_sums,
                                                 int cols)
{
    const int nb = cols / KERNEL_QK, rb = cols / 2;
    const int parts = row_parts(nb);
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    float t4 = ACC_START, t5 = ACC_START, t6 = ACC_START, t7 = ACC_START;
    for (int k = 0; k < parts; k++) {
        const uint8_t *p0 = w + k * (KERNEL_QK / 2), *p1 = p0 + rb, *p2 = p1 + rb, *p3 = p2 + rb;
        const uint8_t *p4 = p3 + rb, *p5 = p4 + rb, *p6 = p5 + rb, *p7 = p6 + rb;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        float a4 = ACC_START, a5 = ACC_START, a6 = ACC_START, a7 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma GCC unroll 4
            for (int j = 0; j < KERNEL_QK / 2; j += 4) {
                Q41_MAC8(j);
                Q41_MAC8(j + 1);
                Q41_MAC8(j + 2);
                Q41_MAC8(j + 3);
            }
            const int32_t xsum = x_sums[b];
            const float xd = xs[b];
            const int16_t *d = wd + b, *m = wm + b;
            const int step = opaque(nb);
            a0 = a0 + kernel_q4_1_term(q4_1_isum(s0), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a1 = a1 + kernel_q4_1_term(q4_1_isum(s1), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a2 = a2 + kernel_q4_1_term(q4_1_isum(s2), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a3 = a3 + kernel_q4_1_term(q4_1_isum(s3), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a4 = a4 + kernel_q4_1_term(q4_1_isum(s4), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a5 = a5 + kernel_q4_1_term(q4_1_isum(s5), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a6 = a6 + kernel_q4_1_term(q4_1_isum(s6), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a7 = a7 + kernel_q4_1_term(q4_1_isum(s7), xsum, half_scaled(*d), half_scaled(*m), xd);
            p0 += parts * (KERNEL_QK / 2);
            p1 += parts * (KERNEL_QK / 2);
            p2 += parts * (KERNEL_QK / 2);
            p3 += parts * (KERNEL_QK / 2);
            p4 += parts * (KERNEL_QK / 2);
            p5 += parts * (KERNEL_QK / 2);
            p6 += parts * (KERNEL_QK / 2);
            p7 += parts * (KERNEL_QK / 2);
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
        t4 = t4 + a4;
        t5 = t5 + a5;
        t6 = t6 + a6;
        t7 = t7 + a7;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
    out[4] = t4;
    out[5] = t5;
    out[6] = t6;
    out[7] = t7;
}

/* The same for four rows (the last ones of a matrix whose row count is not a multiple of eight). */
#define Q41_MAC4(j)                                                                                 \
    do {                                                                                            \
        const int32_t xj = x[j], yj = x[(j) + KERNEL_QK / 2];                                       \
        const int32_t aj = xj * 16 - yj;                                                            \
        s0 += (p0[j] & 0x0F) * aj + p0[j] * yj;                                                     \
        s1 += (p1[j] & 0x0F) * aj + p1[j] * yj;                                                     \
        s2 += (p2[j] & 0x0F) * aj + p2[j] * yj;                                                     \
        s3 += (p3[j] & 0x0F) * aj + p3[j] * yj;                                                     \
    } while (0)

__attribute__((noinline)) static void rows4_q4_1(float *out, const uint8_t *w, const int16_t *wd, const int16_t *wm,
                                                 const int8_t *x_qs, const float *xs, const int32_t *x_sums,
                                                 int cols)
{
    const int nb = cols / KERNEL_QK, rb = cols / 2;
    float t0 = ACC_START, t1 = ACC_START, t2 = ACC_START, t3 = ACC_START;
    const int parts = row_parts(nb);
    for (int k = 0; k < parts; k++) {
        const uint8_t *p0 = w + k * (KERNEL_QK / 2), *p1 = p0 + rb, *p2 = p1 + rb, *p3 = p2 + rb;
        const int8_t *x = x_qs + k * KERNEL_QK;
        float a0 = ACC_START, a1 = ACC_START, a2 = ACC_START, a3 = ACC_START;
        for (int b = k; b < nb; b += parts) {
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            const int32_t xsum = x_sums[b];
#pragma GCC unroll 4
            for (int j = 0; j < KERNEL_QK / 2; j += 4) {
                Q41_MAC4(j);
                Q41_MAC4(j + 1);
                Q41_MAC4(j + 2);
                Q41_MAC4(j + 3);
            }
            const float xd = xs[b];
            const int16_t *d = wd + b, *m = wm + b;
            const int step = opaque(nb);
            a0 = a0 + kernel_q4_1_term(q4_1_isum(s0), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a1 = a1 + kernel_q4_1_term(q4_1_isum(s1), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a2 = a2 + kernel_q4_1_term(q4_1_isum(s2), xsum, half_scaled(*d), half_scaled(*m), xd);
            d += step, m += step;
            a3 = a3 + kernel_q4_1_term(q4_1_isum(s3), xsum, half_scaled(*d), half_scaled(*m), xd);
            p0 += parts * (KERNEL_QK / 2);
            p1 += parts * (KERNEL_QK / 2);
            p2 += parts * (KERNEL_QK / 2);
            p3 += parts * (KERNEL_QK / 2);
            x += parts * KERNEL_QK;
        }
        t0 = t0 + a0;
        t1 = t1 + a1;
        t2 = t2 + a2;
        t3 = t3 + a3;
    }
    out[0] = t0;
    out[1] = t1;
    out[2] = t2;
    out[3] = t3;
}

void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    int r = 0;
    int32_t x_sums[XS_BLOCKS];
    float xs[XS_BLOCKS];
    if (nb <= XS_BLOCKS && rows >= 4 && prescale(xs, x_d, nb)) {
        const int16_t *wd = (const int16_t *)w_d, *wm = (const int16_t *)w_m;
        activation_sums(x_sums, x_qs, nb);
        for (; r + 8 <= rows; r += 8) {
            rows8_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), wd + (int64_t)r * nb, wm + (int64_t)r * nb,
                       x_qs, xs, x_sums, cols);
        }
        if (r + 4 <= rows) {
            rows4_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), wd + (int64_t)r * nb, wm + (int64_t)r * nb,
                       x_qs, xs, x_sums, cols);
            r += 4;
        }
    }
    /* the last one to three rows (or all of a matrix too wide for x_sums, or with an activation
     * scale of 2^16 or more): the scalar kernel's loop */
    if (r < rows) {
        kernel_scalar_matvec_q4_1(out + r, w_q4 + (int64_t)r * (cols / 2), w_d + (int64_t)r * nb,
                                  w_m + (int64_t)r * nb, x_qs, x_d, rows - r, cols);
    }
}
