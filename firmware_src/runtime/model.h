/* The forward pass of a batch of tokens, specialised at compile time by the generated model_def.h. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include <stdint.h>

#include "model_def.h"

/* Views into the generated scratch arena (offsets from model_def.h). The shapes are in model_def.h's
 * constants, row-major; BATCH is COLIBRI_PREFILL_BATCH: a forward pass of n tokens uses the first n
 * rows of the per-token buffers (decoding: the first), and FFN the widest of COLIBRI_FFN_DIM,
 * COLIBRI_EXPERT_FFN_DIM and COLIBRI_SHARED_FFN_DIM. */
typedef struct {
    float *x;        /* [BATCH][DIM] residual stream, per token of the batch */
    float *xn;       /* [BATCH][DIM] normalised input of the current block */
    float *q;        /* [BATCH][Q_DIM] queries, heads side by side (MAX_Q_DIM: the widest layer's) */
    float *k;        /* [BATCH][KV_DIM] keys, before they are copied into the KV cache (MAX_KV_DIM) */
    float *v;        /* [BATCH][KV_DIM] values, likewise */
    float *att;      /* [ATTENTION_BLOCK][N_HEADS][N_CTX] attention scores over the positions each query
                      * token of a block sees, then their softmax; a row per token and head */
    float *kv_tile;  /* [N_KV_HEADS][KV_TILE][HEAD_DIM] keys or values of an f16 or q8_0 cache widened to
                      * float32, a tile per KV head, as the KV heads run in parallel (f32 caches: NULL) */
    float *attn_out; /* [BATCH][Q_DIM] attention output of all heads, the input of wo */
    float *proj;     /* [BATCH][DIM] output of wo or w_down, before it is added to x */
    float *gate;     /* [BATCH][FFN] FFN gate projection (of the dense FFN or of one expert) */
    float *up;       /* [BATCH][FFN] FFN up projection, then the gated product, the input of w_down */
    float *logits;   /* [VOCAB] logits after the last token of the pass (COLIBRI_LOGITS_LAST) */
    float *spec_logits; /* [SPEC_TOKENS][VOCAB] logits after each token of the pass (COLIBRI_LOGITS_EVERY_TOKEN:
                         * speculative decoding's check of a draft; NULL where the plan has none) */
    float *probs;    /* [VOCAB] sampling: probabilities, sorted */
    int32_t *cand;   /* [VOCAB] sampling: the token ids of probs, in the same order */
    int8_t *act_qs;  /* [n tokens][cols] q8_0 quants of the current matmul input, cols <= MAX_INPUT (builds
                      * with integer weights only; else NULL) */
    float *act_d;    /* [n tokens][cols / 32] their block scales (likewise) */
    /* MoE builds only (else NULL); a batch's tokens go through the experts one at a time. */
    float *router_logits;  /* [N_EXPERTS] one token's router logits, then probabilities (a sigmoid or
                            * grouped router: N_EXPERTS more, its choice scores) */
    float *moe_out;        /* [BATCH][DIM] weighted sum of the selected experts' outputs */
    float *expert_terms;   /* [EXPERTS_PER_TOKEN (+ 1 with a shared expert)][DIM] each selected expert's
                            * weighted output, the shared expert's last, summed in rank order at the end */
    float *expert_weights; /* [EXPERTS_PER_TOKEN] their routing weights */
    int32_t *expert_ids;   /* [EXPERTS_PER_TOKEN] the experts selected for this token, best first */
    int32_t *expert_counts; /* [N_LAYERS][N_EXPERTS] how often each expert was selected in this request
                             * (the experts frames) */
    /* Gated attention (else NULL): the output gate's logits, [BATCH][Q_DIM]. */
    float *q_gate;
    /* Gated DeltaNet builds only (else NULL); the recurrence runs token after token. */
    float *lin_qkv;    /* [BATCH][LINEAR_CONV_DIM] q, k, v projections, then convolved */
    float *lin_z;      /* [BATCH][LINEAR_VALUE_DIM] output gate projection */
    float *lin_b;      /* [BATCH][LINEAR_V_HEADS] beta projection */
    float *lin_a;      /* [BATCH][LINEAR_V_HEADS] decay projection */
    float *lin_out;    /* [BATCH][LINEAR_VALUE_DIM] delta-rule output, gated-normed: the input of out_proj */
    float *lin_memory; /* [LINEAR_V_HEADS][LINEAR_V_DIM] each value head's state times its key: a row per
                        * head, as the heads run in parallel */
    /* Per-layer inputs (Gemma 4; else NULL). */
    float *ple;      /* [BATCH][N_LAYERS][PLE_DIM] every layer's per-layer input, made once per token */
    float *ple_gate; /* [BATCH][PLE_DIM] a layer's gate, then times its slice: the input of ple_proj */
    float *ple_row;  /* [N_LAYERS * PLE_DIM] one token's ple_embed row */
    /* Gemma 4's MoE block (else NULL). */
    float *dense_out; /* [BATCH][DIM] the dense FFN's normed output, beside the experts' */
    float *router_in; /* [DIM] one token's router input */
    /* The first layer whose output (the residual stream of the pass's tokens) held a NaN or an
     * infinity since colibri_buffers_init, or -1: where a non-finite logit came from. */
    int nonfinite_layer;
} ColibriBuffers;

void colibri_buffers_init(ColibriBuffers *b);

/* What a forward pass computes after its last layer. */
enum {
    COLIBRI_LOGITS_NONE = 0,       /* nothing: a prompt batch before the last */
    COLIBRI_LOGITS_LAST = 1,       /* b->logits: the next-token logits after the last token */
    COLIBRI_LOGITS_EVERY_TOKEN = 2 /* b->spec_logits: after each of the n <= COLIBRI_SPEC_TOKENS tokens */
};

/* Run the n tokens (1 <= n <= COLIBRI_PREFILL_BATCH) at positions pos .. pos + n - 1 (all below
 * COLIBRI_N_CTX) through the model, filling the KV cache; want_logits says which logits follow
 * (COLIBRI_LOGITS_*): those after token t of a pass are the bits a pass of that token alone gives
 * (docs/numerics.md, "Batches"). Decoding passes one token; the prompt goes in batches.
 * Returns 0, or the error code of an expert that could not be brought in (runtime/expert_cache.h):
 * the pass stops there and its results are not to be used. */
int colibri_forward(const ColibriWeights *w, ColibriBuffers *b, const int32_t *tokens, int n, int32_t pos,
                    int want_logits);

#endif
