/* Exact speculative decoding without a draft model: the draft is what followed the earlier
 * occurrence of the context's longest suffix (prompt lookup), and one forward pass checks the
 * sampled token and the draft together (COLIBRI_LOGITS_EVERY_TOKEN). A drafted token counts only
 * where it equals the token plain decoding samples from the same logits, so tokens, logits and
 * sampler draws are those of plain decoding, bit for bit (docs/numerics.md, "Speculative decoding"). */
#ifndef COLIBRI_SPECULATE_H
#define COLIBRI_SPECULATE_H

#include <stdint.h>

#define SPEC_MATCH_MAX 16 /* the longest suffix of the context matched against its earlier tokens */
#define SPEC_MATCH_MIN 2  /* a shorter match drafts nothing: a single common token seldom predicts
                           * what follows, and its draft costs a longer pass */
#define SPEC_BACKOFF_MAX 16 /* after drafts that keep failing, the most steps decoded without one */
#define SPEC_FIRST_LENGTH 2 /* a draft's length: 2 at first, doubled while drafts are taken whole, one
                             * past what was taken otherwise (a longer pass costs more than it saves
                             * when its tokens are not taken) */

typedef struct {
    int32_t drafted;  /* tokens drafted and checked */
    int32_t accepted; /* of them, the ones decoding took */
    int32_t passes;   /* forward passes that checked a draft */
    int32_t misses;   /* drafts in a row of which not one token was taken */
    int32_t skip;     /* steps still to decode without drafting (the back-off) */
    int32_t length;   /* the longest draft to check next (0: not set yet, SPEC_FIRST_LENGTH) */
} SpecState;

/* Up to max_draft tokens (and no more than the match is long) that followed the earlier occurrence
 * of the longest suffix of history[0 .. len) (SPEC_MATCH_MIN to SPEC_MATCH_MAX tokens, the latest
 * of equally long ones) into draft; returns how many (0: none, or backing off). */
int spec_draft(SpecState *s, const int32_t *history, int32_t len, int32_t *draft, int max_draft);

/* After a checked draft: how many of its tokens decoding took (the back-off's input). */
void spec_taken(SpecState *s, int drafted, int taken);

#endif
