/* Mamba-2 (Granite 4.0 hybrid): a layer's token mixer, on the layer's part of the fixed recurrent
 * state arena (model_def.h: colibri_linear_state from colibri_linear_state_offset[layer]: the
 * convolution's last KERNEL - 1 inputs [KERNEL - 1][CONV_DIM], then each head's state
 * [HEADS][HEAD_DIM][STATE]). generator/numerics/mamba2.py is its definition. */
#ifndef COLIBRI_MAMBA2_H
#define COLIBRI_MAMBA2_H

#include "model.h"

#if COLIBRI_N_MAMBA_LAYERS > 0
/* Every Mamba-2 layer's state back to zero: a sequence starts at position 0. */
void mamba2_reset(void);

/* Mamba-2 layer `layer` on the n tokens of b->xn into b->proj: in_proj to z, xBC and dt for all
 * tokens at once; token after token the convolution (its bias, SiLU), the selective state step of
 * every head, y * silu(z) normed per group; out_proj. The state cannot step back: a pass feeds
 * only tokens that stay (the plan offers no speculation for these models). */
void mamba2_layer(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int n);
#endif

#endif
