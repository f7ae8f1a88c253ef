/* Checkpoints of one forward pass, for localising a divergence (verify's replay of the first step
 * whose logits differ from the reference's): after each operation of each layer, the SHA-256 of its
 * output row (the last token's of the pass, as the logits digest hashes the logits) and a few of
 * its values, handed to a sink the application sets (app/decode.c sends them as checkpoint frames).
 * With no sink set, a checkpoint costs one test. generator/reference.py's hook has the same
 * checkpoints under the same names; generator/verify_localise.py compares them. */
#ifndef COLIBRI_CHECKPOINT_H
#define COLIBRI_CHECKPOINT_H

#include <stdint.h>

/* Layer numbers of the checkpoints outside the layers: the embedding before them, the final norm
 * and the logits after them (CHECKPOINT_HEAD is COLIBRI_N_LAYERS for the caller). */
#define CHECKPOINT_EMBEDDING (-1)

/* The values sent with a hash: at indices i * n / CHECKPOINT_VALUES (all of them when n is fewer). */
#ifndef CHECKPOINT_VALUES
#define CHECKPOINT_VALUES 16
#endif

typedef void (*CheckpointSink)(int layer, const char *op, int64_t n, const uint8_t digest[32], const float *values,
                               int n_values);

extern CheckpointSink checkpoint_sink;

void checkpoint_emit(int layer, const char *op, const float *row, int64_t n);

/* The output of operation `op` of `layer`: the n floats of row. */
static inline void checkpoint(int layer, const char *op, const float *row, int64_t n)
{
    if (checkpoint_sink != 0) {
        checkpoint_emit(layer, op, row, n);
    }
}

/* The same for the last of n_tok rows `width` floats apart (a batch's last token). */
static inline void checkpoint_last(int layer, const char *op, const float *rows, int n_tok, int64_t width)
{
    if (checkpoint_sink != 0) {
        checkpoint_emit(layer, op, rows + (int64_t)(n_tok - 1) * width, width);
    }
}

/* Expert ids as a checkpoint (as floats: exact below 2^24), so a routing choice is compared like the rest. */
void checkpoint_ids(int layer, const char *op, const int32_t *ids, int n);

#endif
