#include "speculate.h"

/* The earlier occurrence of the longest suffix of history[0 .. len) (at most SPEC_MATCH_MAX
 * tokens, the latest among equally long ones) whose next token is at history[from .. to]: *end is
 * the index of that token and the suffix's length is returned (0: none). A longer match finds
 * the place being copied rather than the latest place a common word occurred: on copying tasks it
 * took 0.81-0.87 of the drafted tokens where the latest match of the last 1-3 tokens took 0.63-0.73
 * (docs/performance.md). */
static int longest_match_in(const int32_t *history, int32_t len, int32_t to, int32_t from, int32_t *end)
{
    int best = 0;
    for (int32_t at = to; at >= from; at--) { /* at: the token that would be drafted first */
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

/* ... anywhere before the last token */
static int longest_match(const int32_t *history, int32_t len, int32_t *end)
{
    return longest_match_in(history, len, len - 1, 1, end);
}

/* The longest occurrence whose next token lies within SPEC_NEAR_WINDOW tokens of where the last
 * draft's copy stopped (copy_end): after an edit (a changed word, a corrected spelling) the copy
 * resumes just past it, and a short match there is far likelier right than one anywhere (the
 * rewrite of tools/speculation_bench.py: 3.98 -> 4.52 tokens a pass). */
static int near_match(const SpecState *s, const int32_t *history, int32_t len, int32_t *end)
{
    if (s->copy_end <= 0) {
        return 0;
    }
    const int32_t to = s->copy_end + SPEC_NEAR_WINDOW < len - 1 ? s->copy_end + SPEC_NEAR_WINDOW : len - 1;
    return longest_match_in(history, len, to, s->copy_end, end);
}

/* The draft length k (0 .. most) that makes the most expected tokens per cost when each drafted
 * token is taken with chance p, its predecessors having been (each refusal ends a draft): a draft
 * of k yields 1 + p + ... + p^k tokens for a pass of k + 1. */
static int best_length(float p, int most, const float *pass_cost)
{
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
    return best;
}

/* p for a match class: its drafts' record so far, after SPEC_PRIOR_TOKENS taken at `prior`. */
static float chance(const SpecState *s, int cls, float prior)
{
    return ((float)s->taken[cls] + (float)SPEC_PRIOR_TOKENS * prior) /
           ((float)s->tried[cls] + (float)SPEC_PRIOR_TOKENS);
}

static int copy_draft(SpecState *s, const int32_t *history, int32_t at, int cls, int k, int32_t *draft)
{
    for (int i = 0; i < k; i++) {
        draft[i] = history[at + i];
    }
    s->matched = cls;
    s->source = at;
    return k;
}

int spec_draft(SpecState *s, const int32_t *history, int32_t len, int32_t *draft, int max_draft,
               const float *pass_cost)
{
    if (max_draft <= 0) {
        return 0;
    }
    int32_t at = 0;
    if (near_match(s, history, len, &at) >= SPEC_MATCH_MIN) {
        const int most = max_draft < len - at ? max_draft : (int)(len - at);
        const int k = best_length(chance(s, SPEC_NEAR_CLASS, SPEC_NEAR_PRIOR), most, pass_cost);
        if (k > 0) {
            return copy_draft(s, history, at, SPEC_NEAR_CLASS, k, draft);
        }
    }
    const int matched = longest_match(history, len, &at);
    if (matched < SPEC_MATCH_MIN) {
        return 0;
    }
    const int m = matched < SPEC_MATCH_CLASSES ? matched : SPEC_MATCH_CLASSES;
    const int most = max_draft < len - at ? max_draft : (int)(len - at);
    const int k = best_length(chance(s, m, (float)m / (float)(m + 1)), most, pass_cost);
    return k > 0 ? copy_draft(s, history, at, m, k, draft) : 0;
}

void spec_taken(SpecState *s, int drafted, int taken)
{
    s->drafted += drafted;
    s->accepted += taken;
    s->passes++;
    s->taken[s->matched] += taken;
    s->tried[s->matched] += taken + (taken < drafted ? 1 : 0);
    /* a draft refused from its first token copied nothing: there is no copy to resume (on free
     * text, drafting again near it only lost passes) */
    s->copy_end = taken > 0 ? s->source + taken : 0;
}
