/* Linux BSP (host, linux-aarch64): the firmware as a Linux process. Requests arrive on stdin as
 * request frames (the grammar every board reads), one per line, served in turn until stdin ends (a
 * conversation continues in the KV cache from one to the next); results go to stdout. */
#define _GNU_SOURCE /* dl_iterate_phdr, for the build-id */
#define _POSIX_C_SOURCE 200809L

#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
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

const char *bsp_machine(void)
{
    static struct utsname name;
    if (name.machine[0] == '\0' && uname(&name) != 0) {
        return "unknown";
    }
    return name.machine;
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
    "usage: firmware --weights IMAGE [--logits-out FILE] < REQUESTS\n"
    "Each request is one request frame on a line of stdin, the same line an MCU board reads on its\n"
    "UART (firmware_src/app/request.c); results go to stdout as frames.\n";

static int fail(int code, const char *message)
{
    colibri_report_error(code, message);
    fprintf(stderr, "%s%s\n", usage, message);
    return 2;
}

/* One line from stdin into line (capacity bytes): its length, or -1 if there is none or it is
 * longer than any request. */
static int read_request_line(char *line, int capacity)
{
    if (fgets(line, capacity, stdin) == NULL) {
        return -1;
    }
    size_t len = strlen(line);
    if (len == (size_t)capacity - 1 && line[len - 1] != '\n') {
        return -1;
    }
    return (int)len;
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

#define REQUEST_LINE_BYTES COLIBRI_REQUEST_LINE_BYTES(COLIBRI_N_CTX)

int main(int argc, char **argv)
{
    const char *weights_path = NULL;
    const char *logits_path = NULL;
    static int32_t prompt[COLIBRI_N_CTX];
    static char line[REQUEST_LINE_BYTES + 2];
    colibri_hello();
    for (int i = 1; i < argc; i++) {
        if (i + 1 == argc) {
            return fail(COLIBRI_ERR_REQUEST, "missing value after an option");
        }
        if (strcmp(argv[i], "--weights") == 0) {
            weights_path = argv[++i];
        } else if (strcmp(argv[i], "--logits-out") == 0) {
            logits_path = argv[++i];
        } else {
            return fail(COLIBRI_ERR_REQUEST, "unknown option");
        }
    }
    if (weights_path == NULL) {
        return fail(COLIBRI_ERR_REQUEST, "--weights is required");
    }
    int len = read_request_line(line, (int)sizeof line);
    if (len < 0) {
        return fail(COLIBRI_ERR_REQUEST, "no request frame on stdin (or a line longer than any request)");
    }
    ColibriRequest req;
    const char *problem = colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX);
    if (problem != NULL) {
        return fail(COLIBRI_ERR_REQUEST, problem);
    }
    if (req.probe_mib >= 0) {
        /* Before the weight image is read and before the thread pool starts (a fork copies only
         * this thread): the child then copies almost nothing, and the board never holds the
         * probe's buffer and the weights at once. */
        ReadProbe probe;
        uint64_t mib = req.probe_mib > 0 ? (uint64_t)req.probe_mib : read_probe_default_mib();
        if (read_probe_run(req.threads, mib, &probe) != 0) {
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
    const int threads = req.threads;
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
            return fail(COLIBRI_ERR_REQUEST, "cannot open the --logits-out file");
        }
    }
    int status = colibri_load(image, image_len);
    if (status != 0) {
        colibri_report_error(status, colibri_status_message(status));
    } else {
        /* The first request, then every further line until stdin ends; the exit status is the
         * last request's. */
        for (int served = 0;; served++) {
            if (served > 0) {
                problem = colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX);
                if (problem == NULL && req.probe_mib >= 0) {
                    problem = "the bandwidth probe runs only before the first request";
                }
                if (problem == NULL && req.threads != threads) {
                    problem = "threads must stay what the first request set";
                }
            }
            if (problem != NULL) {
                colibri_report_error(COLIBRI_ERR_REQUEST, problem);
                status = COLIBRI_ERR_REQUEST;
            } else {
                status = colibri_decode(&req);
            }
            len = read_request_line(line, (int)sizeof line);
            if (len < 0) {
                break;
            }
        }
    }
    if (logits_file != NULL) {
        fclose(logits_file);
    }
    free(image);
    return status == 0 ? 0 : 1;
}
