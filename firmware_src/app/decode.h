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
    int selftest;        /* 1: a selftest request (no other field): run app/selftest.c, nothing else */
    int32_t decode_from; /* prefill the prompt before it, then decode prompt tokens decode_from .. n_prompt - 1
                          * one per forward pass as steps 0, 1, ... (teacher forcing); -1: prefill it all */
    int32_t speculate;   /* at most this many drafted tokens checked per pass (exact speculative decoding,
                          * where the build has COLIBRI_SPEC_TOKENS); 0: plain decoding */
    int32_t trace;       /* the step whose forward pass sends its checkpoints (checkpoint frames, protocol 7:
                          * localising a divergence); -1: none. Decodes plainly (no speculation). */
} ColibriRequest;

/* Application-level errors reported in the error frame (image errors use colibri_status codes). */
enum {
    COLIBRI_ERR_REQUEST = 100, /* prompt empty, token id out of range, or too long for the context */
    COLIBRI_ERR_BUDGET = 102,  /* --memory-budget cannot hold the resident weights, the arenas and top-k slots */
    COLIBRI_ERR_NONFINITE = 104, /* a step's logits held a NaN or an infinity (its token or score frame says
                                  * where: nonfinite=LAYER); the request ends there */
};

/* How a Linux board holds the weights (set by its BSP before colibri_decode; zero on MCUs), for
 * the stats frame. */
typedef struct {
    int mapped;               /* 1: the image file is mapped read-only, not copied */
    uint64_t budget;          /* --memory-budget in bytes; 0: unlimited */
    int32_t slots;            /* expert slots in the pool the MoE layers share; 0: experts read in place */
    uint64_t locked_bytes;    /* resident bytes (and the slot pool) mlock()ed */
    uint64_t resident_bytes;  /* bytes of the image read into this process's memory, advised into huge pages */
    int lock_refused;         /* 1: mlock was refused (RLIMIT_MEMLOCK): they may be paged out */
    int direct_io;            /* 1: experts are read with O_DIRECT (no page cache); 0: buffered reads */
    int prefetch;             /* 1: the next MoE layer's likely experts are read on an I/O thread */
    int eviction_lru;         /* 1: a full pool gives up the least recently used expert; 0: the least often used */
    const char *auto_source;  /* --memory-budget auto: where budget came from ("cgroup-v1", ...); NULL: not auto */
    uint64_t auto_found;      /* the memory it found there */
    uint64_t auto_margin;     /* less this margin */
    char auto_where[200];     /* the file it read */
} ColibriWeightsInfo;

extern ColibriWeightsInfo colibri_weights_info;

/* The first frame a board sends after reset: protocol, firmware, board, model hash. */
void colibri_hello(void);

/* Validate the weight image against this firmware's plan and bind the weights. Returns 0, or the
 * loader's error code (the BSP reports it, after its hello). */
int colibri_load(const uint8_t *image, uint64_t image_len);

/* The same, checking at open only the tensors `check` names (image_loader.h: a mapped image's
 * experts are checked when first brought in). */
int colibri_load_checking(const uint8_t *image, uint64_t image_len, int check);

/* Prefill the prompt (scoring it if asked) and decode, sending score, token, stats and done frames;
 * the done frame says how many tokens the KV cache then holds, where the next request may continue.
 * Returns 0 on success, else the error code also sent in the error frame (the conversation is then
 * forgotten). A selftest request is not one to decode: the BSP's serve loop gives it to
 * colibri_selftest (app/selftest.h), which decodes through colibri_decode_quietly below. */
int colibri_decode(const ColibriRequest *req);

/* The self-test's decode (app/selftest.c): prompt prefilled, then `steps` greedy steps with the
 * end-of-sequence ignored, each step's token and logits SHA-256 stored, no frames sent. *done: the
 * steps stored. Returns 0, COLIBRI_ERR_NO_IMAGE, or a forward pass's error. The conversation held
 * is forgotten. */
int colibri_decode_quietly(const int32_t *prompt, int32_t n_prompt, int32_t steps, int32_t *tokens,
                           uint8_t (*digests)[32], int *done);

/* Parse a request frame (generator/device/protocol.py encode_request) into req, whose prompt points to
 * prompt_buf (capacity entries: the context, which also bounds steps). Returns NULL for a valid
 * request, else why it is not one (for an error frame). */
const char *colibri_parse_request(const char *line, int len, ColibriRequest *req, int32_t *prompt_buf,
                                  int32_t capacity);

/* Longest request line for a context of n_ctx: every prompt id as up to 10 digits and a comma,
 * plus the other fields. */
#define COLIBRI_REQUEST_LINE_BYTES(n_ctx) ((n_ctx) * 11 + 384)

/* Send an error frame (for BSPs that fail before decoding starts). */
void colibri_report_error(int code, const char *message);

#endif
