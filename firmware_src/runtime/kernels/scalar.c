/* The scalar reference kernels: the plainest loops that follow docs/numerics.md, which every
 * kernel set is tested against and fallback.h falls back to. */
#include "kernels.h"
#include "../ops.h"

void kernel_scalar_matvec_f32(float *out, const float *w, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        const float *row = w + (int64_t)r * cols;
        float acc = row[0] * x[0];
        for (int j = 1; j < cols; j++) {
            acc = acc + row[j] * x[j];
        }
        out[r] = acc;
    }
}

void kernel_scalar_matvec_q8_0(float *out, const int8_t *w_qs, const KernelHalf *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const int8_t *wq = w_qs + (int64_t)r * cols;
        const KernelHalf *wd = w_d + (int64_t)r * nb;
        float part[KERNEL_PARTIALS];
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[k] = -0.0f;
        }
        for (int b = 0; b < nb; b++) {
            int32_t isum = 0;
            for (int i = 0; i < KERNEL_QK; i++) {
                isum += (int32_t)wq[b * KERNEL_QK + i] * (int32_t)x_qs[b * KERNEL_QK + i];
            }
            float term = (float)isum * (kernel_half_to_float(wd[b]) * x_d[b]);
            part[b % KERNEL_PARTIALS] = part[b % KERNEL_PARTIALS] + term;
        }
        out[r] = kernel_sum_partials(part);
    }
}

void kernel_scalar_matvec_q4_0(float *out, const uint8_t *w_q4, const KernelHalf *w_d,
                               const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const uint8_t *wq = w_q4 + (int64_t)r * (cols / 2);
        const KernelHalf *wd = w_d + (int64_t)r * nb;
        float part[KERNEL_PARTIALS];
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[k] = -0.0f;
        }
        for (int b = 0; b < nb; b++) {
            const uint8_t *wb = wq + b * (KERNEL_QK / 2);
            const int8_t *xb = x_qs + b * KERNEL_QK;
            int32_t isum = 0;
            for (int j = 0; j < KERNEL_QK / 2; j++) {
                isum += ((int32_t)(wb[j] & 0x0F) - 8) * (int32_t)xb[j];
                isum += ((int32_t)(wb[j] >> 4) - 8) * (int32_t)xb[j + KERNEL_QK / 2];
            }
            float term = (float)isum * (kernel_half_to_float(wd[b]) * x_d[b]);
            part[b % KERNEL_PARTIALS] = part[b % KERNEL_PARTIALS] + term;
        }
        out[r] = kernel_sum_partials(part);
    }
}

void kernel_scalar_matvec_q4_1(float *out, const uint8_t *w_q4, const KernelHalf *w_d, const KernelHalf *w_m,
                               const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    const int nb = cols / KERNEL_QK;
    for (int r = 0; r < rows; r++) {
        const uint8_t *wq = w_q4 + (int64_t)r * (cols / 2);
        const KernelHalf *wd = w_d + (int64_t)r * nb;
        const KernelHalf *wm = w_m + (int64_t)r * nb;
        KernelQ41Sum sum = kernel_q4_1_sum_start();
        for (int b = 0; b < nb; b++) {
            const uint8_t *wb = wq + b * (KERNEL_QK / 2);
            const int8_t *xb = x_qs + b * KERNEL_QK;
            int32_t isum = 0, xsum = 0;
            for (int j = 0; j < KERNEL_QK / 2; j++) {
                isum += (int32_t)(wb[j] & 0x0F) * (int32_t)xb[j];
                isum += (int32_t)(wb[j] >> 4) * (int32_t)xb[j + KERNEL_QK / 2];
            }
            for (int j = 0; j < KERNEL_QK; j++) {
                xsum += xb[j];
            }
            kernel_q4_1_sum_add(&sum, b, kernel_q4_1_term(isum, xsum, kernel_half_to_float(wd[b]), kernel_half_to_float(wm[b]), x_d[b]));
        }
        out[r] = kernel_q4_1_sum_end(&sum);
    }
}

void kernel_scalar_swiglu(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_silu(gate[i]) * up[i];
    }
}

void kernel_scalar_quantize_q8_0(int8_t *qs, float *d, const float *x, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        float amax = 0.0f;
        for (int i = 0; i < KERNEL_QK; i++) {
            float a = xb[i] < 0.0f ? -xb[i] : xb[i];
            if (a > amax) {
                amax = a;
            }
        }
        float scale = amax / 127.0f;
        float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        for (int i = 0; i < KERNEL_QK; i++) {
            float q = op_round_even(xb[i] * inv);
            if (q > 127.0f) {
                q = 127.0f;
            } else if (q < -127.0f) {
                q = -127.0f;
            }
            qs[b * KERNEL_QK + i] = (int8_t)(int32_t)q;
        }
    }
}

void kernel_scalar_attention_scores(float *att, const float *q, const float *keys, int first_slot, int slots, int n,
                                    int stride, int head_dim, float scale)
{
    for (int i = 0; i < n; i++) {
        const float *k = keys + (int64_t)((first_slot + i) % slots) * stride;
        float s = -0.0f;
        for (int j = 0; j < head_dim; j++) {
            s = s + q[j] * k[j];
        }
        att[i] = s * scale;
    }
}

void kernel_scalar_attention_mix(float *out, const float *p, const float *values, int first_slot, int slots, int n,
                                 int stride, int head_dim)
{
    for (int j = 0; j < head_dim; j++) {
        out[j] = -0.0f;
    }
    for (int i = 0; i < n; i++) {
        const float *v = values + (int64_t)((first_slot + i) % slots) * stride;
        for (int j = 0; j < head_dim; j++) {
            out[j] = out[j] + p[i] * v[j];
        }
    }
}
