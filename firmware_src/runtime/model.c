/* The forward pass (model.h), as llama2.c's run.c has it: per layer a norm, the token mixer of the
 * layer's kind (attention over the KV cache, or Gated DeltaNet's linear attention), the residual,
 * a norm, the feed-forward block (a gated FFN, or a mixture of experts), the residual; then the
 * final norm and the logits. What a model lacks is compiled out by model_def.h's constants. */
#include "model.h"

#include <stddef.h>
#include <string.h>

#include "attention.h"
#include "checkpoint.h"
#include "deltanet.h"
#include "expert_cache.h"
#include "kernels/kernels.h"
#include "matmul.h"
#include "mla.h"
#include "ops.h"
#include "ranks.h"
#include "router.h"
#include "short_conv.h"
#include "mamba2.h"

void colibri_buffers_init(ColibriBuffers *b)
{
    uint8_t *s = colibri_scratch;
    b->x = (float *)(s + COLIBRI_SCRATCH_X_OFFSET);
    b->xn = (float *)(s + COLIBRI_SCRATCH_XN_OFFSET);
    b->q = (float *)(s + COLIBRI_SCRATCH_Q_OFFSET);
    b->k = (float *)(s + COLIBRI_SCRATCH_K_OFFSET);
    b->v = (float *)(s + COLIBRI_SCRATCH_V_OFFSET);
    b->att = (float *)(s + COLIBRI_SCRATCH_ATT_OFFSET);
#if COLIBRI_KV_TYPE != COLIBRI_KV_F32
    b->kv_tile = (float *)(s + COLIBRI_SCRATCH_KV_TILE_OFFSET);
#else
    b->kv_tile = NULL;
#endif
    b->attn_out = (float *)(s + COLIBRI_SCRATCH_ATTN_OUT_OFFSET);
    b->proj = (float *)(s + COLIBRI_SCRATCH_PROJ_OFFSET);
    b->gate = (float *)(s + COLIBRI_SCRATCH_GATE_OFFSET);
    b->up = (float *)(s + COLIBRI_SCRATCH_UP_OFFSET);
    b->logits = (float *)(s + COLIBRI_SCRATCH_LOGITS_OFFSET);
    b->probs = (float *)(s + COLIBRI_SCRATCH_PROBS_OFFSET);
    b->cand = (int32_t *)(s + COLIBRI_SCRATCH_CAND_OFFSET);
#if COLIBRI_N_EXPERTS > 0
    b->router_logits = (float *)(s + COLIBRI_SCRATCH_ROUTER_LOGITS_OFFSET);
    b->moe_out = (float *)(s + COLIBRI_SCRATCH_MOE_OUT_OFFSET);
    b->expert_terms = (float *)(s + COLIBRI_SCRATCH_EXPERT_TERMS_OFFSET);
    b->expert_ids = (int32_t *)(s + COLIBRI_SCRATCH_EXPERT_IDS_OFFSET);
    b->expert_weights = (float *)(s + COLIBRI_SCRATCH_EXPERT_WEIGHTS_OFFSET);
    b->expert_counts = (int32_t *)(s + COLIBRI_SCRATCH_EXPERT_COUNTS_OFFSET);
#else
    b->router_logits = b->moe_out = b->expert_terms = b->expert_weights = NULL;
    b->expert_ids = b->expert_counts = NULL;
#endif
#if COLIBRI_ATTN_OUTPUT_GATE
    b->q_gate = (float *)(s + COLIBRI_SCRATCH_Q_GATE_OFFSET);
#else
    b->q_gate = NULL;
#endif
#if COLIBRI_N_LINEAR_LAYERS > 0
    b->lin_qkv = (float *)(s + COLIBRI_SCRATCH_LIN_QKV_OFFSET);
    b->lin_z = (float *)(s + COLIBRI_SCRATCH_LIN_Z_OFFSET);
    b->lin_b = (float *)(s + COLIBRI_SCRATCH_LIN_B_OFFSET);
    b->lin_a = (float *)(s + COLIBRI_SCRATCH_LIN_A_OFFSET);
    b->lin_out = (float *)(s + COLIBRI_SCRATCH_LIN_OUT_OFFSET);
    b->lin_memory = (float *)(s + COLIBRI_SCRATCH_LIN_MEMORY_OFFSET);
#else
    b->lin_qkv = b->lin_z = b->lin_b = b->lin_a = b->lin_out = b->lin_memory = NULL;
#endif
#if COLIBRI_SPEC_TOKENS > 0
    b->spec_logits = (float *)(s + COLIBRI_SCRATCH_SPEC_LOGITS_OFFSET);
#else
    b->spec_logits = NULL;
#endif
#if COLIBRI_ACT_Q8_0
    b->act_qs = (int8_t *)(s + COLIBRI_SCRATCH_ACT_QS_OFFSET);
    b->act_d = (float *)(s + COLIBRI_SCRATCH_ACT_D_OFFSET);
#else
    b->act_qs = NULL;
    b->act_d = NULL;
#endif
#if COLIBRI_PLE_DIM > 0
    b->ple = (float *)(s + COLIBRI_SCRATCH_PLE_OFFSET);
    b->ple_gate = (float *)(s + COLIBRI_SCRATCH_PLE_GATE_OFFSET);
    b->ple_row = (float *)(s + COLIBRI_SCRATCH_PLE_ROW_OFFSET);
#else
    b->ple = b->ple_gate = b->ple_row = NULL;
#endif
#if COLIBRI_MOE_BESIDE_DENSE
    b->dense_out = (float *)(s + COLIBRI_SCRATCH_DENSE_OUT_OFFSET);
    b->router_in = (float *)(s + COLIBRI_SCRATCH_ROUTER_IN_OFFSET);
#else
    b->dense_out = b->router_in = NULL;
#endif
    b->nonfinite_layer = -1;
}

/* A token's embedding, scaled where the model scales it (COLIBRI_EMBED_SCALE). */
static void embed(float *x, const ColibriMatrix *m, int32_t token)
{
    embedding_row(x, m, token, COLIBRI_DIM);
    if (COLIBRI_EMBED_SCALE != 1.0f) {
        for (int i = 0; i < COLIBRI_DIM; i++) {
            x[i] = x[i] * COLIBRI_EMBED_SCALE;
        }
    }
}

/* One gated FFN on the n_tok rows of x (each COLIBRI_DIM wide) into b->proj:
 * down(act(gate x) * up x), act SiLU or GELU (tanh); or gpt-oss's clamped SwiGLU of gate and up. */
static void gated_ffn(ColibriBuffers *b, const ColibriMatrix *w_gate, const ColibriMatrix *w_up,
                      const ColibriMatrix *w_down, const float *b_gate, const float *b_up, const float *b_down,
                      const float *x, int n_tok, int inner)
{
    const MatmulInput in = matmul_input(b, x, n_tok, COLIBRI_DIM);
    matmul(b->gate, &in, w_gate, b_gate, inner);
    matmul(b->up, &in, w_up, b_up, inner);
#if COLIBRI_FFN_GELU_TANH
    kernel_gelu_tanh_mul(b->up, b->gate, n_tok * inner);
#elif COLIBRI_FFN_SWIGLU_CLAMPED
    for (int64_t i = 0; i < (int64_t)n_tok * inner; i++) {
        b->up[i] = op_swiglu_clamped(b->gate[i], b->up[i], COLIBRI_SWIGLU_ALPHA, COLIBRI_SWIGLU_LIMIT);
    }
#else
    kernel_swiglu(b->up, b->gate, n_tok * inner);
#endif
    const MatmulInput hidden = matmul_input(b, b->up, n_tok, inner);
    matmul(b->proj, &hidden, w_down, b_down, COLIBRI_DIM);
}

#if COLIBRI_N_EXPERTS > 0
/* The MoE layer after `layer`, or -1. */
static int next_moe_layer(int layer)
{
    for (int l = layer + 1; l < COLIBRI_N_LAYERS; l++) {
        if (colibri_layer_moe[l]) {
            return l;
        }
    }
    return -1;
}

/* Mixture of experts for one token, xn into out: the router's logits (plus its bias where it has
 * one) routed by runtime/router.c (the experts best first, their weights), each expert's
 * projections with its biases where the model has them, outputs summed in rank order, plus the
 * shared expert where the model has one (scaled by sigmoid(shared_gate x), or whole). Tokens
 * are routed one at a time; the first slot of the per-token buffers is its workspace. The experts
 * come from runtime/expert_cache.c (in place, or from slots under a memory budget: the same bytes),
 * each computed as soon as it is there; with `guess`, the next MoE layer's router is applied to
 * this token's xn and its top k are prefetched while this layer computes. The router reads
 * router_in where given (Gemma 4: its own norm of the residual), else xn; Gemma 4's routing weights
 * are then multiplied by their expert's learned scale. Returns COLIBRI_OK or the cache's error code. */
static int moe_ffn(const ColibriWeights *w, ColibriBuffers *b, int layer, const float *xn, float *out, int guess,
                   const float *router_in)
{
    const ColibriLayerWeights *lw = &w->layers[layer];
    const MatmulInput in = matmul_input(b, router_in != NULL ? router_in : xn, 1, COLIBRI_DIM);
    matmul(b->router_logits, &in, &lw->router, lw->router_bias, COLIBRI_N_EXPERTS);
    checkpoint(layer, "router", b->router_logits, COLIBRI_N_EXPERTS); /* a batch's tokens in turn: the last stays */
    router_route(b->router_logits, lw->router_choice_bias, b->expert_ids, b->expert_weights); /* runtime/router.c */
    checkpoint_ids(layer, "experts", b->expert_ids, COLIBRI_EXPERTS_PER_TOKEN);
    checkpoint(layer, "expert_weights", b->expert_weights, COLIBRI_EXPERTS_PER_TOKEN);
    for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
        b->expert_counts[layer * COLIBRI_N_EXPERTS + b->expert_ids[k]]++;
    }
    if (lw->expert_scale != NULL) {
        for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
            b->expert_weights[k] = b->expert_weights[k] * lw->expert_scale[b->expert_ids[k]];
        }
    }
    int status = colibri_experts_acquire(w, layer, b->expert_ids, COLIBRI_EXPERTS_PER_TOKEN);
    if (status != 0) {
        return status;
    }
    const int next = guess && colibri_experts_prefetching() ? next_moe_layer(layer) : -1;
    if (next >= 0) {
        /* This layer's experts are in or on their way (and pinned): guess the next MoE layer's from
         * the same quantized input (no matmul_input since) with its router, into the router buffer
         * this layer no longer needs, and have them read while this layer computes. */
        int32_t likely[COLIBRI_EXPERTS_PER_TOKEN];
        matmul(b->router_logits, &in, &w->layers[next].router, w->layers[next].router_bias, COLIBRI_N_EXPERTS);
        router_top_k(b->router_logits, COLIBRI_N_EXPERTS, likely, COLIBRI_EXPERTS_PER_TOKEN);
        colibri_experts_prefetch(next, likely, COLIBRI_EXPERTS_PER_TOKEN);
    }
    /* The shared expert first, while the misses are read: its scaled output in the row after the
     * routed experts' rows. */
    float *shared_term = b->expert_terms + (int64_t)COLIBRI_EXPERTS_PER_TOKEN * COLIBRI_DIM;
    if (COLIBRI_SHARED_FFN_DIM > 0) {
        float scale = 1.0f; /* the DeepSeek line's shared experts: always on, ungated (1 x is exact) */
        if (COLIBRI_SHARED_EXPERT_GATED) {
            const MatmulInput shared_in = matmul_input(b, xn, 1, COLIBRI_DIM);
            matmul(b->router_logits, &shared_in, &lw->shared_gate, NULL, 1);
            scale = op_sigmoid(b->router_logits[0]);
        }
        gated_ffn(b, &lw->shared.w_gate, &lw->shared.w_up, &lw->shared.w_down, NULL, NULL, NULL, xn, 1,
                  COLIBRI_SHARED_FFN_DIM);
        for (int i = 0; i < COLIBRI_DIM; i++) {
            shared_term[i] = scale * b->proj[i];
        }
    }
    /* Each routed expert as soon as it is there (those in a slot first, then the others as their
     * reads finish), its weighted output kept in its rank's row; then the sum in rank order, the
     * shared expert last, as if they had come one after another: the same bits whatever order the
     * reads finish in. */
    for (int n = 0; n < COLIBRI_EXPERTS_PER_TOKEN; n++) {
        int k;
        const ColibriExpert *ex;
        status = colibri_experts_next(&k, &ex);
        if (status != 0) {
            return status;
        }
        const int64_t expert = b->expert_ids[k];
        if (!ranks_owns_expert(expert)) { /* computed on its own rank (runtime/ranks.h) */
            continue;
        }
        ranks_alone(1);
        float *term = b->expert_terms + (int64_t)k * COLIBRI_DIM;
        if (COLIBRI_EXPERT_INPUT_SCALED) { /* Llama 4: the weight scales the input (in the term's row), the output added whole */
            for (int i = 0; i < COLIBRI_DIM; i++) {
                term[i] = b->expert_weights[k] * xn[i];
            }
            gated_ffn(b, &ex->w_gate, &ex->w_up, &ex->w_down, NULL, NULL, NULL, term, 1, COLIBRI_EXPERT_FFN_DIM);
        } else if (lw->expert_b_gate != NULL) { /* this expert's rows of the layer's bias vectors */
            gated_ffn(b, &ex->w_gate, &ex->w_up, &ex->w_down, lw->expert_b_gate + expert * COLIBRI_EXPERT_FFN_DIM,
                      lw->expert_b_up + expert * COLIBRI_EXPERT_FFN_DIM, lw->expert_b_down + expert * COLIBRI_DIM, xn,
                      1, COLIBRI_EXPERT_FFN_DIM);
        } else {
            gated_ffn(b, &ex->w_gate, &ex->w_up, &ex->w_down, NULL, NULL, NULL, xn, 1, COLIBRI_EXPERT_FFN_DIM);
        }
        ranks_alone(0);
        const float weight = COLIBRI_EXPERT_INPUT_SCALED ? 1.0f : b->expert_weights[k]; /* (1 x is exact) */
        for (int i = 0; i < COLIBRI_DIM; i++) {
            term[i] = weight * b->proj[i];
        }
    }
    ranks_share_terms(b->expert_terms, b->expert_ids, COLIBRI_EXPERTS_PER_TOKEN, COLIBRI_DIM);
    for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
        const float *term = b->expert_terms + (int64_t)k * COLIBRI_DIM;
        for (int i = 0; i < COLIBRI_DIM; i++) {
            out[i] = (k == 0) ? term[i] : out[i] + term[i];
        }
    }
    if (COLIBRI_SHARED_FFN_DIM > 0) {
        for (int i = 0; i < COLIBRI_DIM; i++) {
            out[i] = out[i] + shared_term[i];
        }
    }
    return 0;
}
#endif

/* A layer's keys (or values) of one position: its KV heads times its head width. */
static int layer_kv_dim(int layer)
{
    return colibri_layer_kv_heads[layer] * colibri_layer_head_dim[layer];
}

/* The heads an attention layer computes on this rank: all of them on a single board, and on a layer
 * not split by KV group (its products split by rows and gathered, as every product); on a layer the
 * plan splits by KV group (colibri_layer_kv_split, runtime/ranks.h), this rank's KV groups and
 * their query heads only, its outputs gathered after attention. */
typedef struct {
    int split;          /* the layer is split by KV group over the ranks */
    int kv_heads;       /* the layer's KV heads (groups) */
    int g_begin, g_end; /* the KV heads computed here */
    int h_begin, h_end; /* their query heads */
} HeadSpan;

static HeadSpan head_span(int layer)
{
    HeadSpan s;
    s.split = colibri_layer_kv_split[layer];
    s.kv_heads = colibri_layer_kv_heads[layer];
    s.g_begin = 0;
    s.g_end = s.kv_heads;
    if (s.split) {
        ranks_kv_groups(s.kv_heads, &s.g_begin, &s.g_end);
    }
    const int group = COLIBRI_N_HEADS / s.kv_heads;
    s.h_begin = s.g_begin * group;
    s.h_end = s.g_end * group;
    return s;
}

/* A projection of a layer's heads (the queries, keys, values, output gate: `rows` rows in
 * kv_heads equal blocks): the span's blocks alone on a layer split by KV group, else matmul's. */
static void head_projection(float *out, const MatmulInput *in, const ColibriMatrix *w, const float *bias, int rows,
                            const HeadSpan *s)
{
    if (!s->split) {
        matmul(out, in, w, bias, rows);
        return;
    }
    const int block = rows / s->kv_heads;
    matmul_span(out, in, w, bias, rows, block * s->g_begin, block * s->g_end);
}

/* A checkpoint of rows of a layer's heads: on a layer split by KV group, each rank's heads gathered
 * first (only while checkpoints are taken: verify's replay), so it hashes the single board's row. */
static void checkpoint_heads(int layer, const char *op, float *rows, int n, int width, const HeadSpan *s)
{
    if (s->split && checkpoint_sink != 0) {
        ranks_gather_groups(rows, n, width, s->kv_heads);
    }
    checkpoint_last(layer, op, rows, n, width);
}

/* Llama 4 (nothing for other models): on a RoPE layer with QK_L2_NORM the queries and keys
 * RMS-normalised per head without a weight, after RoPE (its table's half is 0 on a no-RoPE layer);
 * on a no-RoPE layer the queries times their temperature, log(1 + (pos + 1) / FLOOR) * SCALE + 1. */
static void llama4_queries_keys(int layer, int32_t pos, float *q, float *k, const HeadSpan *s)
{
    const int hd = colibri_layer_head_dim[layer];
    if (colibri_layer_qk_l2_norm[layer]) {
        for (int h = s->h_begin; h < s->h_end; h++) {
            op_rmsnorm_unscaled(q + h * hd, q + h * hd, hd, COLIBRI_RMS_NORM_EPS);
        }
        for (int h = s->g_begin; k != NULL && h < s->g_end; h++) {
            op_rmsnorm_unscaled(k + h * hd, k + h * hd, hd, COLIBRI_RMS_NORM_EPS);
        }
    }
#if COLIBRI_ATTN_TEMPERATURE_FLOOR > 0
    if (colibri_layer_nope[layer]) {
        const float t = op_log((float)(1 + (pos + 1) / COLIBRI_ATTN_TEMPERATURE_FLOOR)) * COLIBRI_ATTN_TEMPERATURE_SCALE + 1.0f;
        for (int i = s->h_begin * hd; i < s->h_end * hd; i++) {
            q[i] = q[i] * t;
        }
    }
#else
    (void)pos;
#endif
}

/* Queries, keys and values of one token at position pos, the span's heads: optional RMSNorm of the
 * queries and keys (per head, or with QK_NORM_WHOLE one over all the heads' queries and one over
 * the keys: a layer the plan never splits by KV group), then RoPE (the layer's pairs: its table's
 * row holds them first); with V_NORM the values' unweighted RMSNorm (Gemma 4). k and v NULL: the
 * queries only (a KV-sharing layer). */
static void position_qkv(const ColibriLayerWeights *lw, int layer, int32_t pos, float *q, float *k, float *v,
                         const HeadSpan *s)
{
    const float eps = COLIBRI_RMS_NORM_EPS;
    const int hd = colibri_layer_head_dim[layer], half = colibri_layer_rope_half[layer];
    const int64_t rope_row = ((int64_t)colibri_layer_rope[layer] * COLIBRI_N_CTX + pos) * COLIBRI_ROPE_HALF;
    const float *cos = colibri_rope_cos + rope_row;
    const float *sin = colibri_rope_sin + rope_row;
    if (COLIBRI_QK_NORM_WHOLE && lw->q_norm != NULL) {
        op_rmsnorm(q, q, lw->q_norm, COLIBRI_N_HEADS * hd, eps);
        if (k != NULL) {
            op_rmsnorm(k, k, lw->k_norm, colibri_layer_kv_heads[layer] * hd, eps);
        }
    }
    for (int h = s->h_begin; h < s->h_end; h++) {
        float *qh = q + h * hd;
        if (!COLIBRI_QK_NORM_WHOLE && lw->q_norm != NULL) {
            op_rmsnorm(qh, qh, lw->q_norm, hd, eps);
        }
        op_rope(qh, cos, sin, half);
    }
    for (int h = s->g_begin; k != NULL && h < s->g_end; h++) {
        float *kh = k + h * hd;
        if (!COLIBRI_QK_NORM_WHOLE && lw->k_norm != NULL) {
            op_rmsnorm(kh, kh, lw->k_norm, hd, eps);
        }
        op_rope(kh, cos, sin, half);
        if (COLIBRI_V_NORM) {
            op_rmsnorm_unscaled(v + h * hd, v + h * hd, hd, eps);
        }
    }
    llama4_queries_keys(layer, pos, q, k, s);
}

/* x[t] += norm(proj[t]) (the norm only where the model has one) for each token of the batch. */
static void residual_add(ColibriBuffers *b, const float *post_norm, int n)
{
    for (int t = 0; t < n; t++) {
        float *x = b->x + (int64_t)t * COLIBRI_DIM;
        float *proj = b->proj + (int64_t)t * COLIBRI_DIM;
        if (post_norm != NULL) {
            op_rmsnorm(proj, proj, post_norm, COLIBRI_DIM, COLIBRI_RMS_NORM_EPS);
        }
        for (int i = 0; i < COLIBRI_DIM; i++) {
            x[i] = x[i] + proj[i] * COLIBRI_RESIDUAL_SCALE; /* (Granite's residual_multiplier; 1 is exact) */
        }
    }
}

/* One row of the residual through the model's norm: RMSNorm, or LayerNorm with its bias. */
static void norm_row(float *out, const float *x, const float *weight, const float *bias)
{
    if (COLIBRI_LAYER_NORM) {
        op_layer_norm(out, x, weight, bias, COLIBRI_DIM, COLIBRI_RMS_NORM_EPS);
    } else {
        op_rmsnorm(out, x, weight, COLIBRI_DIM, COLIBRI_RMS_NORM_EPS);
    }
}

/* xn[t] = norm(x[t]) for each token of the batch. */
static void normalize(ColibriBuffers *b, const float *weight, const float *bias, int n)
{
    for (int t = 0; t < n; t++) {
        norm_row(b->xn + (int64_t)t * COLIBRI_DIM, b->x + (int64_t)t * COLIBRI_DIM, weight, bias);
    }
}

/* Softmax attention on the n tokens of xn into b->proj: the projections for all tokens at once,
 * RoPE token after token, then attention over the cache (which the tokens' keys and values enter
 * first, so a token sees exactly the positions up to its own), the output gate where the model has
 * one, and wo. A layer's widths are its own: Gemma 4's global layers have wider heads and fewer KV
 * heads. A Gemma 4 KV-sharing layer makes queries only and attends over its source's cache, which
 * that earlier layer has filled for these positions. On a layer split by KV group over ranks, all
 * of this up to the output projection is this rank's heads' (HeadSpan); their outputs are then
 * gathered, once, and wo is split by rows as every product. */
static void attention(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n)
{
    const int q_dim = COLIBRI_N_HEADS * colibri_layer_head_dim[layer], kv_dim = layer_kv_dim(layer);
    const int own_kv = colibri_layer_kv_source[layer] == layer;
    const HeadSpan span = head_span(layer);
    const MatmulInput xn = matmul_input(b, b->xn, n, COLIBRI_DIM);
    head_projection(b->q, &xn, &lw->wq, lw->bq, q_dim, &span);
    checkpoint_heads(layer, "q", b->q, n, q_dim, &span);
    if (own_kv) {
        head_projection(b->k, &xn, &lw->wk, lw->bk, kv_dim, &span);
        if (colibri_layer_k_eq_v[layer]) { /* the values are the keys' projection, before its norm and RoPE */
            memcpy(b->v, b->k, (size_t)n * kv_dim * sizeof(float));
        } else {
            head_projection(b->v, &xn, &lw->wv, lw->bv, kv_dim, &span);
        }
        checkpoint_heads(layer, "k", b->k, n, kv_dim, &span);
        checkpoint_heads(layer, "v", b->v, n, kv_dim, &span);
    }
#if COLIBRI_ATTN_OUTPUT_GATE
    head_projection(b->q_gate, &xn, &lw->wq_gate, NULL, q_dim, &span);
#endif
    for (int t = 0; t < n; t++) {
        float *q = b->q + (int64_t)t * q_dim;
        float *k = b->k + (int64_t)t * kv_dim;
        float *v = b->v + (int64_t)t * kv_dim;
        position_qkv(lw, layer, pos + t, q, own_kv ? k : NULL, own_kv ? v : NULL, &span);
    }
    checkpoint_heads(layer, "q_rope", b->q, n, q_dim, &span);
    if (own_kv) {
        checkpoint_heads(layer, "k_rope", b->k, n, kv_dim, &span);
    }
    /* runtime/attention.c: the span's keys and values into the cache, then its heads' attention */
    attention_layer(b, layer, pos, n, lw->sinks, span.g_begin, span.g_end);
#if COLIBRI_ATTN_OUTPUT_GATE
    const int hd = colibri_layer_head_dim[layer];
    for (int t = 0; t < n; t++) { /* the span's heads (every head but on a layer split by KV group) */
        for (int i = span.h_begin * hd; i < span.h_end * hd; i++) {
            const int64_t at = (int64_t)t * q_dim + i;
            b->attn_out[at] = b->attn_out[at] * op_sigmoid(b->q_gate[at]);
        }
    }
#endif
    if (span.split) {
        ranks_gather_groups(b->attn_out, n, q_dim, span.kv_heads); /* every head's output on every rank */
    }
    checkpoint_last(layer, "attention", b->attn_out, n, q_dim);
    const MatmulInput attn_out = matmul_input(b, b->attn_out, n, q_dim);
    matmul(b->proj, &attn_out, &lw->wo, lw->bo, COLIBRI_DIM);
}

/* A Gated DeltaNet layer on the n tokens of xn into b->proj: the projections for all tokens at
 * once, the recurrence token after token (each one's state follows the one before), out_proj.
 * Only models with DeltaNet layers (COLIBRI_N_LINEAR_LAYERS) have one. */
static void linear_attention(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int n)
{
#if COLIBRI_N_LINEAR_LAYERS > 0
    const MatmulInput xn = matmul_input(b, b->xn, n, COLIBRI_DIM);
    matmul(b->lin_qkv, &xn, &lw->lin_qkv, NULL, COLIBRI_LINEAR_CONV_DIM);
    matmul(b->lin_z, &xn, &lw->lin_z, NULL, COLIBRI_LINEAR_VALUE_DIM);
    matmul(b->lin_b, &xn, &lw->lin_b, NULL, COLIBRI_LINEAR_V_HEADS);
    matmul(b->lin_a, &xn, &lw->lin_a, NULL, COLIBRI_LINEAR_V_HEADS);
    for (int t = 0; t < n; t++) {
        deltanet_token(lw, layer, b->lin_qkv + (int64_t)t * COLIBRI_LINEAR_CONV_DIM,
                       b->lin_z + (int64_t)t * COLIBRI_LINEAR_VALUE_DIM, b->lin_b + (int64_t)t * COLIBRI_LINEAR_V_HEADS,
                       b->lin_a + (int64_t)t * COLIBRI_LINEAR_V_HEADS, b->lin_out + (int64_t)t * COLIBRI_LINEAR_VALUE_DIM,
                       b->lin_memory);
    }
    const MatmulInput mixed = matmul_input(b, b->lin_out, n, COLIBRI_LINEAR_VALUE_DIM);
    matmul(b->proj, &mixed, &lw->lin_out, NULL, COLIBRI_DIM);
#else
    (void)b, (void)lw, (void)layer, (void)n;
#endif
}

/* A gated short convolution layer (runtime/short_conv.c; only models with them). */
static void short_conv(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n)
{
#if COLIBRI_N_SHORT_CONV_LAYERS > 0
    short_conv_layer(b, lw, layer, pos, n);
#else
    (void)b, (void)lw, (void)layer, (void)pos, (void)n;
#endif
}

/* A Mamba-2 layer (runtime/mamba2.c; only models with them). */
static void mamba2(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int n)
{
#if COLIBRI_N_MAMBA_LAYERS > 0
    mamba2_layer(b, lw, layer, n);
#else
    (void)b, (void)lw, (void)layer, (void)n;
#endif
}

/* Latent attention (runtime/mla.c; only models with it, COLIBRI_KV_LORA_RANK). */
static void latent_attention(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n)
{
#if COLIBRI_KV_LORA_RANK > 0
    mla_attention(b, lw, layer, pos, n);
#else
    (void)b, (void)lw, (void)layer, (void)pos, (void)n;
#endif
}

/* A sequence's first pass (position 0): the DeltaNet recurrences and short convolutions start from zero. */
static void start_sequence(void)
{
#if COLIBRI_N_LINEAR_LAYERS > 0
    deltanet_reset();
#endif
#if COLIBRI_N_SHORT_CONV_LAYERS > 0
    short_conv_reset();
#endif
#if COLIBRI_N_MAMBA_LAYERS > 0
    mamba2_reset();
#endif
}

#define PLE_ROW (COLIBRI_N_LAYERS * COLIBRI_PLE_DIM) /* one token's per-layer inputs, every layer's slice */

/* Gemma 4's per-layer inputs of the n tokens (their scaled embeddings in b->x) into b->ple: for each,
 * (norm(ple_model_proj x / sqrt(DIM)) + ple_embed[token] * sqrt(PLE_DIM)) / sqrt(2), the norm per
 * layer slice; of the large ple_embed table only the token's row is read. Nothing for other models. */
static void per_layer_inputs(const ColibriWeights *w, ColibriBuffers *b, const int32_t *tokens, int n)
{
#if COLIBRI_PLE_DIM > 0
    const MatmulInput x = matmul_input(b, b->x, n, COLIBRI_DIM);
    matmul(b->ple, &x, &w->ple_model_proj, NULL, PLE_ROW);
    for (int t = 0; t < n; t++) {
        float *ple = b->ple + (int64_t)t * PLE_ROW;
        embedding_row(b->ple_row, &w->ple_embed, tokens[t], PLE_ROW);
        for (int i = 0; i < PLE_ROW; i++) {
            ple[i] = ple[i] * COLIBRI_PLE_PROJ_SCALE;
        }
        for (int l = 0; l < COLIBRI_N_LAYERS; l++) {
            float *slice = ple + l * COLIBRI_PLE_DIM;
            op_rmsnorm(slice, slice, w->ple_proj_norm, COLIBRI_PLE_DIM, COLIBRI_RMS_NORM_EPS);
        }
        for (int i = 0; i < PLE_ROW; i++) {
            ple[i] = (ple[i] + b->ple_row[i] * COLIBRI_PLE_SCALE) * COLIBRI_PLE_MIX_SCALE;
        }
    }
#else
    (void)w, (void)b, (void)tokens, (void)n;
#endif
}

/* A layer's per-layer input into the residual of the n tokens (Gemma 4; nothing for other models):
 * x += norm(ple_proj(gelu_tanh(ple_gate x) * the token's slice of the layer)). */
static void per_layer_block(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int n)
{
#if COLIBRI_PLE_DIM > 0
    const MatmulInput x = matmul_input(b, b->x, n, COLIBRI_DIM);
    matmul(b->ple_gate, &x, &lw->ple_gate, NULL, COLIBRI_PLE_DIM);
    for (int t = 0; t < n; t++) {
        float *g = b->ple_gate + (int64_t)t * COLIBRI_PLE_DIM;
        const float *slice = b->ple + (int64_t)t * PLE_ROW + layer * COLIBRI_PLE_DIM;
        for (int i = 0; i < COLIBRI_PLE_DIM; i++) {
            g[i] = op_gelu_tanh(g[i]) * slice[i];
        }
    }
    const MatmulInput gated = matmul_input(b, b->ple_gate, n, COLIBRI_PLE_DIM);
    matmul(b->proj, &gated, &lw->ple_proj, NULL, COLIBRI_DIM);
    residual_add(b, lw->ple_norm, n);
#else
    (void)b, (void)lw, (void)layer, (void)n;
#endif
}

/* A layer's output, the whole residual of the n tokens, times its learned scalar (Gemma 4; nothing
 * for other models). */
static void scale_layer_output(ColibriBuffers *b, const ColibriLayerWeights *lw, int n)
{
#if COLIBRI_LAYER_SCALARS
    for (int64_t i = 0; i < (int64_t)n * COLIBRI_DIM; i++) {
        b->x[i] = b->x[i] * lw->layer_scalar[0];
    }
#else
    (void)b, (void)lw, (void)n;
#endif
}

#if COLIBRI_MOE_BESIDE_DENSE
/* Gemma 4's MoE block on the n tokens (b->xn: the residual through ffn_norm) into b->proj: the dense
 * FFN normed by post_dense_norm, plus the experts normed by post_moe_norm; the router reads the
 * residual through router_norm, the experts through moe_norm. */
static int gemma4_moe_block(const ColibriWeights *w, ColibriBuffers *b, int layer, int n)
{
    const ColibriLayerWeights *lw = &w->layers[layer];
    const float eps = COLIBRI_RMS_NORM_EPS;
    gated_ffn(b, &lw->w_gate, &lw->w_up, &lw->w_down, NULL, NULL, NULL, b->xn, n, colibri_layer_ffn_dim[layer]);
    for (int t = 0; t < n; t++) {
        op_rmsnorm(b->dense_out + (int64_t)t * COLIBRI_DIM, b->proj + (int64_t)t * COLIBRI_DIM, lw->post_dense_norm,
                   COLIBRI_DIM, eps);
    }
    for (int t = 0; t < n; t++) {
        const float *x = b->x + (int64_t)t * COLIBRI_DIM;
        float *xn = b->xn + (int64_t)t * COLIBRI_DIM; /* the dense FFN is done with it */
        float *moe = b->moe_out + (int64_t)t * COLIBRI_DIM;
        op_rmsnorm(b->router_in, x, lw->router_norm, COLIBRI_DIM, eps);
        op_rmsnorm(xn, x, lw->moe_norm, COLIBRI_DIM, eps);
        int status = moe_ffn(w, b, layer, xn, moe, n == 1, b->router_in);
        if (status != 0) {
            return status;
        }
        op_rmsnorm(moe, moe, lw->post_moe_norm, COLIBRI_DIM, eps);
    }
    for (int64_t i = 0; i < (int64_t)n * COLIBRI_DIM; i++) {
        b->proj[i] = b->dense_out[i] + b->moe_out[i];
    }
    return 0;
}
#endif

/* A MoE layer's feed-forward block on the n tokens of xn into b->proj: each token through the
 * experts its router picks, one token after another (Gemma 4's block: beside a dense FFN). Returns
 * 0, or the error code of an expert that could not be brought in. Only MoE models have one. */
static int moe_block(const ColibriWeights *w, ColibriBuffers *b, int layer, int n)
{
#if COLIBRI_MOE_BESIDE_DENSE
    return gemma4_moe_block(w, b, layer, n);
#elif COLIBRI_N_EXPERTS > 0
    for (int t = 0; t < n; t++) {
        /* Prefetch guesses only while decoding: in a prompt batch the next token's experts come
         * before the next layer's. */
        int status = moe_ffn(w, b, layer, b->xn + (int64_t)t * COLIBRI_DIM, b->moe_out + (int64_t)t * COLIBRI_DIM,
                             n == 1, NULL);
        if (status != 0) {
            return status;
        }
    }
    memcpy(b->proj, b->moe_out, (size_t)n * COLIBRI_DIM * sizeof(float));
    return 0;
#else
    (void)w, (void)b, (void)layer, (void)n;
    return 0;
#endif
}

/* A layer's kinds (model_def.h's tables; constant 0 where the model has none of the kind). */
static int is_linear_attention_layer(int layer)
{
    return COLIBRI_N_LINEAR_LAYERS > 0 && colibri_layer_linear[layer];
}

static int is_short_conv_layer(int layer)
{
    return COLIBRI_N_SHORT_CONV_LAYERS > 0 && colibri_layer_short_conv[layer];
}

static int is_mamba_layer(int layer)
{
    return COLIBRI_N_MAMBA_LAYERS > 0 && colibri_layer_mamba[layer];
}

static int is_moe_layer(int layer)
{
    return COLIBRI_N_EXPERTS > 0 && colibri_layer_moe[layer];
}

int colibri_forward(const ColibriWeights *w, ColibriBuffers *b, const int32_t *tokens, int n, int32_t pos,
                    int want_logits)
{
    if (pos == 0) {
        start_sequence();
    }
    for (int t = 0; t < n; t++) {
        embed(b->x + (int64_t)t * COLIBRI_DIM, &w->embed, tokens[t]);
    }
    checkpoint_last(CHECKPOINT_EMBEDDING, "embedding", b->x, n, COLIBRI_DIM);
    per_layer_inputs(w, b, tokens, n);

    for (int l = 0; l < COLIBRI_N_LAYERS; l++) {
        const ColibriLayerWeights *lw = &w->layers[l];

        /* Token mixing: attention over the KV cache (or latent attention over its latent cache), a DeltaNet
         * layer's recurrence, or a short convolution over its ring. */
        normalize(b, lw->attn_norm, lw->attn_norm_bias, n);
        checkpoint_last(l, "attn_norm", b->xn, n, COLIBRI_DIM);
        if (is_linear_attention_layer(l)) {
            linear_attention(b, lw, l, n);
        } else if (is_short_conv_layer(l)) {
            short_conv(b, lw, l, pos, n);
        } else if (is_mamba_layer(l)) {
            mamba2(b, lw, l, n);
        } else if (COLIBRI_KV_LORA_RANK > 0) {
            latent_attention(b, lw, l, pos, n);
        } else {
            attention(b, lw, l, pos, n);
        }
        checkpoint_last(l, "mixer", b->proj, n, COLIBRI_DIM);
        residual_add(b, lw->post_attn_norm, n);
        checkpoint_last(l, "attn_residual", b->x, n, COLIBRI_DIM);

        /* Feed-forward block: a gated FFN, down(act(gate(x)) * up(x)) with act SiLU or GELU, or
         * on MoE layers a routed mixture of such FFNs, token by token. */
        normalize(b, lw->ffn_norm, lw->ffn_norm_bias, n);
        checkpoint_last(l, "ffn_norm", b->xn, n, COLIBRI_DIM);
        if (is_moe_layer(l)) {
            const int status = moe_block(w, b, l, n);
            if (status != 0) {
                return status;
            }
        } else {
            gated_ffn(b, &lw->w_gate, &lw->w_up, &lw->w_down, lw->b_gate, lw->b_up, lw->b_down, b->xn, n,
                      colibri_layer_ffn_dim[l]);
            checkpoint_last(l, "ffn_gate", b->gate, n, colibri_layer_ffn_dim[l]);
            checkpoint_last(l, "ffn_activation", b->up, n, colibri_layer_ffn_dim[l]);
        }
        checkpoint_last(l, "ffn", b->proj, n, COLIBRI_DIM);
        residual_add(b, lw->post_ffn_norm, n);
        per_layer_block(b, lw, l, n);
        scale_layer_output(b, lw, n);
        checkpoint_last(l, "layer_out", b->x, n, COLIBRI_DIM);
        /* Where a non-finite value first appears (a pass over DIM floats per token: next to the
         * layer's matrices, nothing); once found, later layers are not checked. */
        if (b->nonfinite_layer < 0 && !op_all_finite(b->x, (int64_t)n * COLIBRI_DIM)) {
            b->nonfinite_layer = l;
        }
    }
    if (want_logits == COLIBRI_LOGITS_NONE) {
        return 0;
    }
    /* The last token's next-token logits, or every token's (a speculative pass: one read of the
     * output matrix for all of them). */
    const int first = want_logits == COLIBRI_LOGITS_EVERY_TOKEN ? 0 : n - 1;
    float *out = want_logits == COLIBRI_LOGITS_EVERY_TOKEN ? b->spec_logits : b->logits;
    for (int t = first; t < n; t++) {
        norm_row(b->xn + (int64_t)(t - first) * COLIBRI_DIM, b->x + (int64_t)t * COLIBRI_DIM, w->final_norm,
                 w->final_norm_bias);
    }
    checkpoint_last(COLIBRI_N_LAYERS, "final_norm", b->xn, n - first, COLIBRI_DIM);
    const MatmulInput normed = matmul_input(b, b->xn, n - first, COLIBRI_DIM);
    matmul(out, &normed, &w->lm_head, w->lm_head_bias, COLIBRI_VOCAB);
    if (COLIBRI_LOGITS_SCALING != 1.0f) { /* Granite: the logits divided by logits_scaling */
        for (int64_t i = 0; i < (int64_t)(n - first) * COLIBRI_VOCAB; i++) {
            out[i] = out[i] / COLIBRI_LOGITS_SCALING;
        }
    }
    if (COLIBRI_FINAL_SOFTCAP != 0.0f) {
        for (int64_t i = 0; i < (int64_t)(n - first) * COLIBRI_VOCAB; i++) {
            out[i] = op_softcap(out[i], COLIBRI_FINAL_SOFTCAP);
        }
    }
    checkpoint_last(COLIBRI_N_LAYERS, "logits", out, n - first, COLIBRI_VOCAB);
    return 0;
}
