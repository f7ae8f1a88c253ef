#include "decode.h"

#include <string.h>

#include "../runtime/checkpoint.h"
#include "../runtime/checksum.h"
#include "../runtime/expert_cache.h"
#include "../runtime/image_loader.h"
#include "../runtime/kernels/kernels.h"
#include "../runtime/model.h"
#include "../runtime/ops.h"
#include "../runtime/parallel.h"
#include "../runtime/ranks.h"
#include "board_def.h"
#include "bsp.h"
#include "protocol.h"
#include "speculate.h"

void colibri_report_error(int code, const char *message)
{
    proto_begin("error");
    proto_u64("code", (uint64_t)code);
    proto_str("msg", message);
    proto_end();
}

void colibri_hello(void)
{
    proto_begin("hello");
    proto_u64("proto", PROTO_VERSION);
    proto_str("fw", COLIBRI_FW_VERSION);
    proto_str("board", COLIBRI_BOARD);
    proto_str("arch", COLIBRI_ARCHITECTURE);
    proto_str("quant", COLIBRI_QUANT_NAME);
    proto_u64("ctx", COLIBRI_N_CTX);
    proto_u64("vocab", COLIBRI_VOCAB);
    const char *machine = bsp_machine();
    if (machine != NULL) {
        proto_str("machine", machine);
    }
    proto_str("cpu", kernel_cpu_features());
    proto_str("kernels", kernel_set());
    proto_hex("model", colibri_model_hash, 32);
    proto_hex("weights", colibri_weights_sha256, 32);
    const uint8_t *build_id = NULL;
    size_t build_id_len = bsp_build_id(&build_id);
    if (build_id_len > 0) {
        proto_hex("build", build_id, (int)build_id_len);
    }
    proto_end();
}

static int is_eos(int32_t token)
{
    for (int i = 0; i < COLIBRI_N_EOS; i++) {
        if (colibri_eos_ids[i] == token) {
            return 1;
        }
    }
    return 0;
}

/* The SHA-256 of a step's logits (COLIBRI_VOCAB float32 as they lie in memory: little-endian). */
static void logits_sha256(const float *logits, uint8_t digest[32])
{
    Sha256 sha;
    sha256_init(&sha);
    sha256_update(&sha, (const uint8_t *)logits, COLIBRI_VOCAB * sizeof(float));
    sha256_final(&sha, digest);
}

/* Tokens of the conversation whose keys and values the KV cache holds: where a request with start
 * may continue. A failed request forgets them. */
static int32_t held;

/* The prompt tokens prefilled in batches: all of them, or those before decode_from (the rest are
 * decoded one per forward pass, as steps). */
static int32_t prefilled_tokens(const ColibriRequest *req)
{
    return req->decode_from >= 0 ? req->decode_from : req->n_prompt;
}

static int check_request(const ColibriRequest *req)
{
    if (req->n_prompt < 1 || (req->n_steps < 1 && req->score_from < 0)) {
        colibri_report_error(COLIBRI_ERR_REQUEST, "need a prompt of at least one token and at least one step");
        return COLIBRI_ERR_REQUEST;
    }
    if (req->start != 0 && req->start != held) {
        colibri_report_error(COLIBRI_ERR_REQUEST, "start must be 0 or the tokens the firmware holds (held in its last done frame)");
        return COLIBRI_ERR_REQUEST;
    }
    const int64_t last_fed = (int64_t)req->start + prefilled_tokens(req) + (req->n_steps > 0 ? req->n_steps - 1 : 0);
    if (last_fed > COLIBRI_N_CTX) {
        colibri_report_error(COLIBRI_ERR_REQUEST, req->start > 0 ? "the conversation is full: it and this request exceed the context this firmware was built for"
                                                                 : "prompt + steps exceed the context this firmware was built for");
        return COLIBRI_ERR_REQUEST;
    }
    for (int32_t i = 0; i < req->n_prompt; i++) {
        if (req->prompt[i] < 0 || req->prompt[i] >= COLIBRI_VOCAB) {
            colibri_report_error(COLIBRI_ERR_REQUEST, "prompt token id outside the vocabulary");
            return COLIBRI_ERR_REQUEST;
        }
    }
    return 0;
}

static ColibriWeights weights;
static int weights_loaded;
ColibriWeightsInfo colibri_weights_info;

int colibri_load(const uint8_t *image, uint64_t image_len)
{
    return colibri_load_checking(image, image_len, COLIBRI_CHECK_ALL);
}

int colibri_load_checking(const uint8_t *image, uint64_t image_len, int check)
{
    int status = colibri_image_open_checking(image, image_len, &weights, (colibri_check)check);
    weights_loaded = (status == COLIBRI_OK);
    return status;
}

/* A checkpoint frame (runtime/checkpoint.h): layer (-1: the embedding; COLIBRI_N_LAYERS: the final
 * norm and the logits), operation, width, the SHA-256 of the row and a few of its values. */
static void send_checkpoint(int layer, const char *op, int64_t n, const uint8_t digest[32], const float *values,
                            int n_values)
{
    proto_begin("checkpoint");
    proto_i64("layer", layer);
    proto_str("op", op);
    proto_u64("n", (uint64_t)n);
    proto_hex("sha", digest, 32);
    proto_f32_list("values", values, n_values);
    proto_end();
}

/* A forward pass, with its checkpoints sent when `traced` (the pass whose logits the traced step samples). */
static int forward_traced(int traced, ColibriBuffers *b, const int32_t *tokens, int n, int32_t pos, int want_logits)
{
    checkpoint_sink = traced ? send_checkpoint : NULL;
    const int status = colibri_forward(&weights, b, tokens, n, pos, want_logits);
    checkpoint_sink = NULL;
    return status;
}

/* Prompt tokens [from, to) at positions start + from ...: in batches, the logits of the last one
 * computed (traced when step 0 is: the last batch's pass gives its logits). */
static int prefill(ColibriBuffers *b, const ColibriRequest *req, int32_t from, int32_t to)
{
    for (int32_t i = from; i < to; i += COLIBRI_PREFILL_BATCH) {
        const int n = to - i < COLIBRI_PREFILL_BATCH ? (int)(to - i) : COLIBRI_PREFILL_BATCH;
        const int traced = req->trace == 0 && req->score_from < 0 && i + n == to;
        const int status = forward_traced(traced, b, req->prompt + i, n, req->start + i, i + n == to);
        if (status != 0) {
            return status;
        }
    }
    return 0;
}

/* -1 when a step's logits are all finite; else the layer they are blamed on: the first whose
 * output held a NaN or an infinity in this request (model.c checks each), or COLIBRI_N_LAYERS when
 * every layer's output was finite (the final norm and the output matrix made it). */
static int nonfinite_layer(const ColibriBuffers *b, const float *logits)
{
    if (op_all_finite(logits, COLIBRI_VOCAB)) {
        return -1;
    }
    return b->nonfinite_layer >= 0 ? b->nonfinite_layer : COLIBRI_N_LAYERS;
}

/* The frames' nonfinite field: the layer, or "head" (COLIBRI_N_LAYERS: the final norm or the
 * output matrix). */
static void proto_nonfinite(const char *key, int layer)
{
    if (layer == COLIBRI_N_LAYERS) {
        proto_str(key, "head");
    } else {
        proto_u64(key, (uint64_t)layer);
    }
}

/* The request ends at a step whose logits are not finite: after its token or score frame (which
 * carries nonfinite=LAYER), this error frame, and the conversation is forgotten. */
static int nonfinite_stop(int32_t step, int layer)
{
    proto_begin("error");
    proto_u64("code", COLIBRI_ERR_NONFINITE);
    proto_str("msg", "the logits hold a NaN or an infinity");
    proto_u64("step", (uint64_t)step);
    proto_nonfinite("layer", layer);
    proto_end();
    held = 0;
    return COLIBRI_ERR_NONFINITE;
}

/* The score frame of prompt token `index`, given the logits of the tokens before it: the two f32
 * parts of its log-probability, logit - max and the sum of exp(logit_i - max) (op_exp_sum), so
 * that the host takes the logarithm and the reference can check every bit; nonfinite=LAYER when
 * the logits are not finite (then the request stops: nonfinite_stop). */
static void send_score(const float *logits, int32_t index, int32_t token, int nonfinite)
{
    float max;
    const float sum = op_exp_sum(logits, COLIBRI_VOCAB, &max);
    proto_begin("score");
    proto_u64("i", (uint64_t)index);
    proto_u64("id", (uint64_t)token);
    proto_f32("lp", logits[token] - max);
    proto_f32("z", sum);
    if (nonfinite >= 0) {
        proto_nonfinite("nonfinite", nonfinite);
    }
    proto_end();
}

/* A forward pass that failed (an expert that could not be brought in): its error frame; on several
 * ranks the failing rank's line on stderr too, and every rank ended (runtime/ranks.h). */
static int forward_failed(int status)
{
    const char *why = colibri_experts_failure();
    colibri_report_error(status, why != NULL ? why : colibri_status_message(status));
    ranks_fail(status, why != NULL ? why : colibri_status_message(status));
    return status;
}

/* The prompt: prefilled in batches, or, when it is scored, up to the first scored position in
 * batches and then a token at a time, every token's logits scoring the next one. */
static int feed_prompt(ColibriBuffers *b, const ColibriRequest *req)
{
    if (req->score_from < 0) {
        return prefill(b, req, 0, prefilled_tokens(req));
    }
    int status = prefill(b, req, 0, req->score_from + 1);
    for (int32_t i = req->score_from; status == 0 && i + 1 < req->n_prompt; i++) {
        const int nonfinite = nonfinite_layer(b, b->logits);
        send_score(b->logits, i + 1, req->prompt[i + 1], nonfinite);
        if (nonfinite >= 0) {
            return nonfinite_stop(i + 1, nonfinite);
        }
        status = colibri_forward(&weights, b, req->prompt + i + 1, 1, req->start + i + 1, 1);
    }
    return status;
}

/* What the stats frame reports, gathered around the decode loop rather than in it: the clock, the
 * retired instructions and the expert cache's counters at the start, after the prompt and at the
 * end, and the decode's forward passes with their own time. */
typedef struct {
    int counted;              /* 1: the board counts retired instructions (bsp_instructions) */
    uint64_t t0, t1, t2;      /* bsp_time_us(): start, prompt done, decode done */
    uint64_t i0, i1, i2;      /* retired instructions at the same three points */
    ColibriCacheStats c1, c2; /* the expert cache's counters: prompt done, decode done */
    int32_t decode_passes;    /* forward passes after the prompt (the first token needs none) */
    uint64_t forward_us;      /* time in those forward passes alone (no sampling, hashing, output) */
} DecodeStats;

static void stats_start(DecodeStats *s)
{
    memset(s, 0, sizeof *s);
    s->counted = bsp_instructions(&s->i0);
    s->t0 = bsp_time_us();
}

static void stats_prompt_done(DecodeStats *s)
{
    s->t1 = bsp_time_us();
    colibri_experts_stats(&s->c1);
    if (s->counted) {
        bsp_instructions(&s->i1);
    }
}

static void stats_decode_done(DecodeStats *s)
{
    s->t2 = bsp_time_us();
    if (s->counted) {
        bsp_instructions(&s->i2);
    }
    colibri_experts_stats(&s->c2);
}

/* One forward pass of the decode (the token just sent, at pos, then the n - 1 drafted tokens after
 * it: logits after each), timed alone. */
static int decode_forward(DecodeStats *s, ColibriBuffers *b, const int32_t *tokens, int n, int32_t pos, int traced)
{
    const uint64_t f0 = bsp_time_us();
    const int status =
        forward_traced(traced, b, tokens, n, pos, n > 1 ? COLIBRI_LOGITS_EVERY_TOKEN : COLIBRI_LOGITS_LAST);
    if (status == 0) {
        s->forward_us += bsp_time_us() - f0;
        s->decode_passes++;
    }
    return status;
}

/* The conversation's tokens by position (the KV cache's, then the token being fed): the repetition
 * penalty's window, and from the request's start on, where speculative drafts are looked up. */
static int32_t history[COLIBRI_N_CTX];

#if COLIBRI_SPEC_TOKENS > 0
/* What a pass of 1, 2, ... tokens costs on this board against a pass of one (board_def.h). */
static const float spec_pass_cost[] = COLIBRI_SPEC_PASS_COST;
_Static_assert(sizeof spec_pass_cost / sizeof spec_pass_cost[0] >= COLIBRI_SPEC_TOKENS,
               "the board file gives a pass cost for every token count a pass may have");
#endif

/* The token frame of a step: its id, the SHA-256 of the logits it came from (if asked) and the
 * microseconds since the prompt was done (per-token latencies); the logits to the BSP's sink.
 * nonfinite=LAYER when the logits are not finite (nonfinite_layer; then the request stops). */
static void send_token(const ColibriRequest *req, int32_t step, int32_t token, const float *logits,
                       const DecodeStats *s, int nonfinite)
{
    bsp_logits_sink(step, logits, COLIBRI_VOCAB);
    proto_begin("token");
    proto_u64("step", (uint64_t)step);
    proto_u64("id", (uint64_t)token);
    if (req->digests) {
        uint8_t digest[32];
        logits_sha256(logits, digest);
        proto_hex("logits", digest, 32);
    }
    proto_u64("us", bsp_time_us() - s->t1);
    if (nonfinite >= 0) {
        proto_nonfinite("nonfinite", nonfinite);
    }
    proto_end();
}

static void send_stats(const DecodeStats *s, int32_t prefilled, const SpecState *spec)
{
    const ColibriCacheStats *c1 = &s->c1, *c2 = &s->c2;
    proto_begin("stats");
    proto_u64("prompt", (uint64_t)prefilled);
    proto_u64("prefill_us", s->t1 - s->t0);
    proto_u64("decode", (uint64_t)s->decode_passes);
    proto_u64("decode_us", s->t2 - s->t1);
    proto_u64("forward_us", s->forward_us);
    proto_u64("threads", (uint64_t)parallel_threads());
    if (spec != NULL) {
        /* Speculative decoding: passes that checked a draft, tokens drafted, tokens taken. */
        proto_u64("spec_passes", (uint64_t)spec->passes);
        proto_u64("drafted", (uint64_t)spec->drafted);
        proto_u64("accepted", (uint64_t)spec->accepted);
    }
    if (bsp_peak_memory() > 0) {
        proto_u64("peak_rss", bsp_peak_memory());
    }
    uint64_t stack_used, stack_size, heap_peak, heap_size;
    if (bsp_margins(&stack_used, &stack_size, &heap_peak, &heap_size)) {
        /* An MCU's margins, since it started: the stack's high-water mark and the largest heap use. */
        proto_u64("stack_used", stack_used);
        proto_u64("stack_size", stack_size);
        proto_u64("heap_peak", heap_peak);
        proto_u64("heap_size", heap_size);
    }
    if (s->counted) {
        /* Exact retired instructions (emulators with -icount, or a CPU counter). */
        proto_u64("prefill_instret", s->i1 - s->i0);
        proto_u64("decode_instret", s->i2 - s->i1);
    }
    const ColibriWeightsInfo *info = &colibri_weights_info;
    if (info->mapped) {
        /* Protocol 3: how the weights are held, and the expert cache's counters over the decode
         * (after the prompt) and the prompt's reads. */
        proto_u64("mapped", 1);
        proto_u64("budget", info->budget);
        proto_u64("slots", c2->slots); /* over several ranks: summed, as the counters below */
        proto_u64("locked", info->locked_bytes);
        proto_u64("resident", info->resident_bytes);
        proto_u64("lock_refused", (uint64_t)info->lock_refused);
        proto_u64("direct_io", (uint64_t)info->direct_io);
        proto_u64("prefetch", (uint64_t)info->prefetch);
        proto_u64("lru", (uint64_t)info->eviction_lru);
        proto_u64("cache_hits", c2->hits - c1->hits);
        proto_u64("cache_misses", c2->misses - c1->misses);
        proto_u64("prefetches", c2->prefetches - c1->prefetches);
        proto_u64("prefetch_hits", c2->prefetch_hits - c1->prefetch_hits);
        proto_u64("read_bytes", c2->bytes_read - c1->bytes_read);
        proto_u64("read_wait_us", c2->wait_us - c1->wait_us);
        proto_u64("read_time_us", c2->read_us - c1->read_us);
        /* Over the whole run, prompt included: how the reads overlapped. */
        proto_u64("reads_in_flight", c2->max_in_flight);
        proto_u64("reads_reordered", c2->reordered);
        proto_u64("prefill_read_bytes", c1->bytes_read);
        proto_u64("prefill_read_wait_us", c1->wait_us);
        if (info->auto_source != NULL) {
            /* --memory-budget auto: what the board found, so the host can say why this budget. */
            proto_u64("auto_found", info->auto_found);
            proto_u64("auto_margin", info->auto_margin);
            proto_str("auto_source", info->auto_source);
            proto_str("auto_where", info->auto_where);
        }
    }
    proto_end();
}

/* How often each expert was chosen, per MoE layer, over the prompt and the decode. */
static void send_expert_counts(const ColibriBuffers *b)
{
#if COLIBRI_N_EXPERTS > 0
    for (int l = 0; l < COLIBRI_N_LAYERS; l++) {
        if (colibri_layer_moe[l]) {
            proto_experts(l, b->expert_counts + l * COLIBRI_N_EXPERTS, COLIBRI_N_EXPERTS);
        }
    }
#else
    (void)b;
#endif
}

static void send_done(int32_t generated, const char *reason)
{
    proto_begin("done");
    proto_u64("tokens", (uint64_t)generated);
    proto_str("reason", reason);
    proto_u64("held", (uint64_t)held);
    proto_end();
}

int colibri_decode_quietly(const int32_t *prompt, int32_t n_prompt, int32_t steps, int32_t *tokens,
                           uint8_t (*digests)[32], int *done)
{
    *done = 0;
    held = 0;
    if (!weights_loaded) {
        return COLIBRI_ERR_NO_IMAGE;
    }
    const ColibriRequest req = {.prompt = prompt, .n_prompt = n_prompt, .n_steps = steps,
                                .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0,
                                             .repeat_penalty = 1.0f, .repeat_last_n = 0},
                                .threads = 1, .probe_mib = -1, .score_from = -1, .decode_from = -1, .trace = -1};
    ColibriBuffers b;
    colibri_buffers_init(&b);
    ColibriRng rng;
    rng_seed(&rng, 0);
    int status = prefill(&b, &req, 0, n_prompt);
    for (int32_t step = 0; status == 0 && step < steps; step++) {
        tokens[step] = sample_token(b.logits, COLIBRI_VOCAB, &req.sampling, NULL, 0, &rng, b.probs, b.cand);
        logits_sha256(b.logits, digests[step]);
        *done = step + 1;
        if (step + 1 < steps) {
            status = colibri_forward(&weights, &b, &tokens[step], 1, n_prompt + step, 1);
        }
    }
    return status;
}

int colibri_decode(const ColibriRequest *req)
{
    if (!weights_loaded) {
        colibri_report_error(COLIBRI_ERR_NO_IMAGE, "no valid weight image is loaded");
        return COLIBRI_ERR_NO_IMAGE;
    }
    int status = check_request(req);
    held = 0; /* until this request is done, the KV cache holds no conversation to continue */
    if (status != 0) {
        return status;
    }
    ColibriBuffers b;
    colibri_buffers_init(&b);
#if COLIBRI_N_EXPERTS > 0
    memset(b.expert_counts, 0, sizeof(int32_t) * COLIBRI_N_LAYERS * COLIBRI_N_EXPERTS);
#endif
    ColibriRng rng;
    rng_seed(&rng, req->sampling.seed);
    DecodeStats stats;

    stats_start(&stats);
    status = feed_prompt(&b, req);
    if (status == COLIBRI_ERR_NONFINITE) {
        return status; /* said already, in a score frame and an error frame */
    }
    if (status != 0) {
        return forward_failed(status);
    }
    stats_prompt_done(&stats);

    const int32_t prefilled = prefilled_tokens(req);
    int32_t pos = req->start + prefilled;
    int32_t generated = 0;
    const char *reason = "length";
    /* Speculative decoding (requested, and possible for this plan; not with teacher forcing):
     * batch holds the token just sampled and the drafted tokens after it, fed in one pass; the
     * logits after batch[i] are then those of step + i + 1, used while the sampled tokens equal
     * the drafted ones (`ahead` drafted tokens fed, `taken` of them sampled so far). */
    const int speculate = COLIBRI_SPEC_TOKENS > 0 && req->decode_from < 0 && req->trace < 0 ? req->speculate : 0;
    SpecState spec = {0};
    int32_t batch[COLIBRI_SPEC_TOKENS > 0 ? COLIBRI_SPEC_TOKENS : 1];
    int ahead = 0, taken = 0;
    /* The prompt follows what the conversation holds (check_request: start + prefilled + steps - 1
     * fit the context, so every token fed below has its place). */
    memcpy(history + req->start, req->prompt, (size_t)prefilled * sizeof(int32_t));
    int32_t n_history = req->start + prefilled;
    const float *logits = b.logits;
    for (int32_t step = 0; step < req->n_steps; step++) {
        /* Teacher forcing: the prompt's next token instead of a sampled one, while there is one. */
        const int forced = prefilled + step < req->n_prompt;
        /* Logits with a NaN or an infinity are not sampled: the step's frame says so (its id 0,
         * or the forced token) and the request ends. */
        const int nonfinite = nonfinite_layer(&b, logits);
        const int32_t token = forced ? req->prompt[prefilled + step]
                               : nonfinite >= 0 ? 0
                                                : sample_token(logits, COLIBRI_VOCAB, &req->sampling, history, n_history,
                                                               &rng, b.probs, b.cand);
        send_token(req, step, token, logits, &stats, nonfinite);
        if (nonfinite >= 0) {
            return nonfinite_stop(step, nonfinite);
        }
        generated++;
        if (req->stop_at_eos && !forced && is_eos(token)) {
            reason = "eos";
            break;
        }
        if (step == req->n_steps - 1) {
            break;
        }
        history[n_history++] = token;
#if COLIBRI_SPEC_TOKENS > 0
        if (speculate) {
            if (taken < ahead && token == batch[1 + taken]) { /* fed already: its logits are computed */
                taken++;
                logits = b.spec_logits + (int64_t)taken * COLIBRI_VOCAB;
                pos++;
                continue;
            }
            if (ahead > 0) {
                spec_taken(&spec, ahead, taken);
            }
        }
#endif
        /* A new pass: this token, and a draft after it where one is found. Drafted tokens past the
         * last step or the context would be checked for nothing. */
        int n = 1;
        batch[0] = token;
#if COLIBRI_SPEC_TOKENS > 0
        if (speculate) {
            int most = speculate;
            const int32_t steps_left = req->n_steps - 1 - step, room = COLIBRI_N_CTX - 1 - pos;
            most = most < steps_left - 1 ? most : steps_left - 1;
            most = most < room ? most : room;
            most = most < COLIBRI_SPEC_TOKENS - 1 ? most : COLIBRI_SPEC_TOKENS - 1;
            n += spec_draft(&spec, history + req->start, n_history - req->start, batch + 1, most, spec_pass_cost);
        }
#endif
        status = decode_forward(&stats, &b, batch, n, pos, step + 1 == req->trace);
        if (status != 0) {
            return forward_failed(status);
        }
        ahead = n - 1;
        taken = 0;
        logits = n > 1 ? b.spec_logits : b.logits;
        pos++;
    }
    if (ahead > 0) {
        spec_taken(&spec, ahead, taken);
    }
    stats_decode_done(&stats);

    held = pos; /* the last token sent is not fed back: the next request starts with it */
    send_stats(&stats, prefilled, speculate ? &spec : NULL);
    send_expert_counts(&b);
    send_done(generated, reason);
    return 0;
}
