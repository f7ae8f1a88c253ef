/* A mixture of experts' routing for one token: which experts, best first, and their weights
 * (docs/numerics.md, "Routing"; generator/numerics/routing.py is its definition). */
#ifndef COLIBRI_ROUTER_H
#define COLIBRI_ROUTER_H

#include <stdint.h>

#include "model_def.h"

#if COLIBRI_N_EXPERTS > 0
/* The k best of n scores into ids, best first, the lowest index on ties. */
void router_top_k(const float *scores, int n, int32_t *ids, int k);

/* One token's router logits (logits[N_EXPERTS], then its scores; a sigmoid or grouped router uses
 * the N_EXPERTS floats after them for its choice scores) -> ids[EXPERTS_PER_TOKEN] best first and
 * their weights: softmax then top k, top k then softmax, or sigmoid with the choice bias
 * (choice_bias[N_EXPERTS], NULL: none) used to choose only; group limits; the weights renormalised
 * where NORM_TOPK_PROB says, then times ROUTED_SCALING. */
void router_route(float *logits, const float *choice_bias, int32_t *ids, float *weights);
#endif

#endif
