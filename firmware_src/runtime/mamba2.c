#include "mamba2.h"

#include <string.h>

#include "matmul.h"
#include "ops.h"

#if COLIBRI_N_MAMBA_LAYERS > 0

#define INNER (COLIBRI_MAMBA_HEADS * COLIBRI_MAMBA_HEAD_DIM)
#define CONV_DIM (INNER + 2 * COLIBRI_MAMBA_GROUPS * COLIBRI_MAMBA_STATE)
#define PROJ (INNER + CONV_DIM + COLIBRI_MAMBA_HEADS) /* in_proj's rows: z, xBC, dt */
#define GROUP_WIDTH (INNER / COLIBRI_MAMBA_GROUPS)

void mamba2_reset(void)
{
    memset(colibri_linear_state, 0, sizeof colibri_linear_state);
}

/* In place on xbc[CONV_DIM]: each channel's taps over its window (the state's KERNEL - 1 inputs,
 * oldest first, then xbc), in tap order, plus its bias, then SiLU; the state moves on by one input. */
static void conv_token(const ColibriLayerWeights *lw, float *state, float *xbc)
{
    for (int c = 0; c < CONV_DIM; c++) {
        const float *taps = lw->ssm_conv + (int64_t)c * COLIBRI_MAMBA_CONV_KERNEL;
        const float input = xbc[c];
        float acc = 0.0f;
        for (int j = 0; j < COLIBRI_MAMBA_CONV_KERNEL; j++) {
            const float v = j < COLIBRI_MAMBA_CONV_KERNEL - 1 ? state[(int64_t)j * CONV_DIM + c] : input;
            const float term = taps[j] * v;
            acc = (j == 0) ? term : acc + term;
        }
        for (int j = 0; j + 1 < COLIBRI_MAMBA_CONV_KERNEL - 1; j++) {
            state[(int64_t)j * CONV_DIM + c] = state[(int64_t)(j + 1) * CONV_DIM + c];
        }
        if (COLIBRI_MAMBA_CONV_KERNEL > 1) {
            state[(int64_t)(COLIBRI_MAMBA_CONV_KERNEL - 2) * CONV_DIM + c] = input;
        }
        xbc[c] = op_silu(acc + lw->ssm_conv_bias[c]);
    }
}

/* One token's selective state step of every head, into y[INNER]: dt = clamp(softplus(dt + dt_bias)),
 * S = S * exp(dt * A) + (dt * B) * x, y = sum_n S * C + x * D; then y * silu(z), normed per group. */
static void ssm_token(const ColibriLayerWeights *lw, float *ssm, const float *z, const float *xbc, const float *dt,
                      float *y)
{
    const float *x = xbc, *bs = xbc + INNER, *cs = xbc + INNER + COLIBRI_MAMBA_GROUPS * COLIBRI_MAMBA_STATE;
    for (int h = 0; h < COLIBRI_MAMBA_HEADS; h++) {
        const int g = h / (COLIBRI_MAMBA_HEADS / COLIBRI_MAMBA_GROUPS);
        const float *bg = bs + g * COLIBRI_MAMBA_STATE, *cg = cs + g * COLIBRI_MAMBA_STATE;
        float step = op_softplus(dt[h] + lw->ssm_dt_bias[h]);
        if (step < COLIBRI_MAMBA_DT_MIN) {
            step = COLIBRI_MAMBA_DT_MIN;
        }
        if (COLIBRI_MAMBA_DT_MAX > 0.0f && step > COLIBRI_MAMBA_DT_MAX) {
            step = COLIBRI_MAMBA_DT_MAX;
        }
        const float decay = op_expf(step * lw->ssm_a[h]);
        for (int p = 0; p < COLIBRI_MAMBA_HEAD_DIM; p++) {
            const int i = h * COLIBRI_MAMBA_HEAD_DIM + p;
            float *s = ssm + (int64_t)i * COLIBRI_MAMBA_STATE;
            float acc = 0.0f;
            for (int k = 0; k < COLIBRI_MAMBA_STATE; k++) {
                s[k] = s[k] * decay + (step * bg[k]) * x[i];
                const float term = s[k] * cg[k];
                acc = (k == 0) ? term : acc + term;
            }
            y[i] = acc + x[i] * lw->ssm_d[h];
        }
    }
    for (int i = 0; i < INNER; i++) {
        y[i] = y[i] * op_silu(z[i]);
    }
    for (int g = 0; g < COLIBRI_MAMBA_GROUPS; g++) {
        float *yg = y + g * GROUP_WIDTH;
        op_rmsnorm(yg, yg, lw->ssm_norm + g * GROUP_WIDTH, GROUP_WIDTH, COLIBRI_RMS_NORM_EPS);
    }
}

void mamba2_layer(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int n)
{
    float *proj = (float *)(colibri_scratch + COLIBRI_SCRATCH_SSM_PROJ_OFFSET);
    float *y = (float *)(colibri_scratch + COLIBRI_SCRATCH_SSM_Y_OFFSET);
    float *conv_state = colibri_linear_state + colibri_linear_state_offset[layer];
    float *ssm = conv_state + (int64_t)(COLIBRI_MAMBA_CONV_KERNEL - 1) * CONV_DIM;
    const MatmulInput xn = matmul_input(b, b->xn, n, COLIBRI_DIM);
    matmul(proj, &xn, &lw->ssm_in, NULL, PROJ);
    for (int t = 0; t < n; t++) {
        float *row = proj + (int64_t)t * PROJ;
        conv_token(lw, conv_state, row + INNER);
        ssm_token(lw, ssm, row, row + INNER, row + INNER + CONV_DIM, y + (int64_t)t * INNER);
    }
    const MatmulInput gated = matmul_input(b, y, n, INNER);
    matmul(b->proj, &gated, &lw->ssm_out, NULL, COLIBRI_DIM);
}

#endif
