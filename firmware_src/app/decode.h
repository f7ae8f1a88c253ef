/* The application: load the weight image, prefill the prompt, decode, report every step. */
#ifndef COLIBRI_DECODE_H
#define COLIBRI_DECODE_H

#include <stdint.h>

#include "../runtime/sampler.h"

typedef struct {
    const int32_t *prompt;
    int32_t n_prompt;
    int32_t n_steps; /* tokens to generate */
    ColibriSampling sampling;
    int stop_at_eos;
    int digests; /* 1: hash every step's logits (verify); 0: skip it (bench measures decoding alone) */
    int threads; /* Linux boards: threads of the decode (MCUs run one) */
    int64_t probe_mib; /* Linux boards: measure the read bandwidth over this many MiB first (0: sized from
                        * the caches); -1: no probe */
    int32_t start;      /* position of the prompt's first token: the tokens already held (0: a new conversation) */
    int32_t score_from; /* score prompt tokens score_from + 1 .. n_prompt - 1 (score frames); -1: none */
} ColibriRequest;

/* Application-level errors reported in the error frame (image errors use colibri_status codes). */
enum {
    COLIBRI_ERR_REQUEST = 100, /* prompt empty, token id out of range, or too long for the context */
};

/* The first frame a board sends after reset: protocol, firmware, board, model hash. */
void colibri_hello(void);

/* Validate the weight image against this firmware's plan and bind the weights. Returns 0, or the
 * loader's error code (the BSP reports it, after its hello). */
int colibri_load(const uint8_t *image, uint64_t image_len);

/* Prefill the prompt (scoring it if asked) and decode, sending score, token, stats and done frames;
 * the done frame says how many tokens the KV cache then holds, where the next request may continue.
 * Returns 0 on success, else the error code also sent in the error frame (the conversation is then
 * forgotten). */
int colibri_decode(const ColibriRequest *req);

/* Parse a request frame (generator/device/protocol.py encode_request) into req, whose prompt points to
 * prompt_buf (capacity entries: the context, which also bounds steps). Returns NULL for a valid
 * request, else why it is not one (for an error frame). */
const char *colibri_parse_request(const char *line, int len, ColibriRequest *req, int32_t *prompt_buf,
                                  int32_t capacity);

/* Longest request line for a context of n_ctx: every prompt id as up to 10 digits and a comma,
 * plus the other fields. */
#define COLIBRI_REQUEST_LINE_BYTES(n_ctx) ((n_ctx) * 11 + 320)

/* Send an error frame (for BSPs that fail before decoding starts). */
void colibri_report_error(int code, const char *message);

#endif
