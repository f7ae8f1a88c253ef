/* The self-test inside the firmware: proof without a host.
 *
 * Two checks, one selftest frame (protocol 5):
 *   1. every kernel of the board's set against the scalar reference kernel on a fixed input
 *      (products of every block type, batched products, activation quantization, SwiGLU,
 *      attention), bit for bit;
 *   2. a greedy decode of the golden prompt the build embeds (selftest_data.c, computed by the
 *      NumPy reference on this build's weight image): every step's token and logits SHA-256.
 * It runs on a selftest request (every board) and, where the board file says [selftest] boot =
 * true, at boot before the first request (MCU boards). A weight image the loader refused is a FAIL
 * too, saying why. */
#ifndef COLIBRI_SELFTEST_H
#define COLIBRI_SELFTEST_H

#include <stdint.h>

#include "board_def.h"

enum {
    COLIBRI_ERR_SELFTEST = 103, /* the self-test failed (the selftest frame says what differed) */
};

extern const int32_t colibri_selftest_prompt[COLIBRI_SELFTEST_PROMPT_TOKENS];
extern const int32_t colibri_selftest_tokens[COLIBRI_SELFTEST_STEPS];
extern const uint8_t colibri_selftest_digests[COLIBRI_SELFTEST_STEPS][32];

/* Run both checks and send the selftest frame, then, answering a request, a done frame
 * (reason=selftest; a boot run sends none: the host's first request is still to come). load_status:
 * the loader's status for the weight image (0: loaded); otherwise the decode cannot run and the
 * frame says why (load_message, or the loader's own words when NULL). Returns 0 on PASS, else
 * COLIBRI_ERR_SELFTEST. The conversation the firmware held is forgotten. */
int colibri_selftest(int load_status, const char *load_message, int answering);

#endif
