/* Token sampling with a portable RNG, mirrored by generator/numerics/sampling.py. */
#ifndef COLIBRI_SAMPLER_H
#define COLIBRI_SAMPLER_H

#include <stdint.h>

/* A temperature below this is greedy: dividing logits by a smaller one risks overflowing them to
 * infinity, where softmax has no answer; C and the NumPy reference both take the argmax instead. */
#define SAMPLER_GREEDY_BELOW 1e-3f

typedef struct {
    float temperature; /* below SAMPLER_GREEDY_BELOW (0 included): greedy (argmax, lowest id wins ties) */
    int32_t top_k;     /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed;
    float repeat_penalty;  /* llama.cpp's repetition penalty, > 0; 1: off */
    int32_t repeat_last_n; /* the window it looks back over, in tokens; 0: off */
} ColibriSampling;

typedef struct {
    uint64_t state;
} ColibriRng;

void rng_seed(ColibriRng *rng, uint64_t seed);
uint32_t rng_next_u32(ColibriRng *rng);
float rng_uniform(ColibriRng *rng); /* [0, 1), 24 random bits */

/* seen: the conversation's tokens so far (n_seen of them), the last repeat_last_n of which the
 * repetition penalty looks at. probs and cand are scratch of n entries each. */
int32_t sample_token(const float *logits, int32_t n, const ColibriSampling *s, const int32_t *seen, int32_t n_seen,
                     ColibriRng *rng, float *probs, int32_t *cand);

#endif
