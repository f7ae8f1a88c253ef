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
} ColibriRequest;

/* Application-level errors reported in the error frame (image errors use colibri_status codes). */
enum {
    COLIBRI_ERR_REQUEST = 100, /* prompt empty, token id out of range, or too long for the context */
};

/* Returns 0 on success, else the error code also sent in the error frame. */
int colibri_decode(const ColibriRequest *req, const uint8_t *image, uint64_t image_len);

/* Send an error frame (for BSPs that fail before decoding starts). */
void colibri_report_error(int code, const char *message);

#endif
