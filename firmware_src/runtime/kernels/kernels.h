/* The kernel interface: the only operations whose speed matters, one implementation per ISA.
 *
 * kernels/scalar.c (kernel_scalar_*) is the reference every other implementation is tested
 * against; a faster kernel must return the same bits (docs/numerics.md): integer dot products
 * within a q8_0 block, then float32 accumulation over blocks in order, and sequential float32
 * sums for f32 rows. A board's kernel list names scalar.c plus one file that provides the
 * kernel_* entry points: generic.c (the scalar kernels) or an ISA file such as x86_avx2.c,
 * which picks its SIMD code at run time when the CPU has it and the scalar kernels otherwise. */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stdint.h>

#define KERNEL_QK 32 /* values per q8_0 block */

/* out[r] = sum_j w[r*cols + j] * x[j], j ascending. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols);

/* out[r] = sum over blocks b ascending of (float)isum(r, b) * (w_d[r*nb + b] * x_d[b]),
 * where isum is the exact int32 dot product of the 32 quants of block b. cols % 32 == 0. */
void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols);

/* The q8_0 product with q4_0 weights: w_q4 holds rows x cols/2 bytes, byte j of each 16-byte block
 * holding the quants of values j (low nibble) and j + 16 (high nibble), each standing for the
 * int8 value quant - 8. The result is kernel_matvec_q8_0's on those int8 values, bit for bit. */
void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols);

/* The same products for n_tok inputs at once (batched prefill): for every token t < n_tok,
 * out[t * out_stride + r] is exactly what kernel_matvec_* gives for row r and token t's input
 * (x + t * cols; q8_0: x_qs + t * cols, x_d + t * cols / 32). Each weight row is read from memory
 * once for all the tokens instead of once per token. */
void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                       int cols);
void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);
void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);

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

/* Name of the kernel set in use, reported in the hello frame. */
const char *kernel_set(void);

/* The scalar reference kernels (kernels/scalar.c). */
void kernel_scalar_matvec_f32(float *out, const float *w, const float *x, int rows, int cols);
void kernel_scalar_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols);
void kernel_scalar_quantize_q8_0(int8_t *qs, float *d, const float *x, int n);
void kernel_scalar_swiglu(float *up, const float *gate, int n);

/* Batched products for kernel sets without a batched kernel of their own: the set's
 * kernel_matvec_* over tiles of rows small enough to stay in cache while every token passes. */
void kernel_tiled_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows,
                             int cols);
void kernel_tiled_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const float *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);
void kernel_tiled_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                              const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols);

#endif
