/* The kernel entry points for boards without an ISA-specific set: the scalar kernels. */
#include "kernels.h"

const char *kernel_set(void)
{
    return "scalar";
}

void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    kernel_scalar_matvec_f32(out, w, x, rows, cols);
}

void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q8_0(out, w_qs, w_d, x_qs, x_d, rows, cols);
}

void kernel_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    kernel_scalar_quantize_q8_0(qs, d, x, n);
}

void kernel_matmul_f32(float *out, int out_stride, const float *w, const float *x, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_f32(out, out_stride, w, x, n_tok, rows, cols);
}

void kernel_matmul_q8_0(float *out, int out_stride, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q8_0(out, out_stride, w_qs, w_d, x_qs, x_d, n_tok, rows, cols);
}

void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    kernel_scalar_matvec_q4_0(out, w_q4, w_d, x_qs, x_d, rows, cols);
}

void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
}

void kernel_swiglu(float *up, const float *gate, int n)
{
    kernel_scalar_swiglu(up, gate, n);
}
