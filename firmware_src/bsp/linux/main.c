/* Linux BSP (host, linux-aarch64): the firmware as a Linux process. Arguments carry the request; results go to stdout. */
#define _GNU_SOURCE /* dl_iterate_phdr, for the build-id */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../app/bsp.h"
#include "../../app/build_id.h"
#include "../../app/decode.h"
#include "../../app/protocol.h"
#include "../../runtime/image_loader.h"
#include "../../runtime/parallel.h"
#include "model_def.h"
#include "read_probe.h"

static FILE *logits_file;

void bsp_write(const char *data, size_t len)
{
    fwrite(data, 1, len, stdout);
    fflush(stdout);
}

uint64_t bsp_time_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int bsp_instructions(uint64_t *count)
{
    (void)count;
    return 0; /* wall-clock time only on Linux boards */
}

typedef struct {
    const uint8_t *id;
    size_t len;
} BuildId;

static int find_build_id(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    BuildId *found = data;
    for (int i = 0; i < info->dlpi_phnum && found->len == 0; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) {
            continue;
        }
        const uint8_t *note = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        size_t left = ph->p_memsz;
        while (left >= 16 && found->len == 0) {
            uint32_t namesz, descsz;
            memcpy(&namesz, note, 4);
            memcpy(&descsz, note + 4, 4);
            size_t step = 12 + (((size_t)namesz + 3u) & ~(size_t)3u) + (((size_t)descsz + 3u) & ~(size_t)3u);
            found->len = colibri_build_id_from_note(note, left, &found->id);
            if (step > left) {
                break;
            }
            note += step;
            left -= step;
        }
    }
    return 1; /* the first object is the program itself */
}

size_t bsp_build_id(const uint8_t **id)
{
    BuildId found = {NULL, 0};
    dl_iterate_phdr(find_build_id, &found);
    *id = found.id;
    return found.len;
}

/* VmHWM of this process image (getrusage's ru_maxrss would include the launcher's memory from
 * before exec). */
uint64_t bsp_peak_memory(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) {
        return 0;
    }
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return (uint64_t)kb * 1024u;
}

void bsp_logits_sink(int32_t step, const float *logits, int32_t n)
{
    (void)step;
    if (logits_file != NULL) {
        fwrite(logits, sizeof(float), (size_t)n, logits_file);
    }
}

static const char usage[] =
    "usage: firmware --weights IMAGE --prompt-ids ID,ID,... [--steps N] [--temperature T] [--top-k K]\n"
    "                [--top-p P] [--min-p P] [--seed S] [--ignore-eos] [--logits-out FILE] [--threads N]\n"
    "                [--no-digests] [--probe-bandwidth MIB]\n"
    "--probe-bandwidth: first measure the memory read bandwidth over MIB MiB (0: twice the largest cache)\n"
    "with the same threads, in a child process, and report it in a bandwidth frame\n";

static int fail(const char *message)
{
    colibri_report_error(COLIBRI_ERR_REQUEST, message);
    fprintf(stderr, "%s%s\n", usage, message);
    return 2;
}

static int parse_float(const char *text, float *out)
{
    char *end;
    errno = 0;
    *out = strtof(text, &end); /* the host passes exact hexadecimal floats */
    return errno == 0 && end != text && *end == '\0';
}

static int parse_long(const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        return 0;
    }
    *out = v;
    return 1;
}

static uint8_t *read_image(const char *path, uint64_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    uint8_t *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        if (size > 0 && fseek(f, 0, SEEK_SET) == 0) {
            size_t rounded = ((size_t)size + 63u) & ~(size_t)63u;
            buf = aligned_alloc(64, rounded);
            if (buf != NULL && fread(buf, 1, (size_t)size, f) != (size_t)size) {
                free(buf);
                buf = NULL;
            }
            *len = (uint64_t)size;
        }
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    const char *weights_path = NULL;
    const char *logits_path = NULL;
    static int32_t prompt[COLIBRI_N_CTX];
    colibri_hello();
    ColibriRequest req = {prompt, 0, 16, {0.0f, 0, 1.0f, 0.0f, 0}, 1, 1};
    int threads = 1;
    long long probe_mib = -1; /* -1: no bandwidth probe */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = (i + 1 < argc) ? argv[i + 1] : NULL;
        long long n;
        if (strcmp(arg, "--ignore-eos") == 0) {
            req.stop_at_eos = 0;
            continue;
        }
        if (strcmp(arg, "--no-digests") == 0) {
            req.digests = 0;
            continue;
        }
        if (val == NULL) {
            return fail("missing value after an option");
        }
        i++;
        if (strcmp(arg, "--weights") == 0) {
            weights_path = val;
        } else if (strcmp(arg, "--logits-out") == 0) {
            logits_path = val;
        } else if (strcmp(arg, "--prompt-ids") == 0) {
            const char *p = val;
            while (*p) {
                char *end;
                errno = 0;
                long long id = strtoll(p, &end, 10);
                if (end == p || errno != 0 || id < 0 || id > INT32_MAX) {
                    return fail("--prompt-ids must be comma-separated non-negative integers");
                }
                if (req.n_prompt == COLIBRI_N_CTX) {
                    return fail("prompt is longer than the context this firmware was built for");
                }
                prompt[req.n_prompt++] = (int32_t)id;
                p = (*end == ',') ? end + 1 : end;
                if (*end != ',' && *end != '\0') {
                    return fail("--prompt-ids must be comma-separated non-negative integers");
                }
            }
        } else if (strcmp(arg, "--steps") == 0) {
            if (!parse_long(val, 1, COLIBRI_N_CTX, &n)) {
                return fail("--steps must be between 1 and the context length");
            }
            req.n_steps = (int32_t)n;
        } else if (strcmp(arg, "--temperature") == 0) {
            if (!parse_float(val, &req.sampling.temperature) || !(req.sampling.temperature >= 0.0f)) {
                return fail("--temperature must be a number >= 0");
            }
        } else if (strcmp(arg, "--top-k") == 0) {
            if (!parse_long(val, 0, INT32_MAX, &n)) {
                return fail("--top-k must be a non-negative integer");
            }
            req.sampling.top_k = (int32_t)n;
        } else if (strcmp(arg, "--top-p") == 0) {
            if (!parse_float(val, &req.sampling.top_p) || !(req.sampling.top_p > 0.0f && req.sampling.top_p <= 1.0f)) {
                return fail("--top-p must be in (0, 1]");
            }
        } else if (strcmp(arg, "--min-p") == 0) {
            if (!parse_float(val, &req.sampling.min_p) || !(req.sampling.min_p >= 0.0f && req.sampling.min_p <= 1.0f)) {
                return fail("--min-p must be in [0, 1]");
            }
        } else if (strcmp(arg, "--threads") == 0) {
            if (!parse_long(val, 1, 64, &n)) {
                return fail("--threads must be between 1 and 64");
            }
            threads = (int)n; /* the pool starts after the probe: a fork copies only this thread */
        } else if (strcmp(arg, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long seed = strtoull(val, &end, 10);
            if (errno != 0 || end == val || *end != '\0' || val[0] == '-') {
                return fail("--seed must be a non-negative integer");
            }
            req.sampling.seed = (uint64_t)seed;
        } else if (strcmp(arg, "--probe-bandwidth") == 0) {
            if (!parse_long(val, 0, 1 << 20, &probe_mib)) {
                return fail("--probe-bandwidth must be a size in MiB (0: chosen from the caches)");
            }
        } else {
            return fail("unknown option");
        }
    }
    if (weights_path == NULL || req.n_prompt == 0) {
        return fail("--weights and --prompt-ids are required");
    }
    if (probe_mib >= 0) {
        /* Before the weight image is read: the child then copies almost nothing, and the board
         * never holds the probe's buffer and the weights at once. */
        ReadProbe probe;
        uint64_t mib = probe_mib > 0 ? (uint64_t)probe_mib : read_probe_default_mib();
        if (read_probe_run(threads, mib, &probe) != 0) {
            colibri_report_error(COLIBRI_ERR_REQUEST, "the bandwidth probe failed (no child process or no memory for its buffer)");
            return 1;
        }
        proto_begin("bandwidth");
        proto_u64("read_bw", probe.bytes_per_s);
        proto_u64("mib", probe.mib);
        proto_u64("threads", (uint64_t)probe.threads);
        proto_u64("passes", (uint64_t)probe.passes);
        proto_end();
    }
    parallel_start(threads);
    uint64_t image_len = 0;
    uint8_t *image = read_image(weights_path, &image_len);
    if (image == NULL) {
        colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file");
        return 1;
    }
    if (logits_path != NULL) {
        logits_file = fopen(logits_path, "wb");
        if (logits_file == NULL) {
            return fail("cannot open the --logits-out file");
        }
    }
    int status = colibri_load(image, image_len);
    if (status == 0) {
        status = colibri_decode(&req);
    }
    if (logits_file != NULL) {
        fclose(logits_file);
    }
    free(image);
    return status == 0 ? 0 : 1;
}
