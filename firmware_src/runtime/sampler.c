#include "sampler.h"

#include "ops.h"

void rng_seed(ColibriRng *rng, uint64_t seed)
{
    rng->state = seed ^ 0x9E3779B97F4A7C15ull;
    if (rng->state == 0) {
        rng->state = 0x9E3779B97F4A7C15ull;
    }
}

uint32_t rng_next_u32(ColibriRng *rng)
{
    uint64_t s = rng->state;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    rng->state = s;
    return (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 32);
}

float rng_uniform(ColibriRng *rng)
{
    return (float)(rng_next_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

/* Candidate order: higher probability first, lower token id first among equals. */
static int ranks_before(const float *probs, int32_t a, int32_t b)
{
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
}

static void sift_down(int32_t *cand, const float *probs, int32_t root, int32_t n)
{
    for (;;) {
        int32_t child = 2 * root + 1;
        if (child >= n) {
            return;
        }
        if (child + 1 < n && ranks_before(probs, cand[child + 1], cand[child])) {
            child++;
        }
        if (!ranks_before(probs, cand[child], cand[root])) {
            return;
        }
        int32_t t = cand[root];
        cand[root] = cand[child];
        cand[child] = t;
        root = child;
    }
}

/* Heap sort of candidate ids, best first (deterministic: the order is total). */
static void sort_candidates(int32_t *cand, const float *probs, int32_t n)
{
    for (int32_t i = n / 2 - 1; i >= 0; i--) {
        sift_down(cand, probs, i, n);
    }
    /* Each pass moves the best remaining candidate to the end: worst-first, reversed below. */
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = cand[0];
        cand[0] = cand[end];
        cand[end] = t;
        sift_down(cand, probs, 0, end);
    }
    for (int32_t i = 0, j = n - 1; i < j; i++, j--) {
        int32_t t = cand[i];
        cand[i] = cand[j];
        cand[j] = t;
    }
}

/* The first index of the largest value (a NaN at index 0 wins, as with a plain scan from 0; other
 * NaNs are never larger). Four interleaved scans, each keeping its first best, merged preferring
 * the larger value and then the lower index: the plain scan's answer without its one long chain
 * of dependent compares. */
static int32_t argmax(const float *x, int32_t n)
{
    if (x[0] != x[0]) {
        return 0;
    }
    float best[4] = {x[0], x[0], x[0], x[0]};
    int32_t at[4] = {0, 0, 0, 0};
    int32_t i = 1;
    for (; i + 3 < n; i += 4) {
        for (int j = 0; j < 4; j++) {
            if (x[i + j] > best[j]) {
                best[j] = x[i + j];
                at[j] = i + j;
            }
        }
    }
    for (; i < n; i++) {
        if (x[i] > best[0]) {
            best[0] = x[i];
            at[0] = i;
        }
    }
    int32_t winner = 0;
    for (int j = 1; j < 4; j++) {
        if (best[j] > best[winner] || (best[j] == best[winner] && at[j] < at[winner])) {
            winner = j;
        }
    }
    return at[winner];
}

/* llama.cpp's repetition penalty (the repeat part of llama_sampler_penalties): every distinct token
 * among the last repeat_last_n seen has its logit divided by the penalty when it is positive and
 * multiplied by it otherwise, once however often it was seen. The penalized logits go to out;
 * mark (n entries) notes the tokens done. One float32 operation per token, so the order of the
 * window does not matter to the bits (generator/numerics/sampling.py penalized does the same). */
static void repeat_penalty(const float *logits, int32_t n, const ColibriSampling *s, const int32_t *seen,
                           int32_t n_seen, float *out, int32_t *mark)
{
    for (int32_t i = 0; i < n; i++) {
        out[i] = logits[i];
        mark[i] = 0;
    }
    const float penalty = s->repeat_penalty;
    for (int32_t j = n_seen > s->repeat_last_n ? n_seen - s->repeat_last_n : 0; j < n_seen; j++) {
        const int32_t t = seen[j];
        if (t < 0 || t >= n || mark[t]) {
            continue;
        }
        mark[t] = 1;
        out[t] = out[t] <= 0.0f ? out[t] * penalty : out[t] / penalty;
    }
}

int32_t sample_token(const float *logits, int32_t n, const ColibriSampling *s, const int32_t *seen, int32_t n_seen,
                     ColibriRng *rng, float *probs, int32_t *cand)
{
    /* The penalty first, as in llama.cpp's sampler chain (penalties before temperature), greedy too. */
    if (s->repeat_penalty != 1.0f && s->repeat_last_n > 0 && n_seen > 0) {
        repeat_penalty(logits, n, s, seen, n_seen, probs, cand);
        logits = probs;
    }
    if (!(s->temperature >= SAMPLER_GREEDY_BELOW)) {
        return argmax(logits, n);
    }
    for (int32_t i = 0; i < n; i++) {
        probs[i] = logits[i] / s->temperature;
        cand[i] = i;
    }
    op_softmax(probs, n);
    sort_candidates(cand, probs, n);

    int32_t keep = n;
    if (s->top_k > 0 && s->top_k < keep) {
        keep = s->top_k;
    }
    if (s->top_p < 1.0f) {
        float cum = 0.0f;
        for (int32_t j = 0; j < keep; j++) {
            cum = (j == 0) ? probs[cand[0]] : cum + probs[cand[j]];
            if (cum >= s->top_p) {
                keep = j + 1;
                break;
            }
        }
    }
    if (s->min_p > 0.0f) {
        float threshold = s->min_p * probs[cand[0]];
        int32_t count = 0;
        while (count < keep && probs[cand[count]] >= threshold) {
            count++;
        }
        keep = count > 0 ? count : 1;
    }
    float total = 0.0f;
    for (int32_t j = 0; j < keep; j++) {
        total = (j == 0) ? probs[cand[0]] : total + probs[cand[j]];
    }
    float r = rng_uniform(rng) * total;
    float cum = 0.0f;
    for (int32_t j = 0; j < keep; j++) {
        cum = (j == 0) ? probs[cand[0]] : cum + probs[cand[j]];
        if (r < cum) {
            return cand[j];
        }
    }
    return cand[keep - 1];
}
