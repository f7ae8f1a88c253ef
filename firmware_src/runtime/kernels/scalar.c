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

/* The product of a kept GGUF type: each row's 32-value blocks unpacked one at a time, their terms
 * added along the reduction tree. Inlined into each type's entry below with its unpack function
 * and term shape as constants, so each is a plain loop over its own decoding. */
static inline __attribute__((always_inline)) void scalar_matvec_blocks(float *out, const uint8_t *w, const int8_t *x_qs,
                                                                       const float *x_d, int rows, int cols,
                                                                       int block_values, int block_bytes,
                                                                       void (*unpack)(const uint8_t *, int, KernelUnpacked *),
                                                                       int scales, int affine)
{
    const int nb = cols / KERNEL_QK;
    const int64_t row_bytes = (int64_t)(cols / block_values) * block_bytes;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + (int64_t)r * row_bytes;
        float part[KERNEL_PARTIALS];
        for (int k = 0; k < KERNEL_PARTIALS; k++) {
            part[k] = -0.0f;
        }
        for (int b = 0; b < nb; b++) {
            KernelUnpacked u;
            unpack(row, b, &u);
            const float term = kernel_unpacked_term(&u, x_qs + b * KERNEL_QK, x_d[b], scales, affine);
            part[b % KERNEL_PARTIALS] = part[b % KERNEL_PARTIALS] + term;
        }
        out[r] = kernel_sum_partials(part);
    }
}

void kernel_scalar_matvec_q5_0(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q5_0_VALUES, KERNEL_Q5_0_BYTES, kernel_q5_0_unpack,
                         KERNEL_ONE_SCALE, 0);
}

void kernel_scalar_matvec_q5_1(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q5_1_VALUES, KERNEL_Q5_1_BYTES, kernel_q5_1_unpack,
                         KERNEL_ONE_SCALE, 1);
}

void kernel_scalar_matvec_q4_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q4_K_VALUES, KERNEL_Q4_K_BYTES, kernel_q4_k_unpack,
                         KERNEL_ONE_SCALE, 1);
}

void kernel_scalar_matvec_q5_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q5_K_VALUES, KERNEL_Q5_K_BYTES, kernel_q5_k_unpack,
                         KERNEL_ONE_SCALE, 1);
}

void kernel_scalar_matvec_q6_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q6_K_VALUES, KERNEL_Q6_K_BYTES, kernel_q6_k_unpack,
                         KERNEL_TWO_SCALES, 0);
}

void kernel_scalar_matvec_q3_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q3_K_VALUES, KERNEL_Q3_K_BYTES, kernel_q3_k_unpack,
                         KERNEL_TWO_SCALES, 0);
}

void kernel_scalar_matvec_q2_k(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_Q2_K_VALUES, KERNEL_Q2_K_BYTES, kernel_q2_k_unpack,
                         KERNEL_TWO_SCALES, 1);
}

void kernel_scalar_matvec_iq4_nl(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_IQ4_NL_VALUES, KERNEL_IQ4_NL_BYTES, kernel_iq4_nl_unpack,
                         KERNEL_ONE_SCALE, 0);
}

void kernel_scalar_matvec_iq4_xs(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_IQ4_XS_VALUES, KERNEL_IQ4_XS_BYTES, kernel_iq4_xs_unpack,
                         KERNEL_ONE_SCALE, 0);
}

void kernel_scalar_matvec_mxfp4(float *out, const uint8_t *w, const int8_t *x_qs, const float *x_d, int rows, int cols)
{
    scalar_matvec_blocks(out, w, x_qs, x_d, rows, cols, KERNEL_MXFP4_VALUES, KERNEL_MXFP4_BYTES, kernel_mxfp4_unpack,
                         KERNEL_ONE_SCALE, 0);
}

void kernel_scalar_swiglu(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_silu(gate[i]) * up[i];
    }
}

void kernel_scalar_gelu_tanh_mul(float *up, const float *gate, int n)
{
    for (int i = 0; i < n; i++) {
        up[i] = op_gelu_tanh(gate[i]) * up[i];
    }
}

void kernel_scalar_delta_rule_step(float *out, float *state, const float *q, const float *k, const float *v, float decay,
                                   float beta, float *memory, int key_dim, int value_dim)
{
    op_delta_rule_step(out, state, q, k, v, decay, beta, memory, key_dim, value_dim);
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

void kernel_scalar_attention_scores(float *att, int att_stride, const float *q, int q_stride, int n_q,
                                    const float *keys, int stride, int n, int head_dim, float scale)
{
    for (int a = 0; a < n_q; a++) {
        for (int i = 0; i < n; i++) {
            const float *k = keys + (int64_t)i * stride;
            float s = -0.0f;
            for (int j = 0; j < head_dim; j++) {
                s = s + q[(int64_t)a * q_stride + j] * k[j];
            }
            att[(int64_t)a * att_stride + i] = s * scale;
        }
    }
}

void kernel_scalar_attention_mix(float *out, int out_stride, const float *p, int p_stride, int n_q,
                                 const float *values, int stride, int n, int head_dim)
{
    for (int a = 0; a < n_q; a++) {
        for (int i = 0; i < n; i++) {
            const float *v = values + (int64_t)i * stride;
            for (int j = 0; j < head_dim; j++) {
                out[(int64_t)a * out_stride + j] = out[(int64_t)a * out_stride + j] + p[(int64_t)a * p_stride + i] * v[j];
            }
        }
    }
}

void kernel_scalar_widen_f16(float *out, const KernelHalf *h, int n)
{
    for (int i = 0; i < n; i++) {
        out[i] = kernel_half_to_float(h[i]);
    }
}

void kernel_scalar_widen_q8_0(float *out, const int8_t *qs, const KernelHalf *d, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float scale = kernel_half_to_float(d[b]);
        for (int i = 0; i < KERNEL_QK; i++) {
            out[b * KERNEL_QK + i] = (float)qs[b * KERNEL_QK + i] * scale;
        }
    }
}

void kernel_round_f16(KernelHalf *out, const float *x, int n)
{
    for (int i = 0; i < n; i++) {
        out[i] = kernel_float_to_half(x[i]);
    }
}

void kernel_round_q8_0(int8_t *qs, KernelHalf *d, const float *x, int n)
{
    for (int b = 0; b < n / KERNEL_QK; b++) {
        const float *xb = x + b * KERNEL_QK;
        float amax = 0.0f;
        for (int i = 0; i < KERNEL_QK; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        d[b] = kernel_float_to_half(amax / 127.0f);
        const float scale = kernel_half_to_float(d[b]);
        const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < KERNEL_QK; i++) {
            float q = (xb[i] * inverse + 12582912.0f) - 12582912.0f; /* round half to even */
            q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
            qs[b * KERNEL_QK + i] = (int8_t)(int32_t)q;
        }
    }
}
