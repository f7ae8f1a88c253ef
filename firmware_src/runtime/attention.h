/* Attention over the KV cache: keys and values rounded once to the cache's type when they are
 * written (COLIBRI_KV_TYPE: f32, f16 or q8_0; docs/numerics.md, "KV cache"), and read in tiles of
 * COLIBRI_KV_TILE positions of one KV head, each tile once for every query head that shares the KV
 * head and for a block of up to COLIBRI_ATTENTION_BLOCK prompt tokens. */
#ifndef COLIBRI_ATTENTION_H
#define COLIBRI_ATTENTION_H

#include "model.h"

/* Layer `layer`, n tokens at positions pos .. pos + n - 1, their queries in b->q and keys in b->k
 * (RoPE applied), values in b->v: the keys and values of KV heads g_begin .. g_end - 1 enter the
 * cache, and b->attn_out receives the output of every query head of those KV heads, each token
 * seeing exactly the positions up to its own (all of them, or the layer's sliding window). Every
 * KV head on a single board; a rank's own on a layer split by KV group (runtime/ranks.h), whose
 * cache holds its KV heads only. sinks: [N_HEADS] each head's sink logit (gpt-oss), or NULL. */
void attention_layer(const ColibriBuffers *b, int layer, int32_t pos, int n, const float *sinks, int g_begin,
                     int g_end);

#endif
