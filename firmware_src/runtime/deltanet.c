#include "deltanet.h"

#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"
#include "parallel.h"

#if COLIBRI_N_LINEAR_LAYERS > 0

#define KEYS_PER_VALUE_HEAD (COLIBRI_LINEAR_V_HEADS / COLIBRI_LINEAR_K_HEADS) /* value heads per key head */

void deltanet_reset(void)
{
    memset(colibri_linear_state, 0, sizeof colibri_linear_state);
}

/* The value heads of one token, for the heads a thread takes: each head reads its key head's q
 * and k and updates only its own state, so the heads split over threads with the same bits. */
typedef struct {
    const ColibriLayerWeights *lw;
    float *delta_state;
    const float *qkv, *z, *b, *a;
    float *out, *memory;
} ValueHeadsJob;

static void value_heads(void *ctx, int h_begin, int h_end)
{
    const ValueHeadsJob *j = ctx;
    const float *q = j->qkv;
    const float *k = j->qkv + COLIBRI_LINEAR_KEY_DIM;
    const float *v = j->qkv + 2 * COLIBRI_LINEAR_KEY_DIM;
    for (int h = h_begin; h < h_end; h++) {
        const float beta = op_sigmoid(j->b[h]);
        const float rate = j->lw->lin_decay_scale[h] * op_softplus(j->a[h] + j->lw->lin_dt_bias[h]);
        const float decay = op_expf(rate);
        const int key_head = h / KEYS_PER_VALUE_HEAD;
        float *oh = j->out + h * COLIBRI_LINEAR_V_DIM;
        kernel_delta_rule_step(oh, j->delta_state + (int64_t)h * COLIBRI_LINEAR_K_DIM * COLIBRI_LINEAR_V_DIM,
                               q + key_head * COLIBRI_LINEAR_K_DIM, k + key_head * COLIBRI_LINEAR_K_DIM,
                               v + h * COLIBRI_LINEAR_V_DIM, decay, beta, j->memory + h * COLIBRI_LINEAR_V_DIM,
                               COLIBRI_LINEAR_K_DIM, COLIBRI_LINEAR_V_DIM);
        op_gated_rmsnorm(oh, j->lw->lin_norm, j->z + h * COLIBRI_LINEAR_V_DIM, COLIBRI_LINEAR_V_DIM,
                         COLIBRI_RMS_NORM_EPS);
    }
}

/* Below this many state updates a token's heads are not worth waking the other threads for. */
#define PARALLEL_MIN_STATE_VALUES 32768

void deltanet_token(const ColibriLayerWeights *lw, int layer, float *qkv, const float *z, const float *b,
                    const float *a, float *out, float *memory)
{
    float *conv_state = colibri_linear_state + colibri_linear_state_offset[layer];
    float *delta_state = conv_state + COLIBRI_LINEAR_CONV_STATE_FLOATS;
    op_conv_step(qkv, conv_state, lw->lin_conv, COLIBRI_LINEAR_CONV_DIM, COLIBRI_LINEAR_CONV_KERNEL);
    float *q = qkv;
    float *k = qkv + COLIBRI_LINEAR_KEY_DIM;
    for (int h = 0; h < COLIBRI_LINEAR_K_HEADS; h++) {
        float *qh = q + h * COLIBRI_LINEAR_K_DIM;
        op_l2norm(qh, COLIBRI_LINEAR_K_DIM);
        for (int i = 0; i < COLIBRI_LINEAR_K_DIM; i++) {
            qh[i] = qh[i] * COLIBRI_LINEAR_Q_SCALE;
        }
        op_l2norm(k + h * COLIBRI_LINEAR_K_DIM, COLIBRI_LINEAR_K_DIM);
    }
    ValueHeadsJob job = {lw, delta_state, qkv, z, b, a, out, memory};
    if (COLIBRI_LINEAR_DELTA_STATE_FLOATS < PARALLEL_MIN_STATE_VALUES) {
        value_heads(&job, 0, COLIBRI_LINEAR_V_HEADS);
    } else {
        parallel_for(value_heads, &job, COLIBRI_LINEAR_V_HEADS);
    }
}

#endif
