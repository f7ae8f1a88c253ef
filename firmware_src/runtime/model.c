#include "model.h"

#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "ops.h"
#include "parallel.h"

#define GROUP (COLIBRI_N_HEADS / COLIBRI_N_KV_HEADS) /* query heads per KV head */

void colibri_buffers_init(ColibriBuffers *b)
{
    uint8_t *s = colibri_scratch;
    b->x = (float *)(s + COLIBRI_SCRATCH_X_OFFSET);
    b->xn = (float *)(s + COLIBRI_SCRATCH_XN_OFFSET);
    b->q = (float *)(s + COLIBRI_SCRATCH_Q_OFFSET);
    b->k = (float *)(s + COLIBRI_SCRATCH_K_OFFSET);
    b->v = (float *)(s + COLIBRI_SCRATCH_V_OFFSET);
    b->att = (float *)(s + COLIBRI_SCRATCH_ATT_OFFSET);
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
    b->expert_ids = (int32_t *)(s + COLIBRI_SCRATCH_EXPERT_IDS_OFFSET);
    b->expert_weights = (float *)(s + COLIBRI_SCRATCH_EXPERT_WEIGHTS_OFFSET);
    b->expert_counts = (int32_t *)(s + COLIBRI_SCRATCH_EXPERT_COUNTS_OFFSET);
#else
    b->router_logits = b->moe_out = b->expert_weights = NULL;
    b->expert_ids = b->expert_counts = NULL;
#endif
#if COLIBRI_QUANT_Q8_0
    b->act_qs = (int8_t *)(s + COLIBRI_SCRATCH_ACT_QS_OFFSET);
    b->act_d = (float *)(s + COLIBRI_SCRATCH_ACT_D_OFFSET);
#else
    b->act_qs = NULL;
    b->act_d = NULL;
#endif
}

/* Make x the input of the following linear() calls (q8_0: quantize it once for all of them). */
static void set_input(ColibriBuffers *b, const float *x, int n)
{
#if COLIBRI_QUANT_Q8_0
    kernel_quantize_q8_0(b->act_qs, b->act_d, x, n);
#else
    (void)b;
    (void)x;
    (void)n;
#endif
}

/* One matrix-vector product, split by rows over the threads (each row's sum is unchanged). */
typedef struct {
    float *out;
    const ColibriMatrix *m;
    const ColibriBuffers *b;
    const float *x;
    int cols;
} LinearJob;

static void linear_rows(void *ctx, int begin, int end)
{
    const LinearJob *j = ctx;
#if COLIBRI_QUANT_Q8_0
    kernel_matvec_q8_0(j->out + begin, j->m->qs + (int64_t)begin * j->cols,
                       j->m->d + (int64_t)begin * (j->cols / KERNEL_QK), j->b->act_qs, j->b->act_d, end - begin,
                       j->cols);
#else
    kernel_matvec_f32(j->out + begin, j->m->w + (int64_t)begin * j->cols, j->x, end - begin, j->cols);
#endif
}

/* Below this many multiply-adds a product is not worth waking the other threads for. */
#define PARALLEL_MIN_MACS 32768

/* out = W x (+ bias), x being the input last given to set_input(). */
static void linear(float *out, const ColibriMatrix *m, const float *bias, const ColibriBuffers *b,
                   const float *x, int rows, int cols)
{
    LinearJob job = {out, m, b, x, cols};
    if ((int64_t)rows * cols < PARALLEL_MIN_MACS) {
        linear_rows(&job, 0, rows);
    } else {
        parallel_for(linear_rows, &job, rows);
    }
    if (bias != NULL) {
        for (int i = 0; i < rows; i++) {
            out[i] = out[i] + bias[i];
        }
    }
}

static void embed(float *x, const ColibriMatrix *m, int32_t token)
{
#if COLIBRI_QUANT_Q8_0
    const int8_t *qs = m->qs + (int64_t)token * COLIBRI_DIM;
    const float *d = m->d + (int64_t)token * (COLIBRI_DIM / KERNEL_QK);
    for (int i = 0; i < COLIBRI_DIM; i++) {
        x[i] = (float)qs[i] * d[i / KERNEL_QK];
    }
#else
    memcpy(x, m->w + (int64_t)token * COLIBRI_DIM, COLIBRI_DIM * sizeof(float));
#endif
    if (COLIBRI_EMBED_SCALE != 1.0f) {
        for (int i = 0; i < COLIBRI_DIM; i++) {
            x[i] = x[i] * COLIBRI_EMBED_SCALE;
        }
    }
}

static float ffn_activation(float x)
{
#if COLIBRI_FFN_GELU_TANH
    return op_gelu_tanh(x);
#else
    return op_silu(x);
#endif
}

/* One gated FFN on the current input x (of width COLIBRI_DIM) into b->proj:
 * down(act(gate x) * up x). Leaves the matmul input set to the hidden activation. */
static void gated_ffn(ColibriBuffers *b, const ColibriMatrix *w_gate, const ColibriMatrix *w_up,
                      const ColibriMatrix *w_down, const float *b_gate, const float *b_up, const float *b_down,
                      const float *x, int inner)
{
    linear(b->gate, w_gate, b_gate, b, x, inner, COLIBRI_DIM);
    linear(b->up, w_up, b_up, b, x, inner, COLIBRI_DIM);
    for (int i = 0; i < inner; i++) {
        b->up[i] = ffn_activation(b->gate[i]) * b->up[i];
    }
    set_input(b, b->up, inner);
    linear(b->proj, w_down, b_down, b, b->up, COLIBRI_DIM, inner);
}

#if COLIBRI_N_EXPERTS > 0
/* Mixture of experts on b->xn into b->proj: softmax over the router logits, the top k experts
 * (best first, lowest id on ties), weights optionally renormalised, outputs summed in rank order,
 * plus the shared expert scaled by sigmoid(shared_gate x) where the model has one. */
static void moe_ffn(const ColibriLayerWeights *lw, ColibriBuffers *b, int layer)
{
    set_input(b, b->xn, COLIBRI_DIM);
    linear(b->router_logits, &lw->router, NULL, b, b->xn, COLIBRI_N_EXPERTS, COLIBRI_DIM);
    op_softmax(b->router_logits, COLIBRI_N_EXPERTS);
    for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
        int best = -1;
        for (int e = 0; e < COLIBRI_N_EXPERTS; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) {
                taken |= (b->expert_ids[j] == e);
            }
            if (!taken && (best < 0 || b->router_logits[e] > b->router_logits[best])) {
                best = e;
            }
        }
        b->expert_ids[k] = best;
        b->expert_weights[k] = b->router_logits[best];
        b->expert_counts[layer * COLIBRI_N_EXPERTS + best]++;
    }
    if (COLIBRI_NORM_TOPK_PROB) {
        float sum = b->expert_weights[0];
        for (int k = 1; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
            sum = sum + b->expert_weights[k];
        }
        for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
            b->expert_weights[k] = b->expert_weights[k] / sum;
        }
    }
    for (int k = 0; k < COLIBRI_EXPERTS_PER_TOKEN; k++) {
        const ColibriExpert *ex = &lw->experts[b->expert_ids[k]];
        set_input(b, b->xn, COLIBRI_DIM);
        gated_ffn(b, &ex->w_gate, &ex->w_up, &ex->w_down, NULL, NULL, NULL, b->xn, COLIBRI_EXPERT_FFN_DIM);
        for (int i = 0; i < COLIBRI_DIM; i++) {
            float term = b->expert_weights[k] * b->proj[i];
            b->moe_out[i] = (k == 0) ? term : b->moe_out[i] + term;
        }
    }
    if (COLIBRI_SHARED_FFN_DIM > 0) {
        set_input(b, b->xn, COLIBRI_DIM);
        linear(b->router_logits, &lw->shared_gate, NULL, b, b->xn, 1, COLIBRI_DIM);
        float scale = op_sigmoid(b->router_logits[0]);
        gated_ffn(b, &lw->shared.w_gate, &lw->shared.w_up, &lw->shared.w_down, NULL, NULL, NULL, b->xn,
                  COLIBRI_SHARED_FFN_DIM);
        for (int i = 0; i < COLIBRI_DIM; i++) {
            b->moe_out[i] = b->moe_out[i] + scale * b->proj[i];
        }
    }
    memcpy(b->proj, b->moe_out, COLIBRI_DIM * sizeof(float));
}
#endif

/* Position t of layer `layer` lives in slot t % slots of that layer's part of the KV arenas. */
static int64_t kv_slot(int layer, int32_t t)
{
    return colibri_kv_offset[layer] + (int64_t)(t % colibri_kv_slots[layer]) * COLIBRI_KV_DIM;
}

static void attention(const ColibriBuffers *b, int layer, int32_t pos)
{
    const int32_t window = colibri_layer_window[layer];
    const int32_t start = (window > 0 && pos - window + 1 > 0) ? pos - window + 1 : 0;
    for (int h = 0; h < COLIBRI_N_HEADS; h++) {
        const float *qh = b->q + h * COLIBRI_HEAD_DIM;
        const int kv_head = (h / GROUP) * COLIBRI_HEAD_DIM;
        for (int32_t t = start; t <= pos; t++) {
            b->att[t] = op_dot(qh, colibri_key_cache + kv_slot(layer, t) + kv_head, COLIBRI_HEAD_DIM) * COLIBRI_ATTN_SCALE;
        }
        op_softmax(b->att + start, pos - start + 1);
        float *out = b->attn_out + h * COLIBRI_HEAD_DIM;
        const float *v0 = colibri_value_cache + kv_slot(layer, start) + kv_head;
        for (int i = 0; i < COLIBRI_HEAD_DIM; i++) {
            out[i] = b->att[start] * v0[i];
        }
        for (int32_t t = start + 1; t <= pos; t++) {
            const float *vt = colibri_value_cache + kv_slot(layer, t) + kv_head;
            for (int i = 0; i < COLIBRI_HEAD_DIM; i++) {
                out[i] = out[i] + b->att[t] * vt[i];
            }
        }
    }
}

void colibri_forward(const ColibriWeights *w, ColibriBuffers *b, int32_t token, int32_t pos, int want_logits)
{
    const float eps = COLIBRI_RMS_NORM_EPS;
    embed(b->x, &w->embed, token);

    for (int l = 0; l < COLIBRI_N_LAYERS; l++) {
        const ColibriLayerWeights *lw = &w->layers[l];
        const int64_t rope_row = ((int64_t)colibri_layer_rope[l] * COLIBRI_N_CTX + pos) * COLIBRI_ROPE_HALF;
        const float *cos = colibri_rope_cos + rope_row;
        const float *sin = colibri_rope_sin + rope_row;

        /* Attention block. */
        op_rmsnorm(b->xn, b->x, lw->attn_norm, COLIBRI_DIM, eps);
        set_input(b, b->xn, COLIBRI_DIM);
        linear(b->q, &lw->wq, lw->bq, b, b->xn, COLIBRI_Q_DIM, COLIBRI_DIM);
        linear(b->k, &lw->wk, lw->bk, b, b->xn, COLIBRI_KV_DIM, COLIBRI_DIM);
        linear(b->v, &lw->wv, lw->bv, b, b->xn, COLIBRI_KV_DIM, COLIBRI_DIM);
        for (int h = 0; h < COLIBRI_N_HEADS; h++) {
            float *qh = b->q + h * COLIBRI_HEAD_DIM;
            if (lw->q_norm != NULL) {
                op_rmsnorm(qh, qh, lw->q_norm, COLIBRI_HEAD_DIM, eps);
            }
            op_rope(qh, cos, sin, COLIBRI_ROPE_HALF);
        }
        for (int h = 0; h < COLIBRI_N_KV_HEADS; h++) {
            float *kh = b->k + h * COLIBRI_HEAD_DIM;
            if (lw->k_norm != NULL) {
                op_rmsnorm(kh, kh, lw->k_norm, COLIBRI_HEAD_DIM, eps);
            }
            op_rope(kh, cos, sin, COLIBRI_ROPE_HALF);
        }
        memcpy(colibri_key_cache + kv_slot(l, pos), b->k, COLIBRI_KV_DIM * sizeof(float));
        memcpy(colibri_value_cache + kv_slot(l, pos), b->v, COLIBRI_KV_DIM * sizeof(float));
        attention(b, l, pos);
        set_input(b, b->attn_out, COLIBRI_Q_DIM);
        linear(b->proj, &lw->wo, lw->bo, b, b->attn_out, COLIBRI_DIM, COLIBRI_Q_DIM);
        if (lw->post_attn_norm != NULL) {
            op_rmsnorm(b->proj, b->proj, lw->post_attn_norm, COLIBRI_DIM, eps);
        }
        for (int i = 0; i < COLIBRI_DIM; i++) {
            b->x[i] = b->x[i] + b->proj[i];
        }

        /* Feed-forward block: a gated FFN, down(act(gate(x)) * up(x)) with act SiLU or GELU, or
         * on MoE layers a routed mixture of such FFNs. */
        op_rmsnorm(b->xn, b->x, lw->ffn_norm, COLIBRI_DIM, eps);
#if COLIBRI_N_EXPERTS > 0
        if (colibri_layer_moe[l]) {
            moe_ffn(lw, b, l);
        } else
#endif
        {
            set_input(b, b->xn, COLIBRI_DIM);
            gated_ffn(b, &lw->w_gate, &lw->w_up, &lw->w_down, lw->b_gate, lw->b_up, lw->b_down, b->xn,
                      COLIBRI_FFN_DIM);
        }
        if (lw->post_ffn_norm != NULL) {
            op_rmsnorm(b->proj, b->proj, lw->post_ffn_norm, COLIBRI_DIM, eps);
        }
        for (int i = 0; i < COLIBRI_DIM; i++) {
            b->x[i] = b->x[i] + b->proj[i];
        }
    }
    if (!want_logits) {
        return;
    }
    op_rmsnorm(b->xn, b->x, w->final_norm, COLIBRI_DIM, eps);
    set_input(b, b->xn, COLIBRI_DIM);
    linear(b->logits, &w->lm_head, NULL, b, b->xn, COLIBRI_VOCAB, COLIBRI_DIM);
    if (COLIBRI_FINAL_SOFTCAP != 0.0f) {
        for (int i = 0; i < COLIBRI_VOCAB; i++) {
            b->logits[i] = op_softcap(b->logits[i], COLIBRI_FINAL_SOFTCAP);
        }
    }
}
