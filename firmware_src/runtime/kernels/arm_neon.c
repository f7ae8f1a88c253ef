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

/* The exact int32 sum of a block's 32 products, weights given as two vectors of 16. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static int32_t block_sum_dotprod(int8x16_t w0, int8x16_t w1,
                                                                                   const int8_t *x)
{
    int32x4_t acc = vdupq_n_s32(0);
    acc = vdotq_s32(acc, w0, vld1q_s8(x));
    acc = vdotq_s32(acc, w1, vld1q_s8(x + 16));
    return vaddvq_s32(acc);
}

static int32_t block_sum_neon(int8x16_t w0, int8x16_t w1, const int8_t *x)
{
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
            const int8x16_t w0 = vld1q_s8(w), w1 = vld1q_s8(w + 16);
            int32_t isum = dotprod ? block_sum_dotprod(w0, w1, x) : block_sum_neon(w0, w1, x);
            float term = (float)isum * (wd[b] * x_d[b]);
            acc = (b == 0) ? term : acc + term;
        }
        out[r] = acc;
    }
}

/* q4_0 rows: each block's nibbles become the int8 values quant - 8 (low nibbles are values 0..15,
 * high nibbles 16..31), then the q8_0 block sum. */
void kernel_matvec_q4_0(float *out, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    const int dotprod = have_dotprod();
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int r = 0; r < rows; r++) {
        const uint8_t *wq = w_q4 + (int64_t)r * (cols / 2);
        const float *wd = w_d + (int64_t)r * nb;
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) {
            const uint8x16_t packed = vld1q_u8(wq + b * (KERNEL_QK / 2));
            const int8x16_t w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, low4)), eight);
            const int8x16_t w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), eight);
            const int8_t *x = x_qs + b * KERNEL_QK;
            int32_t isum = dotprod ? block_sum_dotprod(w0, w1, x) : block_sum_neon(w0, w1, x);
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

void kernel_matmul_q4_0(float *out, int out_stride, const uint8_t *w_q4, const float *w_d,
                        const int8_t *x_qs, const float *x_d, int n_tok, int rows, int cols)
{
    kernel_tiled_matmul_q4_0(out, out_stride, w_q4, w_d, x_qs, x_d, n_tok, rows, cols);
}

void kernel_swiglu(float *up, const float *gate, int n)
{
    kernel_scalar_swiglu(up, gate, n);
}
