/* The kernel interface: the only operations whose speed matters, one implementation per ISA.
 *
 * kernels/scalar.c (kernel_scalar_*) is the reference every other implementation is tested
 * against; a faster kernel must return the same bits (docs/numerics.md): integer dot products
 * within a q8_0 block, then the block terms summed in float32 along the fixed reduction tree
 * below (KERNEL_PARTIALS partial sums per row, combined in order), and sequential float32 sums
 * for f32 rows and attention. A board's kernel list names scalar.c plus one kernel set: a folder
 * kernels/<set>/ (an ISA's, as x86_avx2/), its files by role with the same roles in every set:
 * <set>.h (the ISA's shared static inline helpers, the set's internal declarations), set.c (its
 * identity, its KERNEL_HAS_<ENTRY> with fallback.h, the entry points), cpu.c, matvec.c, matmul.c,
 * blocks.c, f32.c, vector.c and attention.c, those it has; or one file kernels/<set>.c (generic.c).
 * A set defines the entry points it
 * makes faster, says so with KERNEL_HAS_<ENTRY> and includes fallback.h, which defines
 * every entry point it left out: the scalar reference, or for the batched products, tiles of rows
 * over the set's own matvec. So no set restates what it does not change. */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define KERNEL_QK 32 /* values per q8_0 block */

/* A weight block's scale (and a q4_1 block's minimum) as the image holds it: IEEE 754 binary16
 * bits, half the bytes of a float32 (GGUF's Q8_0, Q4_0 and Q4_1 blocks hold theirs the same way).
 * Every binary16 value is a float32 exactly, so a kernel widens it (kernel_half_to_float, or its
 * ISA's own conversion: F16C, NEON fcvtl) and the arithmetic below is unchanged. Activation block
 * scales (x_d) are made at run time and stay float32. */
typedef uint16_t KernelHalf;

/* binary16 -> float32, exactly, in portable C: the exponent and mantissa bits moved to float32's
 * places make the value times 2^-112 (a subnormal binary16 becomes a subnormal float32, exactly),
 * which one multiplication by 2^112 brings back exactly; then the sign. The image never holds an
 * infinity or a NaN (the generator refuses to write one), so those encodings need no case. */
static inline float kernel_half_to_float(KernelHalf h)
{
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)(h & 0x7FFF) << 13};
    v.f = v.f * 0x1p112f;
    v.u |= (uint32_t)(h & 0x8000) << 16;
    return v.f;
}

/* float32 -> binary16, rounded to nearest, ties to even, in portable C (the KV cache's rounding
 * at write, docs/numerics.md): |f| of 65504 and more saturates to +-65504, so a finite value never
 * becomes an infinity; a NaN stays a NaN. The rounding is done by float32 additions: |f| scaled so
 * that binary16's last place is float32's, plus a power of two that puts the bits to keep at the
 * bottom of the significand (Maratyszcza's FP16 conversion), exact in float32 round-to-nearest. */
static inline KernelHalf kernel_float_to_half(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {f}, base, bias;
    const uint32_t sign = (v.u >> 16) & 0x8000u;
    const uint32_t magnitude = v.u & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) {
        return (KernelHalf)(sign | 0x7E00u); /* NaN */
    }
    if (magnitude >= 0x477FE000u) {
        return (KernelHalf)(sign | 0x7BFFu); /* 65504 and beyond: the largest binary16 */
    }
    v.u = magnitude;
    base.f = (v.f * 0x1p112f) * 0x1p-110f;
    uint32_t exponent = (magnitude << 1) & 0xFF000000u;
    if (exponent < 0x71000000u) {
        exponent = 0x71000000u;
    }
    bias.u = (exponent >> 1) + 0x07800000u;
    base.f = bias.f + base.f;
    return (KernelHalf)(sign | (((base.u >> 13) & 0x7C00u) + (base.u & 0x0FFFu)));
}

/* The reduction tree of a quantized row (docs/numerics.md, "q8_0 dot product"). Block b's term
 * t_b = (float)isum_b * (w_d_b * x_d_b) goes to partial b % KERNEL_PARTIALS; each partial adds its
 * terms in block order, starting from -0.0f (which its first term replaces exactly: -0.0f + t == t
 * for every float t); the row's value is then ((p0 + p1) + p2) + ... + p7, in that order. A row of
 * at most 8 blocks is therefore the plain sequential sum of its terms. Eight partials are one AVX2
 * float vector, two NEON ones, and in the combine each partial is added to a running total, so an
 * in-order core (rv32) needs two float registers per row; eight independent chains hide the float
 * add latency on every out-of-order core. */
#define KERNEL_PARTIALS 8

/* The combine step of that tree: ((p[0] + p[1]) + p[2]) + ... + p[7]. Every kernel set's own
 * combine (vector lanes, registers) must do these additions in this order. */
static inline float kernel_sum_partials(const float p[KERNEL_PARTIALS])
{
    float acc = p[0];
    for (int k = 1; k < KERNEL_PARTIALS; k++) {
        acc = acc + p[k];
    }
    return acc;
}

/* out[r] = sum_j w[r*cols + j] * x[j], j ascending. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols);

/* out[r] = the reduction tree above over the terms (float)isum(r, b) * (w_d[r*nb + b] * x_d[b]),
 * where isum is the exact int32 dot product of the 32 quants of block b and w_d the binary16 scale
 * widened to float32. cols % 32 == 0. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols);

/* The q8_0 product with q4_0 weights: w_q4 holds rows x cols/2 bytes, byte j of each 16-byte block
 * holding the quants of values j (low nibble) and j + 16 (high nibble), each standing for the
 * int8 value quant - 8. The result is kernel_matvec_q8_0's on those int8 values, bit for bit. */
void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols);

/* The same products for n_tok inputs at once (batched prefill): for every token t < n_tok,
 * out[t * out_stride + r] is exactly what kernel_matvec_* gives for row r and token t's input
 * (x + t * cols; q8_0: x_qs + t * cols, x_d + t * cols / 32). Each weight row is read from memory
 * once for all the tokens instead of once per token. */
void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                       int cols);
void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);
void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);

/* q4_1 weights (affine 4-bit, GGUF Q4_1): w_q4 packed as q4_0's (byte j of each 16-byte block holds
 * quants j and j + 16 in its low and high nibble), but quant q in 0..15 stands for d * q + m, with
 * a binary16 scale w_d and a binary16 minimum w_m per block (widened to float32). With q8_0 activations, block b's term is
 *   term_b = (float)isum_b * (w_d_b * x_d_b) + (float)xsum_b * (w_m_b * x_d_b)
 * isum_b = sum_j q_j * x_qs_j and xsum_b = sum_j x_qs_j exact int32, every product and the sum
 * rounded to float32 in exactly that order (no FMA). A row's terms are added in block order through
 * KernelQ41Sum below, the one place that says how. cols % 32 == 0. */
void kernel_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matmul_q4_1(float *out, int out_stride, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);

/* GGUF block types kept as the file holds them (docs/numerics.md, "GGUF blocks"): Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, MXFP4. A matrix is its rows one after another, each row its
 * blocks verbatim (ggml-common.h's block_* layouts, binary16 fields little-endian, at any byte
 * alignment). Every reader sees a block of 32 values through the type's kernel_<type>_unpack:
 * 32 small integers q, and per 16 values a float32 scale (and offset, for the affine types)
 * computed exactly from the block's fields (a binary16 times an integer of at most 8 bits, or
 * MXFP4's power of two).
 * A value is scale * q (+ offset); a product term is kernel_unpacked_term's. */
#define KERNEL_Q5_0_VALUES 32 /* values per block */
#define KERNEL_Q5_0_BYTES 22 /* d, qh[4], qs[16] */
#define KERNEL_Q5_1_VALUES 32
#define KERNEL_Q5_1_BYTES 24 /* d, m, qh[4], qs[16] */
#define KERNEL_Q4_K_VALUES 256
#define KERNEL_Q4_K_BYTES 144 /* d, dmin, scales[12], qs[128] */
#define KERNEL_Q5_K_VALUES 256
#define KERNEL_Q5_K_BYTES 176 /* d, dmin, scales[12], qh[32], qs[128] */
#define KERNEL_Q6_K_VALUES 256
#define KERNEL_Q6_K_BYTES 210 /* ql[128], qh[64], scales int8[16], d */
#define KERNEL_Q3_K_VALUES 256
#define KERNEL_Q3_K_BYTES 110 /* hmask[32], qs[64], scales[12], d */
#define KERNEL_Q2_K_VALUES 256
#define KERNEL_Q2_K_BYTES 84 /* scales[16], qs[64], d, dmin */
#define KERNEL_IQ4_NL_VALUES 32
#define KERNEL_IQ4_NL_BYTES 18 /* d, qs[16] */
#define KERNEL_IQ4_XS_VALUES 256
#define KERNEL_IQ4_XS_BYTES 136 /* d, scales_h (u16), scales_l[4], qs[128] */
#define KERNEL_MXFP4_VALUES 32
#define KERNEL_MXFP4_BYTES 17 /* e (e8m0 exponent), qs[16] */

/* One 32-value block decoded: value l is scale[l / 16] * q[l] (+ offset[l / 16]); a type with one
 * scale per 32 values stores it twice. */
typedef struct {
    int8_t q[KERNEL_QK];
    float scale[2];
    float offset[2]; /* affine types only (Q5_1's m, the K-types' -dmin * m) */
} KernelUnpacked;

/* The shape of a type's product term (kernel_unpacked_term). */
#define KERNEL_ONE_SCALE 1   /* one scale per 32 values: one isum */
#define KERNEL_TWO_SCALES 2  /* one scale per 16 values: an isum per half */

/* The binary16 at p (two bytes, little-endian, any alignment), widened to float32. */
static inline float kernel_half_at(const uint8_t *p)
{
    return kernel_half_to_float((KernelHalf)(p[0] | (p[1] << 8)));
}

static inline void kernel_unpacked_one_scale(KernelUnpacked *u, float scale, float offset)
{
    u->scale[0] = u->scale[1] = scale;
    u->offset[0] = u->offset[1] = offset;
}

/* Q5_0: value = d * (q - 16), q five bits: a nibble (values 0..15 low, 16..31 high) and bit l of qh. */
static inline void kernel_q5_0_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)b * KERNEL_Q5_0_BYTES;
    const uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
    for (int l = 0; l < KERNEL_QK; l++) {
        const int nibble = l < 16 ? blk[6 + l] & 0x0F : blk[6 + l - 16] >> 4;
        u->q[l] = (int8_t)((nibble | (int)((qh >> l) & 1) << 4) - 16);
    }
    kernel_unpacked_one_scale(u, kernel_half_at(blk), 0.0f);
}

/* Q5_1: value = d * q + m, q as Q5_0's without the offset. */
static inline void kernel_q5_1_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)b * KERNEL_Q5_1_BYTES;
    const uint32_t qh = (uint32_t)blk[4] | (uint32_t)blk[5] << 8 | (uint32_t)blk[6] << 16 | (uint32_t)blk[7] << 24;
    for (int l = 0; l < KERNEL_QK; l++) {
        const int nibble = l < 16 ? blk[8 + l] & 0x0F : blk[8 + l - 16] >> 4;
        u->q[l] = (int8_t)(nibble | (int)((qh >> l) & 1) << 4);
    }
    kernel_unpacked_one_scale(u, kernel_half_at(blk), kernel_half_at(blk + 2));
}

/* ggml's get_scale_min_k4: sub-block j's 6-bit scale and minimum from a Q4_K/Q5_K block's 12 bytes. */
static inline void kernel_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K and Q5_K: sub-block j = b % 8 of superblock b / 8, value = (d * sc_j) * q - dmin * m_j; the
 * quants are the low (even j) or high (odd j) nibbles of 32 bytes, Q5_K's fifth bit bit j of qh[l]. */
static inline void kernel_k_unpack(const uint8_t *blk, int j, const uint8_t *qs, const uint8_t *qh, KernelUnpacked *u)
{
    int sc, m;
    kernel_k_scale_min(blk + 4, j, &sc, &m);
    const uint8_t *q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < KERNEL_QK; l++) {
        const int high = qh != NULL ? ((qh[l] >> j) & 1) << 4 : 0;
        u->q[l] = (int8_t)(((q[l] >> shift) & 0x0F) | high);
    }
    kernel_unpacked_one_scale(u, kernel_half_at(blk) * (float)sc, -(kernel_half_at(blk + 2) * (float)m));
}

static inline void kernel_q4_k_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_Q4_K_BYTES;
    kernel_k_unpack(blk, b % 8, blk + 16, NULL, u);
}

static inline void kernel_q5_k_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_Q5_K_BYTES;
    kernel_k_unpack(blk, b % 8, blk + 48, blk + 16, u);
}

/* Q6_K: run j = b % 8 (half j / 4, k = j % 4) of 32 values: the low (k < 2) or high nibble of
 * ql[64 * half + 32 * (k % 2) + l] and bits 2k, 2k + 1 of qh[32 * half + l], minus 32; values
 * l < 16 take int8 scale 2j, the others 2j + 1, each times d. */
static inline void kernel_q6_k_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_Q6_K_BYTES;
    const int j = b % 8, half = j / 4, k = j % 4;
    const uint8_t *ql = blk + 64 * half + 32 * (k % 2);
    const uint8_t *qh = blk + 128 + 32 * half;
    const int shift = (k / 2) * 4;
    for (int l = 0; l < KERNEL_QK; l++) {
        u->q[l] = (int8_t)((((ql[l] >> shift) & 0x0F) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
    }
    const float d = kernel_half_at(blk + 208);
    u->scale[0] = d * (float)(int8_t)blk[192 + 2 * j];
    u->scale[1] = d * (float)(int8_t)blk[192 + 2 * j + 1];
    u->offset[0] = u->offset[1] = 0.0f;
}

/* The 2 bits of value 32 * j + l of a Q2_K/Q3_K superblock: bits 2k, 2k + 1 of qs[32 * (j / 4) + l]. */
static inline int kernel_crumb(const uint8_t *qs, int j, int l)
{
    return (qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
}

/* Q3_K's 6-bit scale g (0..15), minus 32. */
static inline int kernel_q3_k_scale(const uint8_t *s, int g)
{
    const int low = g < 8 ? s[g] & 0x0F : s[g - 8] >> 4;
    const int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (low | high << 4) - 32;
}

/* Q3_K: value = (d * (sc - 32)) * q, q = the 2 low bits minus 4 unless bit j of hmask[l] is set. */
static inline void kernel_q3_k_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_Q3_K_BYTES;
    const int j = b % 8;
    for (int l = 0; l < KERNEL_QK; l++) {
        const int lift = (blk[l] >> j) & 1 ? 0 : 4;
        u->q[l] = (int8_t)(kernel_crumb(blk + 32, j, l) - lift);
    }
    const float d = kernel_half_at(blk + 108);
    u->scale[0] = d * (float)kernel_q3_k_scale(blk + 96, 2 * j);
    u->scale[1] = d * (float)kernel_q3_k_scale(blk + 96, 2 * j + 1);
    u->offset[0] = u->offset[1] = 0.0f;
}

/* Q2_K: value = (d * (sc & 15)) * q - dmin * (sc >> 4), one scale byte per 16 values. */
static inline void kernel_q2_k_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_Q2_K_BYTES;
    const int j = b % 8;
    for (int l = 0; l < KERNEL_QK; l++) {
        u->q[l] = (int8_t)kernel_crumb(blk + 16, j, l);
    }
    const float d = kernel_half_at(blk + 80), dmin = kernel_half_at(blk + 82);
    for (int h = 0; h < 2; h++) {
        const uint8_t sc = blk[2 * j + h];
        u->scale[h] = d * (float)(sc & 0x0F);
        u->offset[h] = -(dmin * (float)(sc >> 4));
    }
}

/* IQ4_NL's and IQ4_XS's sixteen values (ggml's kvalues_iq4nl). */
static const int8_t kernel_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

/* 16 bytes of IQ4 nibbles: values 0..15 the low nibbles, 16..31 the high ones, through the table. */
static inline void kernel_iq4_values(const uint8_t *qs, KernelUnpacked *u)
{
    for (int l = 0; l < KERNEL_QK; l++) {
        u->q[l] = kernel_iq4nl_values[l < 16 ? qs[l] & 0x0F : qs[l - 16] >> 4];
    }
}

/* IQ4_NL: value = d * kvalues[q]. */
static inline void kernel_iq4_nl_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)b * KERNEL_IQ4_NL_BYTES;
    kernel_iq4_values(blk + 2, u);
    kernel_unpacked_one_scale(u, kernel_half_at(blk), 0.0f);
}

/* IQ4_XS: sub-block j = b % 8, value = (d * (ls - 32)) * kvalues[q], ls 4 bits of scales_l and 2 of scales_h. */
static inline void kernel_iq4_xs_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)(b / 8) * KERNEL_IQ4_XS_BYTES;
    const int j = b % 8;
    const int scales_h = blk[2] | blk[3] << 8;
    const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((scales_h >> (2 * j)) & 3) << 4);
    kernel_iq4_values(blk + 8 + 16 * j, u);
    kernel_unpacked_one_scale(u, kernel_half_at(blk) * (float)(ls - 32), 0.0f);
}

/* MXFP4's sixteen values: the e2m1 numbers doubled (ggml's kvalues_mxfp4), hence the half scale. */
static const int8_t kernel_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4's scale: its e8m0 byte e as 2^(e - 128), exactly (ggml's GGML_E8M0_TO_FP32_HALF): the
 * float32 bits (e - 1) << 23, or for e = 0 and 1 the subnormals 2^-128 and 2^-127. The image never
 * holds e = 0xFF (NaN in the OCP MX spec) nor a block whose values overflow (the generator refuses
 * them), so every scale and value is a finite float32. */
static inline float kernel_e8m0_half(uint8_t e)
{
    union {
        uint32_t u;
        float f;
    } v = {e < 2 ? (uint32_t)0x00200000 << e : (uint32_t)(e - 1) << 23};
    return v.f;
}

/* MXFP4: value = 2^(e - 128) * kvalues_mxfp4[q], the nibbles as IQ4_NL's (low 0..15, high 16..31). */
static inline void kernel_mxfp4_unpack(const uint8_t *row, int b, KernelUnpacked *u)
{
    const uint8_t *blk = row + (int64_t)b * KERNEL_MXFP4_BYTES;
    const uint8_t *qs = blk + 1;
    for (int l = 0; l < KERNEL_QK; l++) {
        u->q[l] = kernel_mxfp4_values[l < 16 ? qs[l] & 0x0F : qs[l - 16] >> 4];
    }
    kernel_unpacked_one_scale(u, kernel_e8m0_half(blk[0]), 0.0f);
}

/* Value l of an unpacked block: the product, then (affine types) the sum. */
static inline float kernel_unpacked_value(const KernelUnpacked *u, int l, int affine)
{
    const float v = u->scale[l / 16] * (float)u->q[l];
    return affine ? v + u->offset[l / 16] : v;
}

/* An unpacked block's term in a product with a q8_0 activation block (x, x_d), each product
 * and sum rounded to float32 in this order (docs/numerics.md):
 *   one scale:  (float)isum * (s * x_d) [+ (float)xsum * (o * x_d)]            (q4_1's term)
 *   two scales: (float)isum_a * (s_a * x_d) + (float)isum_b * (s_b * x_d)
 *               [+ (float)xsum_a * (o_a * x_d)] [+ (float)xsum_b * (o_b * x_d)]
 * isum and xsum exact int32 over the block (or its half). */
static inline float kernel_unpacked_term(const KernelUnpacked *u, const int8_t *x, float x_d, int scales, int affine)
{
    int32_t isum[2] = {0, 0}, xsum[2] = {0, 0};
    for (int l = 0; l < KERNEL_QK; l++) {
        const int h = scales == KERNEL_TWO_SCALES ? l / 16 : 0;
        isum[h] += (int32_t)u->q[l] * (int32_t)x[l];
        xsum[h] += x[l];
    }
    if (scales == KERNEL_ONE_SCALE) {
        const float term = (float)isum[0] * (u->scale[0] * x_d);
        return affine ? term + (float)xsum[0] * (u->offset[0] * x_d) : term;
    }
    float term = (float)isum[0] * (u->scale[0] * x_d) + (float)isum[1] * (u->scale[1] * x_d);
    if (affine) {
        term = term + (float)xsum[0] * (u->offset[0] * x_d);
        term = term + (float)xsum[1] * (u->offset[1] * x_d);
    }
    return term;
}

/* The products of the kept GGUF types, one pair per type: w holds rows x (cols / VALUES) blocks
 * (cols % VALUES == 0), x_qs/x_d the q8_0 input; out[r] is the reduction tree above over the
 * row's terms kernel_unpacked_term (block b -> partial b % KERNEL_PARTIALS); the matmul gives
 * every token t (x_qs + t * cols, x_d + t * cols / 32) exactly the matvec's bits, into
 * out[t * out_stride + r]. */
typedef void (*KernelBlocksMatvec)(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows,
                                   int cols);
void kernel_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_matmul_q5_0(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q5_1(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q4_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q5_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q6_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q3_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_q2_k(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                        int rows, int cols);
void kernel_matmul_iq4_nl(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols);
void kernel_matmul_iq4_xs(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                          int rows, int cols);
void kernel_matmul_mxfp4(float *out, int out_stride, const uint8_t *w, const int8_t *x_qs, const float *x_d, int n_tok,
                         int rows, int cols);

/* Attention over one tile of the KV cache: n consecutive positions of one KV head, row i's key
 * (value) at keys (values) + i * stride, head_dim floats (read in place from an f32 cache, or
 * widened exactly from an f16 or q8_0 one into a tile), and n_q query heads that share that KV
 * head (grouped-query attention: the tile is read once for all of them):
 *   scores: att[a * att_stride + i] = (q_a . k_i) * scale, q_a = q + a * q_stride, the dot
 *           product summed over j in order from -0.0f (which the first term replaces exactly);
 *   mix:    out[a * out_stride + j] += sum over i in order of p[a * p_stride + i] * v_i[j], one
 *           addition at a time onto what out holds (the caller starts it at -0.0f), so a sum over
 *           many tiles is the one chain over all positions in order. */
void kernel_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q, const float *keys,
                             int stride, int n, int head_dim, float scale);
void kernel_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q, const float *values,
                          int stride, int n, int head_dim);
/* One query token of a block (a prompt's tokens attend together) against a tile: its n_q query
 * heads (q_stride apart), the tile's positions first .. first + count - 1 it sees, and where the
 * score of position first + i goes (att + a * att_stride + i). */
typedef struct {
    float *att;
    const float *q;
    int first;
    int count;
} KernelQueryRange;
/* kernel_attention_scores for each of n_tok tokens against the same tile of n keys, bit for bit:
 * a set may rearrange the tile once for all of them (AVX2 transposes it, so that no token's pass
 * transposes it again); the sums are the same chains. */
void kernel_attention_scores_tokens(const KernelQueryRange *tokens, int n_tok, int att_stride, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale);
/* The same two over a binary16 cache read where it lies: keys (values) n rows of head_dim binary16
 * stride apart. The bits are those of kernel_widen_f16 into a tile and the float kernels above,
 * which is what a set without its own does (fallback.h): tile_rows rows at a time in `tile` (room
 * for tile_rows * head_dim floats; a value sum goes on from one tile to the next, so its chain is
 * unchanged). rv32 decodes each value once for all n_q heads instead of storing and reloading it. */
void kernel_attention_scores_f16(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                 const KernelHalf *keys, int stride, int n, int head_dim, float scale, float *tile,
                                 int tile_rows);
void kernel_attention_mix_f16(float *out, int out_stride, const float *p, int p_stride, int n_q,
                              const KernelHalf *values, int stride, int n, int head_dim, float *tile, int tile_rows);
/* op_softmax (ops.c) bit for bit: the maximum and the sum of the exponentials in order, one at a
 * time; a set may compute the exponentials and the divisions several per vector. */
void kernel_softmax(float *x, int n);
/* kernel_softmax of each of `rows` rows of n values, stride floats apart (a KV head's query heads:
 * a set may run their sums interleaved, each still in order). */
void kernel_softmax_rows(float *x, int stride, int rows, int n);

/* A binary16 KV cache's values (n), and a q8_0 one's (n a multiple of KERNEL_QK: value i is
 * (float)qs[i] * d[i / KERNEL_QK]), widened to float32: exact, so every set's bits are the same. */
void kernel_widen_f16(float *out, const KernelHalf *h, int n);
void kernel_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n);
/* The KV cache's rounding when a key or value row is written, defined once (kernels/scalar.c) for
 * every set: binary16 by kernel_float_to_half; q8_0 per block of 32 as the weights' q8_0 (d =
 * binary16(max|x| / 127), saturating; q = clamp(round_half_even(x * (1 / d)), -127, 127), all zero
 * when d is 0). n is a multiple of KERNEL_QK for q8_0. */
void kernel_round_f16(KernelHalf *out, const float *x, int n);
void kernel_round_q8_0(int8_t *qs, KernelHalf *d, const float *x, int n);

/* SwiGLU: up[i] = silu(gate[i]) * up[i], silu being op_silu (ops.c) bit for bit. */
void kernel_swiglu(float *up, const float *gate, int n);
/* GeGLU (Gemma): up[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh being op_gelu_tanh (ops.c) bit for
 * bit, with its tanh (op_tanh) and exponential (op_expf) step for step. */
void kernel_gelu_tanh_mul(float *up, const float *gate, int n);

/* One head's gated delta-rule step (Gated DeltaNet), op_delta_rule_step (ops.c) bit for bit: every
 * value column j is its own chain of sums over the key rows i, in order, so a set may run several
 * columns per vector (a multiply, then an add: no fused multiply-add). */
void kernel_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                            float beta, float *memory, int key_dim, int value_dim);

/* Quantize n floats (n % 32 == 0) to q8_0: d = max|x| / 127, q = round_half_even(x / d). */
void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n);

/* Value j (0..31) of a q4_0 block's 16 bytes: byte j % 16 holds values j (low nibble) and j + 16
 * (high nibble), each quant standing for the int8 value quant - 8. */
static inline int8_t kernel_q4_0_value(const uint8_t *block, int j)
{
    const uint8_t byte = block[j % (KERNEL_QK / 2)];
    return (int8_t)((j < KERNEL_QK / 2 ? byte & 0x0F : byte >> 4) - 8);
}

/* Quant j (0..31) of a q4_1 block's 16 bytes (the q4_0 nibble order), standing for d * q + m. */
static inline uint8_t kernel_q4_1_quant(const uint8_t *block, int j)
{
    const uint8_t byte = block[j % (KERNEL_QK / 2)];
    return (uint8_t)(j < KERNEL_QK / 2 ? byte & 0x0F : byte >> 4);
}

/* One q4_1 block's float term (see kernel_matvec_q4_1): two products, then their sum. */
static inline float kernel_q4_1_term(int32_t isum, int32_t xsum, float w_d, float w_m, float x_d)
{
    return (float)isum * (w_d * x_d) + (float)xsum * (w_m * x_d);
}

/* A q4_1 row's sum of block terms: the reduction tree above, as for q8_0 and q4_0. The scalar
 * reference and the NEON and AVX2 matvec kernels add their terms through these three functions;
 * the rv32 row passes (partial by partial, as its q8_0 ones) and the AVX2 batched lanes spell the
 * same tree out, and the harness tests hold them to it at block counts around 8. Each partial starts at -0.0f, which its first term replaces exactly (-0.0f + t == t for
 * every t, +0.0f included); block b's term goes to partial b % KERNEL_PARTIALS. */
typedef struct {
    float partial[KERNEL_PARTIALS];
} KernelQ41Sum;

static inline KernelQ41Sum kernel_q4_1_sum_start(void)
{
    KernelQ41Sum s;
    for (int k = 0; k < KERNEL_PARTIALS; k++) {
        s.partial[k] = -0.0f;
    }
    return s;
}

static inline void kernel_q4_1_sum_add(KernelQ41Sum *s, int b, float term)
{
    s->partial[b % KERNEL_PARTIALS] = s->partial[b % KERNEL_PARTIALS] + term;
}

static inline float kernel_q4_1_sum_end(const KernelQ41Sum *s)
{
    return kernel_sum_partials(s->partial);
}

/* Name of the kernel set in use, reported in the hello frame. */
const char *kernel_set(void);

/* The CPU features the kernel set checks for at run time and found, comma-separated ("sdot" on an
 * aarch64 core with the dot-product extension, "avx2" on x86-64), or "none": reported in the hello
 * frame, so a board's speed can be read against what its CPU offered. */
const char *kernel_cpu_features(void);

/* The scalar reference kernels (kernels/scalar.c). */
void kernel_scalar_matvec_f32(float *out, const float *w, const float *x, int rows, int cols);
void kernel_scalar_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                               const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_quantize_q8_0(int8_t *qs, float *d, const float *x, int n);
void kernel_scalar_swiglu(float *up, const float *gate, int n);
void kernel_scalar_gelu_tanh_mul(float *up, const float *gate, int n);
void kernel_scalar_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                                   float beta, float *memory, int key_dim, int value_dim);
void kernel_scalar_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale);
void kernel_scalar_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q,
                                 const float *values, int stride, int n, int head_dim);
void kernel_scalar_widen_f16(float *out, const KernelHalf *h, int n);
void kernel_scalar_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n);

#endif
