#include "checkpoint.h"

#include "checksum.h"

CheckpointSink checkpoint_sink;

void checkpoint_emit(int layer, const char *op, const float *row, int64_t n)
{
    uint8_t digest[32];
    Sha256 sha;
    sha256_init(&sha);
    sha256_update(&sha, (const uint8_t *)row, (size_t)n * sizeof(float));
    sha256_final(&sha, digest);
    float values[CHECKPOINT_VALUES];
    const int n_values = n < CHECKPOINT_VALUES ? (int)n : CHECKPOINT_VALUES;
    for (int i = 0; i < n_values; i++) {
        values[i] = row[(int64_t)i * n / n_values];
    }
    checkpoint_sink(layer, op, n, digest, values, n_values);
}

void checkpoint_ids(int layer, const char *op, const int32_t *ids, int n)
{
    if (checkpoint_sink == 0) {
        return;
    }
    float as_floats[64];
    const int kept = n < 64 ? n : 64;
    for (int i = 0; i < kept; i++) {
        as_floats[i] = (float)ids[i];
    }
    checkpoint_emit(layer, op, as_floats, kept);
}
