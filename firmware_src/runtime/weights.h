/* Weights: ColibriWeights (model_def.h) bound to a weight image's data region. */
#ifndef COLIBRI_WEIGHTS_H
#define COLIBRI_WEIGHTS_H

#include <stdint.h>

#include "model_def.h"

/* Point every weight at its place in the image's data region (which the loader has validated);
 * with COLIBRI_Q4_0_EXPANDED, first fill colibri_expanded from the image's q4_0 matrices. */
void colibri_bind_weights(const uint8_t *data, ColibriWeights *w);

#endif
