/* LFM2's gated short convolution: a layer's token mixer, on the layer's ring of its last inputs in
 * the recurrent state arena (model_def.h: colibri_linear_state, COLIBRI_SHORT_CONV_RING). */
#ifndef COLIBRI_SHORT_CONV_H
#define COLIBRI_SHORT_CONV_H

#include "model.h"

#if COLIBRI_N_SHORT_CONV_LAYERS > 0
/* Every short convolution layer's ring back to zero: a sequence starts at position 0. */
void short_conv_reset(void);

/* Short convolution layer `layer` on the n tokens of b->xn (positions pos ...) into b->proj:
 * in_proj to B, C and x for all tokens at once; token after token B * x into the ring (position p
 * in row p % RING), out_c = sum over the KERNEL taps, oldest first, of taps[c][j] * the input of
 * position p - KERNEL + 1 + j (0 before the sequence), times C; out_proj. A position's ring row is
 * written before it is read, so a pass that starts again at an earlier position (dropped drafts)
 * reads what plain decoding would. */
void short_conv_layer(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n);
#endif

#endif
