/* Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash) in the absorbed form: the cache keeps
 * one row per position and layer, the latent and the shared RoPE key; the key up-projection is
 * folded into the query, the value up-projection applied after the weighted sum
 * (docs/numerics.md, "Latent attention"; generator/numerics/mla.py is the definition). */
#ifndef COLIBRI_MLA_H
#define COLIBRI_MLA_H

#include "model.h"

#if COLIBRI_KV_LORA_RANK > 0
/* Layer `layer` on the n tokens of b->xn at positions pos .. pos + n - 1 into b->proj (after wo):
 * the projections for all tokens at once, then token after token its row into the cache and its
 * attention over the positions up to its own. */
void mla_attention(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n);
#endif

#endif
