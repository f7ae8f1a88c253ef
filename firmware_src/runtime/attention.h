/* Attention over the KV cache: keys and values rounded once to the cache's type when they are
 * written (COLIBRI_KV_TYPE: f32, f16 or q8_0; docs/numerics.md, "KV cache"), and read in tiles of
 * COLIBRI_KV_TILE positions of one KV head, each tile once for every query head that shares the KV
 * head and for a block of up to COLIBRI_ATTENTION_BLOCK prompt tokens. */
#ifndef COLIBRI_ATTENTION_H
#define COLIBRI_ATTENTION_H

#include "model.h"

/* Layer `layer`, n tokens at positions pos .. pos + n - 1, their queries in b->q and keys in b->k
 * (RoPE applied), values in b->v: the keys and values enter the cache, and b->attn_out receives
 * every head's output, each token seeing exactly the positions up to its own (all of them, or the
 * layer's sliding window). sinks: [N_HEADS] each head's sink logit (gpt-oss), or NULL. */
void attention_layer(const ColibriBuffers *b, int layer, int32_t pos, int n, const float *sinks);

#endif
