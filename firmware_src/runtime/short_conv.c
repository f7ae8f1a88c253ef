#include "short_conv.h"

#include <string.h>

#include "matmul.h"

#if COLIBRI_N_SHORT_CONV_LAYERS > 0

void short_conv_reset(void)
{
    memset(colibri_linear_state, 0, sizeof colibri_linear_state);
}

/* One position: B * x into its ring row, then each channel's taps over the window, times C. */
static void conv_token(float *ring, const float *taps, int32_t pos, const float *bcx, float *y)
{
    const float *b = bcx, *c = bcx + COLIBRI_DIM, *x = bcx + 2 * COLIBRI_DIM;
    float *row = ring + (int64_t)(pos % COLIBRI_SHORT_CONV_RING) * COLIBRI_DIM;
    for (int i = 0; i < COLIBRI_DIM; i++) {
        row[i] = b[i] * x[i];
    }
    for (int ch = 0; ch < COLIBRI_DIM; ch++) {
        const float *w = taps + (int64_t)ch * COLIBRI_SHORT_CONV_KERNEL;
        float acc = 0.0f;
        for (int j = 0; j < COLIBRI_SHORT_CONV_KERNEL; j++) {
            /* (RING >= KERNEL: the sum is never negative) */
            const int64_t at = ((int64_t)pos - COLIBRI_SHORT_CONV_KERNEL + 1 + j + COLIBRI_SHORT_CONV_RING) %
                               COLIBRI_SHORT_CONV_RING;
            const float term = w[j] * ring[at * COLIBRI_DIM + ch];
            acc = (j == 0) ? term : acc + term;
        }
        y[ch] = c[ch] * acc;
    }
}

void short_conv_layer(ColibriBuffers *b, const ColibriLayerWeights *lw, int layer, int32_t pos, int n)
{
    float *bcx = (float *)(colibri_scratch + COLIBRI_SCRATCH_CONV_BCX_OFFSET);
    float *y = (float *)(colibri_scratch + COLIBRI_SCRATCH_CONV_Y_OFFSET);
    float *ring = colibri_linear_state + colibri_linear_state_offset[layer];
    const MatmulInput xn = matmul_input(b, b->xn, n, COLIBRI_DIM);
    matmul(bcx, &xn, &lw->conv_in, NULL, 3 * COLIBRI_DIM);
    for (int t = 0; t < n; t++) {
        conv_token(ring, lw->conv_taps, pos + t, bcx + (int64_t)t * 3 * COLIBRI_DIM, y + (int64_t)t * COLIBRI_DIM);
    }
    const MatmulInput gated = matmul_input(b, y, n, COLIBRI_DIM);
    matmul(b->proj, &gated, &lw->conv_out, NULL, COLIBRI_DIM);
}

#endif
