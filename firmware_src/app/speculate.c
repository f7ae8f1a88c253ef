#include "speculate.h"

/* The start of the latest match of the n tokens ending history[len - 1] that ends before them and
 * has a token after it, or -1. */
static int32_t latest_match(const int32_t *history, int32_t len, int n)
{
    const int32_t *suffix = history + len - n;
    for (int32_t at = len - n - 1; at >= 0; at--) {
        int k = 0;
        while (k < n && history[at + k] == suffix[k]) {
            k++;
        }
        if (k == n) {
            return at;
        }
    }
    return -1;
}

int spec_draft(SpecState *s, const int32_t *history, int32_t len, int32_t *draft, int max_draft)
{
    if (max_draft <= 0) {
        return 0;
    }
    if (s->skip > 0) {
        s->skip--;
        return 0;
    }
    if (s->length == 0) {
        s->length = SPEC_FIRST_LENGTH;
    }
    max_draft = max_draft < s->length ? max_draft : s->length;
    for (int n = SPEC_NGRAM_MAX; n >= 1; n--) {
        if (len <= n) {
            continue;
        }
        const int32_t at = latest_match(history, len, n);
        if (at < 0) {
            continue;
        }
        int k = 0;
        for (int32_t i = at + n; i < len && k < max_draft; i++) {
            draft[k++] = history[i];
        }
        return k;
    }
    return 0;
}

void spec_taken(SpecState *s, int drafted, int taken)
{
    s->drafted += drafted;
    s->accepted += taken;
    s->passes++;
    if (taken == drafted) {
        s->length = s->length < 32 ? 2 * s->length : 64;
    } else {
        s->length = taken + 1;
    }
    if (taken > 0) {
        s->misses = 0;
        return;
    }
    /* Drafts that keep failing cost a longer pass for nothing: wait 1, 2, 4 ... steps before the next. */
    s->misses++;
    const int32_t wait = (int32_t)1 << (s->misses < 5 ? s->misses - 1 : 4);
    s->skip = wait < SPEC_BACKOFF_MAX ? wait : SPEC_BACKOFF_MAX;
}
