/* libFuzzer target for the request parser (firmware_src/app/request.c): any line either is refused
 * with a reason or yields a request whose every field is within its range. Built with
 * -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION so mutated lines get past the CRC. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

#define CONTEXT 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int32_t prompt[CONTEXT];
    if (size > 4096) {
        return 0;
    }
    char *line = malloc(size + 1); /* exactly the bytes given: ASan sees any read past them */
    if (line == NULL) {
        return 0;
    }
    memcpy(line, data, size);
    ColibriRequest req;
    const char *problem = colibri_parse_request(line, (int)size, &req, prompt, CONTEXT);
    if (problem == NULL && req.selftest) {
        /* A selftest request (protocol 5) carries no field: everything else stays at its default. */
        if (req.selftest != 1 || req.n_prompt != 0 || req.n_steps != 0 || req.threads != 1 || req.probe_mib != -1 ||
            req.start != 0 || req.score_from != -1 || req.decode_from != -1) {
            __builtin_trap();
        }
    } else if (problem == NULL) {
        int ok = req.prompt == prompt && req.n_prompt >= 1 && req.n_prompt <= CONTEXT && req.n_steps >= 0 &&
                 req.n_steps <= CONTEXT && (req.n_steps >= 1 || req.score_from >= 0) && req.start >= 0 &&
                 req.start < CONTEXT && req.score_from >= -1 && req.score_from < req.n_prompt &&
                 (req.decode_from == -1 || (req.score_from == -1 && req.decode_from >= 1 &&
                                            req.decode_from < req.n_prompt &&
                                            req.n_steps >= req.n_prompt - req.decode_from)) &&
                 req.threads >= 1 && req.threads <= 64 && req.probe_mib >= -1 &&
                 req.sampling.temperature >= 0.0f && req.sampling.top_k >= 0 && req.sampling.top_p > 0.0f &&
                 req.sampling.top_p <= 1.0f && req.sampling.min_p >= 0.0f && req.sampling.min_p <= 1.0f &&
                 (req.stop_at_eos == 0 || req.stop_at_eos == 1) && (req.digests == 0 || req.digests == 1);
        for (int i = 0; ok && i < req.n_prompt; i++) {
            ok = prompt[i] >= 0;
        }
        if (!ok) {
            __builtin_trap();
        }
    } else if (problem[0] == '\0') {
        __builtin_trap(); /* every refusal says why */
    }
    free(line);
    return 0;
}
