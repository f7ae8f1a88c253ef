/* Gated DeltaNet (Qwen3.5's linear attention): the recurrence of one token of one layer, on the
 * layer's part of the fixed recurrent state arena (model_def.h: colibri_linear_state). */
#ifndef COLIBRI_DELTANET_H
#define COLIBRI_DELTANET_H

#include "model.h"

#if COLIBRI_N_LINEAR_LAYERS > 0
/* Every DeltaNet layer's state back to zero: a sequence starts at position 0. */
void deltanet_reset(void);

/* One token of DeltaNet layer `layer`, its projections already made: qkv[CONV_DIM] (overwritten),
 * z[VALUE_DIM], b[V_HEADS], a[V_HEADS]. The convolution and SiLU over q, k and v, l2-normalised q
 * (times 1 / sqrt(K_DIM)) and k, beta = sigmoid(b), the decay exp(decay_scale * softplus(a +
 * dt_bias)) (decay_scale = -exp(A_log), made at import), the delta rule per value head, the gated RMSNorm with z: out[VALUE_DIM], the input
 * of out_proj. memory: V_HEADS x V_DIM floats of scratch (a row per value head: the heads may run
 * on several threads). Nothing here depends on the position. */
void deltanet_token(const ColibriLayerWeights *lw, int layer, float *qkv, const float *z, const float *b,
                    const float *a, float *out, float *memory);
#endif

#endif
