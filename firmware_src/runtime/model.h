/* The forward pass of a batch of tokens, specialised at compile time by the generated model_def.h. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include <stdint.h>

#include "model_def.h"

/* Views into the generated scratch arena (offsets from model_def.h). */
typedef struct {
    float *x, *xn, *q, *k, *v, *att, *attn_out, *proj, *gate, *up, *logits, *probs;
    int32_t *cand;
    int8_t *act_qs; /* q8_0 builds only */
    float *act_d;
    float *router_logits, *moe_out, *expert_terms, *expert_weights; /* MoE builds only */
    int32_t *expert_ids, *expert_counts;
} ColibriBuffers;

void colibri_buffers_init(ColibriBuffers *b);

/* Run the n tokens (1 <= n <= COLIBRI_PREFILL_BATCH) at positions pos .. pos + n - 1 (all below
 * COLIBRI_N_CTX) through the model, filling the KV cache; with want_logits, b->logits holds the
 * logits that follow the last of them. Decoding passes one token; the prompt goes in batches.
 * Returns 0, or the error code of an expert that could not be brought in (runtime/expert_cache.h):
 * the pass stops there and its results are not to be used. */
int colibri_forward(const ColibriWeights *w, ColibriBuffers *b, const int32_t *tokens, int n, int32_t pos,
                    int want_logits);

#endif
