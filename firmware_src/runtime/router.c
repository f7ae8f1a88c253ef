/* A mixture of experts' routing (router.h): scores, the choice (with V3's correction bias and the
 * DeepSeek line's group limits), the weights. Every step in float32 as generator/numerics/routing.py
 * has it, so the chosen experts and their weights are the same bits on every board. */
#include "router.h"

#include <math.h>

#include "ops.h"

#if COLIBRI_N_EXPERTS > 0

/* A sigmoid or grouped router chooses on its own scores, kept after the logits. */
#define ROUTER_CHOICE (COLIBRI_ROUTER_SIGMOID || COLIBRI_EXPERT_GROUPS > 0)

void router_top_k(const float *scores, int n, int32_t *ids, int k)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) {
                taken |= (ids[i] == e);
            }
            if (!taken && (best < 0 || scores[e] > scores[best])) {
                best = e;
            }
        }
        ids[j] = best;
    }
}

#if COLIBRI_EXPERT_GROUPS > 0
#define PER_GROUP (COLIBRI_N_EXPERTS / COLIBRI_EXPERT_GROUPS)

/* Every expert outside the best EXPERT_GROUPS_USED groups to -inf: a group scores its two best
 * choice scores added, best first (sigmoid), or its best one (softmax: V2's group_limited_greedy). */
static void limit_to_groups(float *choice)
{
    float group_scores[COLIBRI_EXPERT_GROUPS];
    int32_t kept[COLIBRI_EXPERT_GROUPS_USED];
    for (int g = 0; g < COLIBRI_EXPERT_GROUPS; g++) {
        const float *c = choice + g * PER_GROUP;
        int32_t two[2];
        router_top_k(c, PER_GROUP, two, COLIBRI_ROUTER_SIGMOID ? 2 : 1);
        group_scores[g] = COLIBRI_ROUTER_SIGMOID ? c[two[0]] + c[two[1]] : c[two[0]];
    }
    router_top_k(group_scores, COLIBRI_EXPERT_GROUPS, kept, COLIBRI_EXPERT_GROUPS_USED);
    for (int g = 0; g < COLIBRI_EXPERT_GROUPS; g++) {
        int is_kept = 0;
        for (int i = 0; i < COLIBRI_EXPERT_GROUPS_USED; i++) {
            is_kept |= (kept[i] == g);
        }
        for (int e = 0; !is_kept && e < PER_GROUP; e++) {
            choice[g * PER_GROUP + e] = -INFINITY;
        }
    }
}
#endif

void router_route(float *logits, const float *choice_bias, int32_t *ids, float *weights)
{
    const int n = COLIBRI_N_EXPERTS, k = COLIBRI_EXPERTS_PER_TOKEN;
#if COLIBRI_ROUTER_TOPK_THEN_SOFTMAX
    (void)choice_bias;
    router_top_k(logits, n, ids, k);
    for (int j = 0; j < k; j++) {
        weights[j] = logits[ids[j]];
    }
    op_softmax(weights, k); /* the chosen logits, in rank order */
#elif COLIBRI_ROUTER_TOPK_THEN_SIGMOID
    (void)choice_bias;
    router_top_k(logits, n, ids, k);
    for (int j = 0; j < k; j++) {
        weights[j] = op_sigmoid(logits[ids[j]]); /* (Llama 4: each scales its expert's input, model.c) */
    }
#elif COLIBRI_ROUTER_SPARSEMIXER
    (void)choice_bias;
    router_top_k(logits, n, ids, k);
    float gates[COLIBRI_N_EXPERTS];
    op_sparsemixer_weights(logits, n, ids, k, COLIBRI_SPARSEMIXER_THRESHOLD, weights, gates);
#else
    if (COLIBRI_ROUTER_SIGMOID) {
        for (int e = 0; e < n; e++) {
            logits[e] = op_sigmoid(logits[e]);
        }
    } else {
        op_softmax(logits, n);
    }
    const float *choice = logits;
#if ROUTER_CHOICE
    float *own = logits + n;
    for (int e = 0; e < n; e++) {
        own[e] = choice_bias != NULL ? logits[e] + choice_bias[e] : logits[e];
    }
#if COLIBRI_EXPERT_GROUPS > 0
    limit_to_groups(own);
#endif
    choice = own;
#else
    (void)choice_bias;
#endif
    router_top_k(choice, n, ids, k);
    for (int j = 0; j < k; j++) {
        weights[j] = logits[ids[j]];
    }
#endif
    if (COLIBRI_NORM_TOPK_PROB) {
        float sum = weights[0];
        for (int j = 1; j < k; j++) {
            sum = sum + weights[j];
        }
        if (COLIBRI_ROUTER_NORM_EPS != 0.0f) {
            sum = sum + COLIBRI_ROUTER_NORM_EPS;
        }
        for (int j = 0; j < k; j++) {
            weights[j] = weights[j] / sum;
        }
    }
    if (COLIBRI_ROUTED_SCALING != 1.0f) {
        for (int j = 0; j < k; j++) {
            weights[j] = weights[j] * COLIBRI_ROUTED_SCALING;
        }
    }
}

#endif
