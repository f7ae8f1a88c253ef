/* Exact speculative decoding without a draft model: the draft is what followed the earlier
 * occurrence of the context's longest suffix (prompt lookup), and one forward pass checks the
 * sampled token and the draft together (COLIBRI_LOGITS_EVERY_TOKEN). A drafted token counts only
 * where it equals the token plain decoding samples from the same logits, so tokens, logits and
 * sampler draws are those of plain decoding, bit for bit (docs/numerics.md, "Speculative decoding").
 *
 * How long a draft is (0: none) is chosen to make the most tokens per unit of time: the chance
 * that a drafted token is taken is estimated from what earlier drafts after matches of the same
 * length did in this decode, and each draft length's expected tokens are weighed against what a
 * pass of that many tokens costs on this board (its speculate_pass_cost, targets/<board>.toml). */
#ifndef COLIBRI_SPECULATE_H
#define COLIBRI_SPECULATE_H

#include <stdint.h>

#define SPEC_MATCH_MAX 16 /* the longest suffix of the context matched against its earlier tokens */
#define SPEC_MATCH_MIN 2  /* a shorter match drafts nothing: a single common token seldom predicts
                           * what follows */
#define SPEC_MATCH_CLASSES 8 /* acceptance is counted per match length 2 .. 7, and 8 or more */
#define SPEC_PRIOR_TOKENS 2  /* before any evidence, a match of m tokens counts as 2 drafted tokens
                              * taken at m / (m + 1): longer matches more often find the place being
                              * copied */
#define SPEC_NEAR_WINDOW 8   /* a match starting at most this many tokens past where the last draft's
                              * taken tokens ended in their source is the copy resuming after an edit
                              * (a changed or corrected word) */
#define SPEC_NEAR_CLASS (SPEC_MATCH_CLASSES + 1) /* such matches' own acceptance count */
#define SPEC_NEAR_PRIOR 0.8f /* and their chance before any evidence */

typedef struct {
    int32_t drafted;  /* tokens drafted and checked */
    int32_t accepted; /* of them, the ones decoding took */
    int32_t passes;   /* forward passes that checked a draft */
    int32_t matched;  /* the match class of the draft being checked (a length, or SPEC_NEAR_CLASS) */
    int32_t source;   /* where in the history the draft being checked was copied from */
    int32_t copy_end; /* where the last draft's taken tokens ended in their source (0: none taken) */
    int32_t taken[SPEC_NEAR_CLASS + 1]; /* per match class: drafted tokens taken */
    int32_t tried[SPEC_NEAR_CLASS + 1]; /* and the ones that could have been: taken, plus the
                                         * first one refused in each draft */
} SpecState;

/* Up to max_draft tokens that followed an earlier occurrence of a suffix of history[0 .. len)
 * (SPEC_MATCH_MIN to SPEC_MATCH_MAX tokens) into draft, as many as make the most expected tokens
 * per cost; returns how many (0: none). The occurrence is the longest one just past where the last
 * draft's copy stopped (SPEC_NEAR_WINDOW) if there is one and it is worth a draft, else the longest
 * anywhere (the latest of equally long ones).
 * pass_cost[n - 1]: what a pass of n tokens costs relative to a pass of one (pass_cost[0] == 1),
 * n = 1 .. max_draft + 1. */
int spec_draft(SpecState *s, const int32_t *history, int32_t len, int32_t *draft, int max_draft,
               const float *pass_cost);

/* After a checked draft: how many of its tokens decoding took. */
void spec_taken(SpecState *s, int drafted, int taken);

#endif
