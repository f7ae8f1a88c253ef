#include "deltanet.h"

#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"

#if COLIBRI_N_LINEAR_LAYERS > 0

#define KEYS_PER_VALUE_HEAD (COLIBRI_LINEAR_V_HEADS / COLIBRI_LINEAR_K_HEADS) /* value heads per key head */

void deltanet_reset(void)
{
    memset(colibri_linear_state, 0, sizeof colibri_linear_state);
}

void deltanet_token(const ColibriLayerWeights *lw, int layer, float *qkv, const float *z, const float *b,
                    const float *a, float *out, float *memory)
{
    float *conv_state = colibri_linear_state + colibri_linear_state_offset[layer];
    float *delta_state = conv_state + COLIBRI_LINEAR_CONV_STATE_FLOATS;
    op_conv_step(qkv, conv_state, lw->lin_conv, COLIBRI_LINEAR_CONV_DIM, COLIBRI_LINEAR_CONV_KERNEL);
    float *q = qkv;
    float *k = qkv + COLIBRI_LINEAR_KEY_DIM;
    const float *v = qkv + 2 * COLIBRI_LINEAR_KEY_DIM;
    for (int h = 0; h < COLIBRI_LINEAR_K_HEADS; h++) {
        float *qh = q + h * COLIBRI_LINEAR_K_DIM;
        op_l2norm(qh, COLIBRI_LINEAR_K_DIM);
        for (int i = 0; i < COLIBRI_LINEAR_K_DIM; i++) {
            qh[i] = qh[i] * COLIBRI_LINEAR_Q_SCALE;
        }
        op_l2norm(k + h * COLIBRI_LINEAR_K_DIM, COLIBRI_LINEAR_K_DIM);
    }
    for (int h = 0; h < COLIBRI_LINEAR_V_HEADS; h++) {
        const float beta = op_sigmoid(b[h]);
        const float rate = lw->lin_decay_scale[h] * op_softplus(a[h] + lw->lin_dt_bias[h]);
        const float decay = op_expf(rate);
        const int key_head = h / KEYS_PER_VALUE_HEAD;
        float *oh = out + h * COLIBRI_LINEAR_V_DIM;
        kernel_delta_rule_step(oh, delta_state + (int64_t)h * COLIBRI_LINEAR_K_DIM * COLIBRI_LINEAR_V_DIM,
                           q + key_head * COLIBRI_LINEAR_K_DIM, k + key_head * COLIBRI_LINEAR_K_DIM,
                           v + h * COLIBRI_LINEAR_V_DIM, decay, beta, memory, COLIBRI_LINEAR_K_DIM,
                           COLIBRI_LINEAR_V_DIM);
        op_gated_rmsnorm(oh, lw->lin_norm, z + h * COLIBRI_LINEAR_V_DIM, COLIBRI_LINEAR_V_DIM, COLIBRI_RMS_NORM_EPS);
    }
}

#endif
