/* The request frame: the one grammar every board reads its work in, whatever the link (an MCU's
 * UART, a Linux firmware's stdin, an SSH channel to it):
 *
 *   @CLB <seq> request prompt=1,2,3 steps=N [temperature=XXXXXXXX] [top_k=K] [top_p=XXXXXXXX]
 *        [min_p=XXXXXXXX] [seed=S] [eos=0|1] [digests=0|1] [threads=N] [probe_mib=N] [start=P]
 *        [score_from=F] [decode_from=D] [speculate=K] [repeat_penalty=XXXXXXXX] [repeat_last_n=N] [trace=S]
 *        *<crc32>
 *
 * repeat_penalty (> 0; default 1: off) is llama.cpp's repetition penalty over the last repeat_last_n
 * tokens of the conversation (default 64; 0: off; at most the context, which covers all of them):
 * runtime/sampler.c.
 * start=P continues a conversation: the prompt goes at positions P, P+1, ... after the P tokens the
 * firmware already holds in its KV cache (the done frame of the previous request says how many).
 * score_from=F scores the prompt: for every prompt index i from F on, the log-probability of
 * prompt token i + 1 given the tokens before it (score frames); steps may then be 0.
 * decode_from=D decodes the prompt from index D on instead of prefilling it (teacher forcing): the
 * tokens before D are prefilled in batches, then step s's token is prompt token D + s, not a
 * sampled one, fed back in its own forward pass as a sampled token would be; steps must cover
 * those tokens (steps >= prompt length - D), and the steps after them sample. D >= 1, and not with
 * score_from.
 * speculate=K checks up to K drafted tokens per forward pass (speculate.h): the same tokens and
 * logits as without it; a build without room for it (COLIBRI_SPEC_TOKENS 0) decodes plainly.
 *
 * trace=S (protocol 7) sends the checkpoints of the forward pass whose logits step S samples
 * (checkpoint frames before step S's token frame, runtime/checkpoint.h): S < steps; no speculation.
 *
 * The self-test (protocol 5) is a frame of its own kind, with no fields: "@CLB <seq> selftest *<crc32>".
 *
 * Floats travel as the 8 hex digits of their IEEE-754 bits, so both sides hold the same value.
 * Every key at most once; decimals are plain ASCII digits; prompt and steps are required. The
 * ranges of every field are checked here, once, for every board. */
#include <float.h>
#include <string.h>

#include "../runtime/checksum.h"
#include "decode.h"

#define MAX_THREADS 64
#define MAX_PROBE_MIB (1u << 20)
#define MAX_SPECULATE 64

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Parse an unsigned decimal at *p (advancing it); 0 on no digits or a value above `max`. */
static int parse_dec(const char **p, const char *end, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = *p;
    while (s < end && *s >= '0' && *s <= '9') {
        uint64_t d = (uint64_t)(*s - '0');
        if (d > max || v > (max - d) / 10) {
            return 0;
        }
        v = v * 10 + d;
        s++;
    }
    if (s == *p) {
        return 0;
    }
    *p = s;
    *out = v;
    return 1;
}

/* The whole value [s, end) as one decimal no larger than max. */
static int parse_whole_dec(const char *s, const char *end, uint64_t max, uint64_t *out)
{
    return parse_dec(&s, end, max, out) && s == end;
}

static int parse_f32_bits(const char *s, const char *end, float *out)
{
    uint32_t bits = 0;
    if (end - s != 8) {
        return 0;
    }
    for (int i = 0; i < 8; i++) {
        int d = hex_digit(s[i]);
        if (d < 0) {
            return 0;
        }
        bits = bits << 4 | (uint32_t)d;
    }
    memcpy(out, &bits, sizeof *out);
    return 1;
}

enum { KEY_PROMPT, KEY_STEPS, KEY_TEMPERATURE, KEY_TOP_K, KEY_TOP_P, KEY_MIN_P, KEY_SEED, KEY_EOS, KEY_DIGESTS,
       KEY_THREADS, KEY_PROBE_MIB, KEY_START, KEY_SCORE_FROM, KEY_DECODE_FROM, KEY_SPECULATE, KEY_REPEAT_PENALTY,
       KEY_REPEAT_LAST_N, KEY_TRACE, N_KEYS };
static const char *const key_names[N_KEYS] = {"prompt", "steps", "temperature", "top_k", "top_p", "min_p",
                                              "seed", "eos", "digests", "threads", "probe_mib", "start",
                                              "score_from", "decode_from", "speculate", "repeat_penalty",
                                              "repeat_last_n", "trace"};

static int key_index(const char *key, const char *key_end)
{
    for (int i = 0; i < N_KEYS; i++) {
        size_t n = strlen(key_names[i]);
        if ((size_t)(key_end - key) == n && memcmp(key, key_names[i], n) == 0) {
            return i;
        }
    }
    return -1;
}

/* Token ids "1,2,3": at least one, no empty item, at most `capacity`. */
static const char *parse_prompt(const char *s, const char *end, int32_t *ids, int32_t capacity, int32_t *n)
{
    *n = 0;
    for (;;) {
        uint64_t v;
        if (*n == capacity) {
            return "prompt is longer than the context this firmware was built for";
        }
        if (!parse_dec(&s, end, INT32_MAX, &v)) {
            return "prompt must be comma-separated token ids";
        }
        ids[(*n)++] = (int32_t)v;
        if (s == end) {
            return NULL;
        }
        if (*s++ != ',' || s == end) {
            return "prompt must be comma-separated token ids";
        }
    }
}

static const char *parse_field(int key, const char *val, const char *end, ColibriRequest *r, int32_t *prompt_buf,
                               int32_t capacity)
{
    uint64_t v;
    switch (key) {
    case KEY_PROMPT:
        return parse_prompt(val, end, prompt_buf, capacity, &r->n_prompt);
    case KEY_STEPS:
        if (!parse_whole_dec(val, end, (uint64_t)capacity, &v)) {
            return "steps must be between 1 (0 when scoring) and the context length";
        }
        r->n_steps = (int32_t)v;
        return NULL;
    case KEY_TEMPERATURE:
        if (!parse_f32_bits(val, end, &r->sampling.temperature) ||
            !(r->sampling.temperature >= 0.0f && r->sampling.temperature <= FLT_MAX)) {
            return "temperature must be a finite number >= 0";
        }
        return NULL;
    case KEY_TOP_K:
        if (!parse_whole_dec(val, end, INT32_MAX, &v)) {
            return "top_k must be a non-negative integer";
        }
        r->sampling.top_k = (int32_t)v;
        return NULL;
    case KEY_TOP_P:
        if (!parse_f32_bits(val, end, &r->sampling.top_p) || !(r->sampling.top_p > 0.0f && r->sampling.top_p <= 1.0f)) {
            return "top_p must be in (0, 1]";
        }
        return NULL;
    case KEY_MIN_P:
        if (!parse_f32_bits(val, end, &r->sampling.min_p) || !(r->sampling.min_p >= 0.0f && r->sampling.min_p <= 1.0f)) {
            return "min_p must be in [0, 1]";
        }
        return NULL;
    case KEY_REPEAT_PENALTY:
        if (!parse_f32_bits(val, end, &r->sampling.repeat_penalty) ||
            !(r->sampling.repeat_penalty > 0.0f && r->sampling.repeat_penalty <= FLT_MAX)) {
            return "repeat_penalty must be a finite number > 0";
        }
        return NULL;
    case KEY_REPEAT_LAST_N:
        if (!parse_whole_dec(val, end, (uint64_t)capacity, &v)) {
            return "repeat_last_n must be between 0 and the context length";
        }
        r->sampling.repeat_last_n = (int32_t)v;
        return NULL;
    case KEY_SEED:
        if (!parse_whole_dec(val, end, UINT64_MAX, &v)) {
            return "seed must be a non-negative integer";
        }
        r->sampling.seed = v;
        return NULL;
    case KEY_EOS:
    case KEY_DIGESTS:
        if (!parse_whole_dec(val, end, 1, &v)) {
            return key == KEY_EOS ? "eos must be 0 or 1" : "digests must be 0 or 1";
        }
        *(key == KEY_EOS ? &r->stop_at_eos : &r->digests) = (int)v;
        return NULL;
    case KEY_THREADS:
        if (!parse_whole_dec(val, end, MAX_THREADS, &v) || v < 1) {
            return "threads must be between 1 and 64";
        }
        r->threads = (int)v;
        return NULL;
    case KEY_START:
    case KEY_SCORE_FROM:
    case KEY_DECODE_FROM:
        if (!parse_whole_dec(val, end, (uint64_t)capacity - 1, &v)) {
            return key == KEY_START        ? "start must be a position within the context"
                   : key == KEY_SCORE_FROM ? "score_from must be a position within the context"
                                           : "decode_from must be a position within the context";
        }
        *(key == KEY_START ? &r->start : key == KEY_SCORE_FROM ? &r->score_from : &r->decode_from) = (int32_t)v;
        return NULL;
    case KEY_TRACE:
        if (!parse_whole_dec(val, end, (uint64_t)capacity - 1, &v)) {
            return "trace must be a step of the request";
        }
        r->trace = (int32_t)v;
        return NULL;
    case KEY_SPECULATE:
        if (!parse_whole_dec(val, end, MAX_SPECULATE, &v)) {
            return "speculate must be between 0 and 64 drafted tokens";
        }
        r->speculate = (int32_t)v;
        return NULL;
    default: /* KEY_PROBE_MIB */
        if (!parse_whole_dec(val, end, MAX_PROBE_MIB, &v)) {
            return "probe_mib must be a size in MiB (0: chosen from the caches)";
        }
        r->probe_mib = (int64_t)v;
        return NULL;
    }
}

const char *colibri_parse_request(const char *line, int len, ColibriRequest *req, int32_t *prompt_buf, int32_t capacity)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
        len--;
    }
    /* "@CLB " ... " *xxxxxxxx" */
    if (len < 16 || memcmp(line, "@CLB ", 5) != 0 || line[len - 10] != ' ' || line[len - 9] != '*') {
        return "not a request frame";
    }
    uint32_t want = 0;
    for (int i = len - 8; i < len; i++) {
        int d = hex_digit(line[i]);
        if (d < 0) {
            return "not a request frame (bad CRC digits)";
        }
        want = want << 4 | (uint32_t)d;
    }
    const char *end = line + len - 10;
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* fuzzing: let mutated requests past the CRC */
    if (crc32_update(0, (const uint8_t *)line, (size_t)(end - line)) != want) {
        return "request frame damaged in transit (CRC mismatch)";
    }
#endif
    const char *p = line + 5;
    uint64_t seq;
    if (!parse_dec(&p, end, UINT32_MAX, &seq)) {
        return "not a request frame";
    }
    ColibriRequest r = {.prompt = prompt_buf, .n_prompt = 0, .n_steps = 0,
                        .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0,
                                     .repeat_penalty = 1.0f, .repeat_last_n = 64},
                        .stop_at_eos = 1, .digests = 1, .threads = 1, .probe_mib = -1, .start = 0,
                        .score_from = -1, .decode_from = -1, .speculate = 0, .selftest = 0, .trace = -1};
    /* Protocol 5: "@CLB <seq> selftest *<crc32>", no fields: run the self-test (app/selftest.c). */
    if (end - p == 9 && memcmp(p, " selftest", 9) == 0) {
        r.selftest = 1;
        *req = r;
        return NULL;
    }
    if (end - p < 8 || memcmp(p, " request", 8) != 0) {
        return "not a request frame";
    }
    p += 8;
    unsigned seen = 0;
    while (p < end) {
        if (*p != ' ') {
            return "malformed request field";
        }
        const char *key = ++p;
        while (p < end && *p != '=' && *p != ' ') {
            p++;
        }
        if (p == end || *p != '=') {
            return "malformed request field";
        }
        const int k = key_index(key, p);
        if (k < 0) {
            return "unknown request field";
        }
        if (seen & (1u << k)) {
            return "a request field is repeated";
        }
        seen |= 1u << k;
        const char *val = ++p;
        while (p < end && *p != ' ') {
            p++;
        }
        const char *problem = parse_field(k, val, p, &r, prompt_buf, capacity);
        if (problem != NULL) {
            return problem;
        }
    }
    if (!(seen & (1u << KEY_PROMPT)) || !(seen & (1u << KEY_STEPS))) {
        return "a request needs prompt and steps";
    }
    if (r.n_steps == 0 && r.score_from < 0) {
        return "steps must be between 1 (0 when scoring) and the context length";
    }
    if (r.trace >= r.n_steps) {
        return "trace must be a step of the request";
    }
    if (r.score_from >= r.n_prompt) {
        return "score_from must be an index into the prompt";
    }
    if (r.decode_from >= 0) {
        if (r.score_from >= 0) {
            return "decode_from and score_from exclude each other";
        }
        if (r.decode_from < 1 || r.decode_from >= r.n_prompt) {
            return "decode_from must be an index into the prompt after its first token";
        }
        if (r.n_steps < r.n_prompt - r.decode_from) {
            return "steps must cover the prompt tokens from decode_from on";
        }
    }
    *req = r;
    return NULL;
}
