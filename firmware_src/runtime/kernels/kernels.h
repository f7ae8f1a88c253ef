/* The kernel interface: the only operations whose speed matters, one implementation per ISA.
 *
 * kernels/scalar.c (kernel_scalar_*) is the reference every other implementation is tested
 * against; a faster kernel must return the same bits (docs/numerics.md): integer dot products
 * within a q8_0 block, then the block terms summed in float32 along the fixed reduction tree
 * below (KERNEL_PARTIALS partial sums per row, combined in order), and sequential float32 sums
 * for f32 rows and attention. A board's kernel list names scalar.c plus one kernel set: an
 * ISA file (x86_avx2.c, arm_neon.c, rv32.c) or generic.c. A set defines the entry points it
 * makes faster, says so with KERNEL_HAS_<ENTRY> and includes fallback.h, which defines
 * every entry point it left out: the scalar reference, or for the batched products, tiles of rows
 * over the set's own matvec. So no set restates what it does not change. */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

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

/* Attention of one query head over n positions of the KV cache: position i's key (value) is at
 * keys (values) + ((first_slot + i) % slots) * stride, head_dim floats; the cache is a ring.
 *   scores: att[i] = (q . k_i) * scale, the dot product summed over j in order;
 *   mix:    out[j] = sum over i in order of p[i] * v_i[j].
 * Each sum starts from -0.0f, which the first term replaces exactly. */
void kernel_attention_scores(float *att, const float *q, const float *keys, int first_slot, int slots, int n,
                             int stride, int head_dim, float scale);
void kernel_attention_mix(float *out, const float *p, const float *values, int first_slot, int slots, int n,
                          int stride, int head_dim);

/* SwiGLU: up[i] = silu(gate[i]) * up[i], silu being op_silu (ops.c) bit for bit. */
void kernel_swiglu(float *up, const float *gate, int n);

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
void kernel_scalar_quantize_q8_0(int8_t *qs, float *d, const float *x, int n);
void kernel_scalar_swiglu(float *up, const float *gate, int n);
void kernel_scalar_attention_scores(float *att, const float *q, const float *keys, int first_slot, int slots, int n,
                                    int stride, int head_dim, float scale);
void kernel_scalar_attention_mix(float *out, const float *p, const float *values, int first_slot, int slots, int n,
                                 int stride, int head_dim);

#endif
