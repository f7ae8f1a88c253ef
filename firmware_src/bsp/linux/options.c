/* The Linux firmware's command line into Options (options.h), each value checked, and its usage. */
#include "options.h"

#include <stdio.h>
#include <string.h>

#include "../../app/decode.h"
#include "../../runtime/expert_cache.h"
#include "memory_limit.h"

static const char usage[] =
    "usage: firmware --weights IMAGE [--memory-budget BYTES|auto|auto-MARGIN] [--prefetch auto|0|1]\n"
    "                [--evict auto|lfu|lru] [--probe-storage MIB]\n"
    "                [--copy-weights | --map-weights] [--logits-out FILE] < REQUESTS\n"
    "Each request is one request frame on a line of stdin, the same line an MCU board reads on its\n"
    "UART (firmware_src/app/request.c), served in turn until stdin ends; results go to stdout as\n"
    "frames. The image is mapped read-only; unlimited, and where the whole model fits in the memory\n"
    "this process may use (as auto finds it, less 128 MiB), it is then read into memory in 2 MiB\n"
    "pages (--map-weights: not; it stays read through the mapping's pages);\n"
    "with a memory budget (bytes; 0: unlimited) the resident weights are locked in RAM and routed\n"
    "experts are read into a fixed pool of slots. --memory-budget auto takes the smaller of this\n"
    "process's memory cgroup limit and MemAvailable less a margin (auto-MARGIN: that many bytes;\n"
    "default 128 MiB); when that holds the whole model, it runs unlimited. --evict auto: with top-k\n"
    "slots per MoE layer or more, the least recently used expert goes (lru), with fewer the least\n"
    "often used (lfu); --prefetch 1 has an I/O thread read the next layer's likely experts meanwhile\n"
    "(off by default: measured slower).\n"
    "--probe-storage measures the image file's read bandwidth first; --copy-weights reads the whole\n"
    "image into memory instead of mapping it (the path before mapping, for comparisons).\n";

int refuse_with_usage(int code, const char *message)
{
    colibri_report_error(code, message);
    fprintf(stderr, "%s%s\n", usage, message);
    return 2;
}

/* A decimal count of bytes (or MiB), all digits, no overflow: 0, or -1 when it is not one. */
static int parse_u64(const char *text, uint64_t *out)
{
    uint64_t v = 0;
    if (*text == '\0') {
        return -1;
    }
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) {
            return -1;
        }
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

int parse_options(int argc, char **argv, Options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->prefetch = opt->eviction = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--copy-weights") == 0) {
            opt->copy_weights = 1;
            continue;
        }
        if (strcmp(argv[i], "--map-weights") == 0) {
            opt->map_weights = 1;
            continue;
        }
        if (i + 1 == argc) {
            return refuse_with_usage(COLIBRI_ERR_REQUEST, "missing value after an option");
        }
        if (strcmp(argv[i], "--weights") == 0) {
            opt->weights_path = argv[++i];
        } else if (strcmp(argv[i], "--logits-out") == 0) {
            opt->logits_path = argv[++i];
        } else if (strcmp(argv[i], "--memory-budget") == 0) {
            const char *value = argv[++i];
            opt->budget_auto = strncmp(value, "auto", 4) == 0;
            opt->auto_margin = COLIBRI_AUTO_MARGIN_BYTES;
            int malformed = opt->budget_auto
                                ? (value[4] != '\0' && (value[4] != '-' || parse_u64(value + 5, &opt->auto_margin) != 0))
                                : parse_u64(value, &opt->budget) != 0;
            if (malformed) {
                return refuse_with_usage(COLIBRI_ERR_REQUEST, "--memory-budget takes a number of bytes, auto or auto-MARGIN (bytes)");
            }
        } else if (strcmp(argv[i], "--probe-storage") == 0) {
            if (parse_u64(argv[++i], &opt->probe_storage_mib) != 0 || opt->probe_storage_mib == 0) {
                return refuse_with_usage(COLIBRI_ERR_REQUEST, "--probe-storage takes a number of MiB");
            }
        } else if (strcmp(argv[i], "--evict") == 0) {
            i++;
            opt->eviction = strcmp(argv[i], "lfu") == 0    ? COLIBRI_EVICT_LFU
                            : strcmp(argv[i], "lru") == 0  ? COLIBRI_EVICT_LRU
                            : strcmp(argv[i], "auto") == 0 ? -1
                                                           : -2;
            if (opt->eviction == -2) {
                return refuse_with_usage(COLIBRI_ERR_REQUEST, "--evict takes auto, lfu or lru");
            }
        } else if (strcmp(argv[i], "--prefetch") == 0) {
            i++;
            opt->prefetch = strcmp(argv[i], "1") == 0 ? 1 : strcmp(argv[i], "0") == 0 ? 0 : strcmp(argv[i], "auto") == 0 ? -1 : -2;
            if (opt->prefetch == -2) {
                return refuse_with_usage(COLIBRI_ERR_REQUEST, "--prefetch takes auto, 0 or 1");
            }
        } else {
            return refuse_with_usage(COLIBRI_ERR_REQUEST, "unknown option");
        }
    }
    if (opt->weights_path == NULL) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, "--weights is required");
    }
    if (opt->copy_weights && (opt->budget > 0 || opt->budget_auto)) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, "--copy-weights reads the whole image: it cannot keep a --memory-budget");
    }
    if (opt->copy_weights && opt->map_weights) {
        return refuse_with_usage(COLIBRI_ERR_REQUEST, "--copy-weights and --map-weights ask for opposite things: give one");
    }
    return 0;
}
