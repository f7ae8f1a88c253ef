#include "speculate.h"

/* The earlier occurrence of the longest suffix of history[0 .. len) (at most SPEC_MATCH_MAX
 * tokens, the latest among equally long ones) that has a token after it: *end is the index of that
 * token and the suffix's length is returned (0: no token occurred before). A longer match finds
 * the place being copied rather than the latest place a common word occurred: on copying tasks it
 * took 0.81-0.87 of the drafted tokens where the latest match of the last 1-3 tokens took 0.63-0.73
 * (docs/performance.md). */
static int longest_match(const int32_t *history, int32_t len, int32_t *end)
{
    int best = 0;
    for (int32_t at = len - 1; at >= 1; at--) { /* at: the token that would be drafted first */
        int k = 0;
        while (k < SPEC_MATCH_MAX && at - 1 - k >= 0 && history[at - 1 - k] == history[len - 1 - k]) {
            k++;
        }
        if (k > best) {
            best = k;
            *end = at;
            if (k == SPEC_MATCH_MAX) {
                break;
            }
        }
    }
    return best;
}

int spec_draft(SpecState *s, const int32_t *history, int32_t len, int32_t *draft, int max_draft,
               const float *pass_cost)
{
    if (max_draft <= 0) {
        return 0;
    }
    int32_t at = 0;
    const int matched = longest_match(history, len, &at);
    if (matched < SPEC_MATCH_MIN) {
        return 0;
    }
    const int m = matched < SPEC_MATCH_CLASSES ? matched : SPEC_MATCH_CLASSES;
    /* p: the chance that a drafted token is taken, its predecessors having been (each refusal ends
     * a draft); a draft of k then yields 1 + p + ... + p^k tokens for a pass of k + 1 */
    const float prior = (float)SPEC_PRIOR_TOKENS * (float)m / (float)(m + 1);
    const float p = ((float)s->taken[m] + prior) / ((float)s->tried[m] + (float)SPEC_PRIOR_TOKENS);
    const int most = max_draft < len - at ? max_draft : (int)(len - at);
    int best = 0;
    float best_rate = 1.0f; /* no draft: one token for a pass of one */
    float expected = 1.0f, chance = 1.0f;
    for (int k = 1; k <= most; k++) {
        chance *= p;
        expected += chance;
        const float rate = expected / pass_cost[k];
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
    }
    for (int i = 0; i < best; i++) {
        draft[i] = history[at + i];
    }
    s->matched = m;
    return best;
}

void spec_taken(SpecState *s, int drafted, int taken)
{
    s->drafted += drafted;
    s->accepted += taken;
    s->passes++;
    s->taken[s->matched] += taken;
    s->tried[s->matched] += taken + (taken < drafted ? 1 : 0);
}
