/* Linux BSP (host, linux-aarch64): the firmware as a Linux process. Requests arrive on stdin as
 * request frames (the grammar every board reads), one per line, served in turn until stdin ends (a
 * conversation continues in the KV cache from one to the next); results go to stdout. The weight
 * image is mapped read-only; under a memory budget its resident part is locked and routed experts
 * come through the expert cache (runtime/expert_cache.c) from storage.c's reads.
 *
 * This file: the start-up in its order and the serve loop. Beside it: hooks.c (app/bsp.h's hooks),
 * options.c (the command line), budget.c (the memory budget), probes.c (the bandwidth probes),
 * image_map.c (the mapping, 2 MiB pages, the fault handler), held_weights.c (the weights held,
 * checked and bound), storage.c, memory_limit.c and read_probe.c. */
#include <stdio.h>
#include <string.h>

#include "../../app/decode.h"
#include "../../app/selftest.h"
#include "../../runtime/image_loader.h"
#include "../../runtime/parallel.h"
#include "../../runtime/ranks.h"
#include "budget.h"
#include "held_weights.h"
#include "hooks.h"
#include "image_map.h"
#include "model_def.h"
#include "options.h"
#include "probes.h"

/* One line from stdin into line (capacity bytes): its length, or -1 if there is none or it is
 * longer than any request. */
static int read_stdin_line(char *line, int capacity)
{
    if (fgets(line, capacity, stdin) == NULL) {
        return -1;
    }
    size_t len = strlen(line);
    if (len == (size_t)capacity - 1 && line[len - 1] != '\n') {
        return -1;
    }
    /* A line cut short (a host killed mid-send, a link dropped) and then a whole request: the
     * request is the last frame marker's, the fragment before it is dropped. */
    const char *last = NULL;
    for (const char *p = strstr(line, "@CLB "); p != NULL; p = strstr(p + 1, "@CLB ")) {
        last = p;
    }
    if (last != NULL && last != line) {
        fprintf(stderr, "colibri: note: %d bytes of a cut request line dropped before a new request\n",
                (int)(last - line));
        len -= (size_t)(last - line);
        memmove(line, last, len + 1);
    }
    return (int)len;
}

/* The leader's line on every rank (runtime/ranks.h): only rank 0 reads the link. */
static int read_request_line(char *line, int capacity)
{
    return ranks_share_line(line, ranks_leader() ? read_stdin_line(line, capacity) : 0);
}

#define REQUEST_LINE_BYTES COLIBRI_REQUEST_LINE_BYTES(COLIBRI_N_CTX)

/* The first request (parsed already: it set the threads and the probes), then every further line
 * until stdin ends, each answered in turn. Returns the last request's status. */
static int serve_requests(char *line, int capacity, int len, ColibriRequest *req, int32_t *prompt)
{
    const int threads = req->threads;
    int status = 0;
    for (int served = 0; len >= 0; served++) {
        const char *problem = NULL;
        if (served > 0) {
            problem = colibri_parse_request(line, len, req, prompt, COLIBRI_N_CTX);
            if (problem == NULL && req->probe_mib >= 0) {
                problem = "the bandwidth probe runs only before the first request";
            }
            if (problem == NULL && !req->selftest && req->threads != threads) {
                problem = "threads must stay what the first request set";
            }
        }
        if (problem != NULL) {
            colibri_report_error(COLIBRI_ERR_REQUEST, problem);
            status = COLIBRI_ERR_REQUEST;
        } else if (image_changed()) {
            /* Without a budget every weight is read through the mapping: a file written or cut
             * since start would be decoded from silently (or fault); under a budget the resident
             * part is this process's copy, but its experts come from the file. Either way: no. */
            colibri_report_error(COLIBRI_ERR_READ, "the weight image file changed (truncated or rewritten) since the "
                                                   "firmware opened it: restart the firmware to use the new file");
            status = COLIBRI_ERR_READ;
        } else if (req->selftest) {
            status = colibri_selftest(0, NULL, 1); /* the image is loaded: requests are served only then */
        } else {
            status = colibri_decode(req);
        }
        len = read_request_line(line, capacity);
    }
    return status;
}

static int serve(int argc, char **argv)
{
    static int32_t prompt[COLIBRI_N_CTX];
    static char line[REQUEST_LINE_BYTES + 2];
    kv_cache_in_huge_pages(colibri_key_cache, sizeof colibri_key_cache);
    kv_cache_in_huge_pages(colibri_value_cache, sizeof colibri_value_cache);
    colibri_hello();
    Options opt;
    const int bad_options = parse_options(argc, argv, &opt);
    if (bad_options != 0) {
        return bad_options;
    }
    const int len = read_request_line(line, (int)sizeof line);
    if (len < 0) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, "no request frame on stdin (or a line longer than any request)");
    }
    ColibriRequest req;
    const char *problem = colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX);
    if (problem != NULL) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, problem);
    }
    HeldWeights w = {0};
    if (plan_budget(&opt, &w.slots) != 0 || run_probes(&opt, &req) != 0) {
        return 1;
    }
    parallel_start(req.threads);
    if (open_image(&opt, &w) != 0) {
        return 1;
    }
    if (!opt.copy_weights) {
        catch_mapping_faults(w.image, w.image_len);
    }
    if (opt.logits_path != NULL && logits_out_open(opt.logits_path) != 0) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, "cannot open the --logits-out file");
    }
    int status = bind_weights(&opt, &w);
    if (status < 0) {
        return 1;
    }
    if (status == 0) {
        status = serve_requests(line, (int)sizeof line, len, &req, prompt);
    } else {
        if (req.selftest) {
            colibri_selftest(status, NULL, 1); /* a refused image: the self-test's FAIL says why */
        } else {
            colibri_report_error(status, colibri_status_message(status));
        }
        if (ranks_count() > 1) { /* the frames are rank 0's alone: every rank says which image it refused */
            fprintf(stderr, "colibri: error: rank %d: weight image %s: %s\n", ranks_rank(), opt.weights_path,
                    colibri_status_message(status));
        }
    }
    logits_out_close();
    release_weights(&opt, &w);
    return status == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    ranks_start(&argc, &argv); /* before the hello frame: rank 0 alone says it */
    return ranks_finish(serve(argc, argv));
}
