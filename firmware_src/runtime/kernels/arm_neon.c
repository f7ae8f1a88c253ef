/* aarch64 kernels: NEON integer dot products for q8_0, with the dot-product extension (SDOT) when
 * the CPU has it (checked at run time through the kernel's hwcaps), plain NEON widening multiplies
 * otherwise. Same bits as kernels/scalar.c: each block's int32 sum is exact and the float terms
 * (float)isum * (w_d * x_d) are added to the row's sum one block after another. */
#include <arm_neon.h>
#include <sys/auxv.h>

#include "kernels.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) /* Linux uapi: the CPU has SDOT/UDOT */
#endif

static int have_dotprod(void)
{
    static int known = -1;
    if (known < 0) {
        known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? 1 : 0;
    }
    return known;
}

const char *kernel_set(void)
{
    return have_dotprod() ? "neon-dotprod" : "neon";
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static int32_t block_sum_dotprod(const int8_t *w, const int8_t *x)
{
    int32x4_t acc = vdupq_n_s32(0);
    acc = vdotq_s32(acc, vld1q_s8(w), vld1q_s8(x));
    acc = vdotq_s32(acc, vld1q_s8(w + 16), vld1q_s8(x + 16));
    return vaddvq_s32(acc);
}

static int32_t block_sum_neon(const int8_t *w, const int8_t *x)
{
    const int8x16_t w0 = vld1q_s8(w), w1 = vld1q_s8(w + 16);
    const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(w0), vget_high_s8(x0)));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
    acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(w1), vget_high_s8(x1)));
    return vaddvq_s32(acc);
}

void kernel_matvec_q8_0(float *out, const int8_t *w_qs, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int dotprod = have_dotprod();
    for (int r = 0; r < rows; r++) {
        const int8_t *wq = w_qs + (int64_t)r * cols;
        const float *wd = w_d + (int64_t)r * nb;
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const int8_t *w = wq + b * KERNEL_QK, *x = x_qs + b * KERNEL_QK;
            int32_t isum = dotprod ? block_sum_dotprod(w, x) : block_sum_neon(w, x);
            float term = (float)isum * (wd[b] * x_d[b]);
            acc = (b == 0) ? term : acc + term;
        }
        out[r] = acc;
    }
}

/* A row's f32 sum is sequential by definition; only the q8_0 path has a SIMD kernel here. */
void kernel_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    kernel_scalar_matvec_f32(out, w, x, rows, cols);
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
