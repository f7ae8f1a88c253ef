/* Linux BSP (host, linux-aarch64): the firmware as a Linux process. Requests arrive on stdin as
 * request frames (the grammar every board reads), one per line, served in turn until stdin ends (a
 * conversation continues in the KV cache from one to the next); results go to stdout. The weight
 * image is mapped read-only; under a memory budget its resident part is locked and routed experts
 * come through the expert cache (runtime/expert_cache.c) from storage.c's reads. */
#define _GNU_SOURCE /* dl_iterate_phdr, for the build-id */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "../../app/bsp.h"
#include "../../app/build_id.h"
#include "../../app/decode.h"
#include "../../app/selftest.h"
#include "../../app/protocol.h"
#include "../../runtime/expert_cache.h"
#include "../../runtime/image_loader.h"
#include "../../runtime/parallel.h"
#include "../../runtime/tensor_table.h"
#include "memory_limit.h"
#include "model_def.h"
#include "read_probe.h"
#include "storage.h"

static FILE *logits_file;

/* Frames go straight to the file descriptor (no stdio buffer), so that the SIGBUS handler below can
 * send one too. */
void bsp_write(const char *data, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(STDOUT_FILENO, data + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return; /* the reader is gone */
        }
        done += (size_t)n;
    }
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

/* What the whole model takes when every expert is held: the resident weights, the arenas and the
 * reserve, and every expert in a slot of its own (cache_plan.py's arithmetic). */
static uint64_t whole_model_bytes(void)
{
    return (uint64_t)COLIBRI_BUDGET_FIXED_BYTES +
           (uint64_t)COLIBRI_N_MOE_LAYERS * COLIBRI_N_EXPERTS * COLIBRI_EXPERT_SLOT_BYTES;
}

/* --memory-budget auto[-MARGIN]: the memory this process may use less the margin (memory_limit.h), as
 * *budget; 0 (unlimited) when that holds every expert in a slot, i.e. the whole model. The arithmetic
 * is cache_plan.py's auto_budget. Returns 0, or -1 with *message saying why it cannot run. */
static int resolve_auto_budget(uint64_t margin, uint64_t *budget, ColibriWeightsInfo *info, char *message, size_t size)
{
    MemoryFound found;
    if (memory_found("", &found) != 0) {
        snprintf(message, size, "--memory-budget auto: no memory cgroup limit and no MemAvailable "
                                "(/proc/self/cgroup, /proc/meminfo); give the budget in bytes");
        return -1;
    }
    const uint64_t usable = found.bytes > margin ? found.bytes - margin : 0;
    const uint64_t whole = whole_model_bytes();
    info->auto_source = memory_source_name(found.source);
    info->auto_found = found.bytes;
    info->auto_margin = margin;
    snprintf(info->auto_where, sizeof info->auto_where, "%s", found.where);
    *budget = usable >= whole ? 0 : usable;
    if (usable == 0 || colibri_cache_slots_for_budget(*budget) < 0) {
        snprintf(message, size,
                 "--memory-budget auto: %s %llu B (%s) - margin %llu B = %llu B cannot hold this model: it needs "
                 "at least %llu B (resident weights, arenas and reserve %llu B + %d expert slots x %llu B)",
                 memory_source_name(found.source), (unsigned long long)found.bytes, found.where,
                 (unsigned long long)margin, (unsigned long long)usable,
                 (unsigned long long)COLIBRI_BUDGET_FIXED_BYTES +
                     (COLIBRI_N_MOE_LAYERS > 0 ? (unsigned long long)COLIBRI_EXPERTS_PER_TOKEN * COLIBRI_EXPERT_SLOT_BYTES : 0),
                 (unsigned long long)COLIBRI_BUDGET_FIXED_BYTES, COLIBRI_N_MOE_LAYERS > 0 ? COLIBRI_EXPERTS_PER_TOKEN : 0,
                 (unsigned long long)COLIBRI_EXPERT_SLOT_BYTES);
        return -1;
    }
    /* For whoever runs the firmware by hand; the host reads the same from the stats frame. */
    fprintf(stderr, "colibri: --memory-budget auto: %s %llu B (%s) - margin %llu B = %llu B%s\n",
            memory_source_name(found.source), (unsigned long long)found.bytes, found.where,
            (unsigned long long)margin, (unsigned long long)usable,
            *budget == 0 ? ": it holds the whole model, so unlimited (the mapped image read in place)" : "");
    return 0;
}

/* The whole image read into one buffer: how the firmware held its weights before it mapped them
 * (--copy-weights keeps it for comparisons). */
static uint8_t *copy_image(const char *path, uint64_t *len)
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

/* The image file as opened: its descriptor (kept open to see whether it changes), size and time. */
static int image_fd = -1;
static struct stat image_stat;

static uint64_t page_bytes(void)
{
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (uint64_t)page : 4096u;
}

/* Transparent huge pages: what the kernel can map with one TLB entry where a range is advised so. */
#define HUGE_PAGE_BYTES ((uint64_t)2 << 20)

/* `bytes` of address space starting at a multiple of HUGE_PAGE_BYTES, reserved (no access), or
 * MAP_FAILED: a range later read into memory in place (copy_in_place) then fills whole huge pages. */
static void *reserve_huge_aligned(uint64_t bytes)
{
    const uint64_t padded = bytes + HUGE_PAGE_BYTES;
    uint8_t *area = mmap(NULL, (size_t)padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) {
        return MAP_FAILED;
    }
    const uint64_t page = page_bytes();
    uint8_t *start = (uint8_t *)(((uintptr_t)area + HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1));
    uint8_t *end = start + (bytes + page - 1) / page * page;
    if (start > area) {
        munmap(area, (size_t)(start - area));
    }
    if (area + padded > end) {
        munmap(end, (size_t)(area + padded - end));
    }
    return start;
}

/* The image mapped read-only (private: nothing is ever written), or NULL; the mapping starts on a
 * huge page's boundary, so that the image's bytes keep their offsets within huge pages. */
static uint8_t *map_image(const char *path, uint64_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return NULL;
    }
    void *map = MAP_FAILED;
    if (fstat(fd, &image_stat) == 0 && image_stat.st_size > 0) {
        void *at = reserve_huge_aligned((uint64_t)image_stat.st_size);
        if (at != MAP_FAILED) {
            map = mmap(at, (size_t)image_stat.st_size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
        }
        *len = (uint64_t)image_stat.st_size;
    }
    if (map == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    image_fd = fd;
    return map;
}

/* Whether the file this firmware mapped was truncated or written since (a rename over its path
 * leaves it as it was: this firmware keeps it). */
static int image_changed(void)
{
    struct stat st;
    if (image_fd < 0) {
        return 0;
    }
    return fstat(image_fd, &st) != 0 || st.st_size != image_stat.st_size ||
           st.st_mtim.tv_sec != image_stat.st_mtim.tv_sec || st.st_mtim.tv_nsec != image_stat.st_mtim.tv_nsec;
}

/* A fault on the mapped image (the file truncated under it, or its storage failing: the kernel
 * sends SIGBUS for a mapped page it cannot read) ends the run with one error frame saying where,
 * instead of a crash. The handler runs on the thread that touched the page, inside the forward pass
 * or the start-up checks: no frame is being built then (frames are built between forward passes,
 * on the main thread), and bsp_write is a plain write(2), so sending the frame here is safe; then
 * the process ends at once (_exit), since the forward pass cannot go on without those bytes. */
static const uint8_t *fault_image;
static uint64_t fault_image_len;

static void u64_text(char *out, uint64_t v)
{
    char digits[21];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++) {
        out[i] = digits[n - 1 - i];
    }
    out[n] = '\0';
}

static void append(char *out, size_t cap, const char *text)
{
    size_t len = strlen(out);
    while (*text && len + 1 < cap) {
        out[len++] = *text++;
    }
    out[len] = '\0';
}

static void on_mapping_fault(int sig, siginfo_t *info, void *context)
{
    (void)context;
    const uint8_t *at = info->si_addr;
    if (fault_image == NULL || at < fault_image || at >= fault_image + fault_image_len) {
        signal(sig, SIG_DFL); /* not the image: the crash it is */
        raise(sig);
        return;
    }
    const uint64_t offset = (uint64_t)(at - fault_image);
    char message[320] = "reading the mapped weight image file failed at byte ", number[21];
    u64_text(number, offset);
    append(message, sizeof message, number);
    append(message, sizeof message, " (");
    int found = 0;
    for (int l = 0; l < COLIBRI_N_LAYERS && !found; l++) {
        const ColibriExpertGroup *group = colibri_layer_experts(l);
        if (group == NULL || group->stride == 0) {
            continue;
        }
        const uint64_t start = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + group->offset;
        if (offset >= start && offset < start + (uint64_t)COLIBRI_N_EXPERTS * group->stride) {
            append(message, sizeof message, "layer ");
            u64_text(number, (uint64_t)l);
            append(message, sizeof message, number);
            append(message, sizeof message, " expert ");
            u64_text(number, (offset - start) / group->stride);
            append(message, sizeof message, number);
            found = 1;
        }
    }
    if (!found) {
        append(message, sizeof message, "the resident weights");
    }
    append(message, sizeof message, "): the file was truncated under the firmware or its storage failed (SIGBUS)");
    colibri_report_error(COLIBRI_ERR_READ, message);
    _exit(1);
}

static void catch_mapping_faults(const uint8_t *image, uint64_t len)
{
    fault_image = image;
    fault_image_len = len;
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_mapping_fault;
    act.sa_flags = SA_SIGINFO;
    sigemptyset(&act.sa_mask);
    sigaction(SIGBUS, &act, NULL);
}

/* The bytes [start, end) of the mapping, widened to whole pages. */
static void page_range(uint64_t start, uint64_t end, uint64_t len, uint64_t *from, uint64_t *to)
{
    const uint64_t page = page_bytes();
    *from = start / page * page;
    *to = (end + page - 1) / page * page;
    if (*to > (len + page - 1) / page * page) {
        *to = (len + page - 1) / page * page;
    }
}

/* Each MoE layer's experts as one range of the image (expert-major: a layer's experts lie next to
 * each other): [*start, *end) in file offsets. Returns 0 for a dense layer. */
static int layer_experts(int layer, uint64_t *start, uint64_t *end)
{
    const ColibriExpertGroup *group = colibri_layer_experts(layer);
    if (group == NULL) {
        return 0;
    }
    *start = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + group->offset;
    *end = *start + (uint64_t)COLIBRI_N_EXPERTS * group->stride;
    return 1;
}

/* The image's ranges a budget does not hold, in file order: Gemma 4's per-layer input table first
 * (i = 0: read one row per token through the mapping, its pages the kernel's to reclaim), then each
 * MoE layer's experts (i = 1 + layer). Returns 0 where there is none. */
static int unheld_range(int i, uint64_t *start, uint64_t *end)
{
    if (i == 0) {
        *start = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + COLIBRI_PAGED_TABLE_OFFSET;
        *end = *start + COLIBRI_PAGED_TABLE_BYTES;
        return COLIBRI_PAGED_TABLE_BYTES > 0;
    }
    return layer_experts(i - 1, start, end);
}

/* [from, to) of the mapping (whole pages) replaced by private memory holding the file's bytes, read
 * in chunks whose page-cache pages are dropped again: 0, or -1 when the file cannot be read. The
 * memory is advised into huge pages (MADV_HUGEPAGE: where transparent huge pages are "madvise", as
 * on Debian, or "always"): the page cache maps a file in 4 KiB pages here (ext4 gives no huge
 * ones), and a decode streaming its weights through 4 KiB pages took a TLB walk every 4 KiB and
 * restarted the hardware prefetchers at each; the SmolLM2-135M shape's q8_0 decode ran 1.45x as
 * fast from 2 MiB pages (docs/performance.md, "Weights in 2 MiB pages"). */
static int copy_in_place(uint8_t *image, uint64_t from, uint64_t to)
{
    if (mmap(image + from, (size_t)(to - from), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) == MAP_FAILED) {
        return -1;
    }
#ifdef MADV_HUGEPAGE
    madvise(image + from, (size_t)(to - from), MADV_HUGEPAGE);
#endif
    const uint64_t chunk = 8u << 20;
    for (uint64_t at = from; at < to;) {
        const uint64_t want = to - at < chunk ? to - at : chunk;
        const ssize_t n = pread(image_fd, image + at, (size_t)want, (off_t)at);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -1;
        }
        posix_fadvise(image_fd, (off_t)at, (off_t)want, POSIX_FADV_DONTNEED);
        if (n == 0) {
            break; /* the file's end (its last page): the rest stays zero, as the mapping's would */
        }
        at += (uint64_t)n;
    }
    return mprotect(image + from, (size_t)(to - from), PROT_READ);
}

/* Under a budget: the resident part (everything but the routed experts) read into private memory in
 * place of its mapped pages, and locked. Its bytes are then this process's own: a file truncated,
 * rewritten or failing later cannot change them or fault on them (the experts' reads see those, and
 * say so: storage.c). No readahead anywhere in the mapping: its experts' ranges are never touched
 * through it, Gemma 4's per-layer input table a row at a time (unheld_range).
 * Returns the bytes held, or -1 when the file cannot be read; *refused says whether mlock refused
 * any of it. */
static int64_t hold_resident(uint8_t *image, uint64_t len, int *refused)
{
    uint64_t locked = 0, cursor = 0;
    *refused = 0;
    madvise(image, (size_t)len, MADV_RANDOM);
    for (int i = 0; i <= COLIBRI_N_LAYERS + 1; i++) {
        uint64_t start = len, end = len, from, to;
        if (i < COLIBRI_N_LAYERS + 1 && !unheld_range(i, &start, &end)) {
            continue;
        }
        page_range(cursor, start, len, &from, &to);
        if (to > from) {
            if (copy_in_place(image, from, to) != 0) {
                return -1;
            }
            if (mlock(image + from, (size_t)(to - from)) == 0) {
                locked += to - from;
            } else {
                *refused = 1;
            }
        }
        cursor = end;
    }
    return (int64_t)locked;
}

/* The command line. */
typedef struct {
    const char *weights_path;
    const char *logits_path;       /* --logits-out; NULL: none */
    uint64_t budget;               /* --memory-budget in bytes; 0: unlimited (auto: resolved by plan_budget) */
    int budget_auto;               /* --memory-budget auto[-MARGIN]: resolved where this process runs */
    uint64_t auto_margin;          /* the MARGIN of auto-MARGIN (default COLIBRI_AUTO_MARGIN_BYTES) */
    uint64_t probe_storage_mib;    /* --probe-storage; 0: no storage probe */
    int prefetch, eviction;        /* -1: chosen from the pool's size (use_expert_slots) */
    int copy_weights;              /* --copy-weights: the image read into memory, not mapped */
    int map_weights;               /* --map-weights: read through the mapping even where it would fit in memory */
    int resident;                  /* the whole image read into memory in huge pages (plan_budget decides) */
} Options;

/* argv into *opt: 0, or the exit status after the usage and an error frame. */
static int parse_options(int argc, char **argv, Options *opt)
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
            return fail(COLIBRI_ERR_REQUEST, "missing value after an option");
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
                return fail(COLIBRI_ERR_REQUEST, "--memory-budget takes a number of bytes, auto or auto-MARGIN (bytes)");
            }
        } else if (strcmp(argv[i], "--probe-storage") == 0) {
            if (parse_u64(argv[++i], &opt->probe_storage_mib) != 0 || opt->probe_storage_mib == 0) {
                return fail(COLIBRI_ERR_REQUEST, "--probe-storage takes a number of MiB");
            }
        } else if (strcmp(argv[i], "--evict") == 0) {
            i++;
            opt->eviction = strcmp(argv[i], "lfu") == 0    ? COLIBRI_EVICT_LFU
                            : strcmp(argv[i], "lru") == 0  ? COLIBRI_EVICT_LRU
                            : strcmp(argv[i], "auto") == 0 ? -1
                                                           : -2;
            if (opt->eviction == -2) {
                return fail(COLIBRI_ERR_REQUEST, "--evict takes auto, lfu or lru");
            }
        } else if (strcmp(argv[i], "--prefetch") == 0) {
            i++;
            opt->prefetch = strcmp(argv[i], "1") == 0 ? 1 : strcmp(argv[i], "0") == 0 ? 0 : strcmp(argv[i], "auto") == 0 ? -1 : -2;
            if (opt->prefetch == -2) {
                return fail(COLIBRI_ERR_REQUEST, "--prefetch takes auto, 0 or 1");
            }
        } else {
            return fail(COLIBRI_ERR_REQUEST, "unknown option");
        }
    }
    if (opt->weights_path == NULL) {
        return fail(COLIBRI_ERR_REQUEST, "--weights is required");
    }
    if (opt->copy_weights && (opt->budget > 0 || opt->budget_auto)) {
        return fail(COLIBRI_ERR_REQUEST, "--copy-weights reads the whole image: it cannot keep a --memory-budget");
    }
    if (opt->copy_weights && opt->map_weights) {
        return fail(COLIBRI_ERR_REQUEST, "--copy-weights and --map-weights ask for opposite things: give one");
    }
    return 0;
}

/* The budget in bytes (auto resolved here) and the expert slots it leaves: 0, or -1 after an
 * error frame saying it cannot hold the model. */
static int plan_budget(Options *opt, int64_t *slots)
{
    if (opt->budget_auto) {
        char message[512];
        if (resolve_auto_budget(opt->auto_margin, &opt->budget, &colibri_weights_info, message, sizeof message) != 0) {
            colibri_report_error(COLIBRI_ERR_BUDGET, message);
            return -1;
        }
    }
    /* Unlimited, and the whole model fits in the memory this process may use (less the auto
     * margin): the image is read into memory in huge pages (copy_in_place) instead of being read
     * through the mapping's 4 KiB pages. Where it does not fit (or memory cannot be told), the
     * mapping stays, and the page cache holds what it can. */
    MemoryFound found;
    opt->resident = opt->budget == 0 && !opt->copy_weights && !opt->map_weights && memory_found("", &found) == 0 &&
                    found.bytes > COLIBRI_AUTO_MARGIN_BYTES &&
                    whole_model_bytes() <= found.bytes - COLIBRI_AUTO_MARGIN_BYTES;
    *slots = colibri_cache_slots_for_budget(opt->budget);
    if (*slots < 0) {
        char message[320];
        snprintf(message, sizeof message,
                 "--memory-budget %llu B cannot hold this model: it needs at least %llu B (resident weights, "
                 "arenas and reserve %llu B + %d expert slots x %llu B)",
                 (unsigned long long)opt->budget,
                 (unsigned long long)COLIBRI_BUDGET_FIXED_BYTES +
                     (COLIBRI_N_MOE_LAYERS > 0 ? (unsigned long long)COLIBRI_EXPERTS_PER_TOKEN * COLIBRI_EXPERT_SLOT_BYTES : 0),
                 (unsigned long long)COLIBRI_BUDGET_FIXED_BYTES, COLIBRI_N_MOE_LAYERS > 0 ? COLIBRI_EXPERTS_PER_TOKEN : 0,
                 (unsigned long long)COLIBRI_EXPERT_SLOT_BYTES);
        colibri_report_error(COLIBRI_ERR_BUDGET, message);
        return -1;
    }
    return 0;
}

/* The probes the first request and the command line ask for, each reported in its frame: 0, or -1
 * after an error frame. Run before the weight image is read and before the thread pool starts (a
 * fork copies only this thread): the child then copies almost nothing, and the board never holds
 * the probe's buffer and the weights at once. */
static int run_probes(const Options *opt, const ColibriRequest *req)
{
    if (req->probe_mib >= 0) {
        ReadProbe probe;
        uint64_t mib = req->probe_mib > 0 ? (uint64_t)req->probe_mib : read_probe_default_mib();
        if (read_probe_run(req->threads, mib, opt->resident, &probe) != 0) {
            colibri_report_error(COLIBRI_ERR_REQUEST, "the bandwidth probe failed (no child process or no memory for its buffer)");
            return -1;
        }
        proto_begin("bandwidth");
        proto_u64("read_bw", probe.bytes_per_s);
        proto_u64("mib", probe.mib);
        proto_u64("threads", (uint64_t)probe.threads);
        proto_u64("passes", (uint64_t)probe.passes);
        proto_u64("huge_pages", (uint64_t)probe.huge_pages);
        proto_end();
    }
    if (opt->probe_storage_mib > 0) {
        /* Reads the size of an expert slot at a time, as the cache does. */
        const uint64_t chunk = COLIBRI_EXPERT_SLOT_BYTES > 0 ? COLIBRI_EXPERT_SLOT_BYTES : (1u << 20);
        StorageProbe probe;
        if (storage_probe_run(opt->weights_path, opt->probe_storage_mib, chunk, &probe) != 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file (storage probe)");
            return -1;
        }
        proto_begin("storage");
        proto_u64("read_bw", probe.bytes_per_s);
        proto_u64("bytes", probe.bytes);
        proto_u64("chunk", probe.chunk);
        proto_u64("direct", (uint64_t)probe.direct);
        proto_end();
    }
    return 0;
}

/* The weights as this process holds them. */
typedef struct {
    uint8_t *image;     /* the image file, mapped read-only (or copied: --copy-weights) */
    uint64_t image_len;
    int64_t slots;      /* expert slots the budget leaves (plan_budget); 0: every expert in place */
    uint8_t *pool;      /* their memory; NULL: the experts are read in place through the mapping */
} HeldWeights;

static Storage storage;

/* The image file mapped read-only, or read into memory (--copy-weights): 0, or -1 after an error
 * frame. */
static int open_image(const Options *opt, HeldWeights *w)
{
    w->image = opt->copy_weights ? copy_image(opt->weights_path, &w->image_len)
                                 : map_image(opt->weights_path, &w->image_len);
    if (w->image == NULL) {
        colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file");
        return -1;
    }
    return 0;
}

/* Under a budget with routed experts: a pool of slots, committed and locked now, that the expert
 * cache fills from storage. Returns 0, or -1 after an error frame. */
static int use_expert_slots(Options *opt, HeldWeights *w)
{
    ColibriWeightsInfo *info = &colibri_weights_info;
    /* Measured (docs/performance.md): with top-k slots per MoE layer or more, LRU keeps the experts
     * consecutive tokens share; below that, LRU evicts every expert before its layer comes round
     * again, so the pool keeps the most used (LFU). Guessing the next layer's experts (--prefetch 1)
     * did not pay at any budget once a token's misses were read side by side, nor with all of them in
     * flight at once: wrong guesses read bytes nobody uses and evict experts that would have hit. */
    const int roomy = w->slots >= (int64_t)COLIBRI_EXPERTS_PER_TOKEN * COLIBRI_N_MOE_LAYERS;
    if (opt->eviction < 0) {
        opt->eviction = roomy ? COLIBRI_EVICT_LRU : COLIBRI_EVICT_LFU;
    }
    if (opt->prefetch < 0) {
        opt->prefetch = 0;
    }
    const uint64_t pool_bytes = (uint64_t)w->slots * COLIBRI_EXPERT_SLOT_BYTES;
    w->pool = aligned_alloc(COLIBRI_STORAGE_ALIGN, (size_t)pool_bytes);
    /* One I/O thread per expert of a token: a layer's misses are all read at once. */
    if (w->pool == NULL || storage_open(&storage, opt->weights_path, (int)w->slots, COLIBRI_EXPERTS_PER_TOKEN) != 0) {
        colibri_report_error(COLIBRI_ERR_BUDGET, "cannot allocate the expert slots or open the image file for reading");
        return -1;
    }
    memset(w->pool, 0, (size_t)pool_bytes); /* committed now, never per token */
    if (mlock(w->pool, (size_t)pool_bytes) == 0) {
        info->locked_bytes += pool_bytes;
    } else {
        info->lock_refused = 1;
    }
    info->slots = (int32_t)w->slots;
    info->direct_io = storage.direct;
    info->prefetch = opt->prefetch && storage.iface.submit != NULL;
    info->eviction_lru = opt->eviction == COLIBRI_EVICT_LRU;
    colibri_experts_use_slots(w->image, w->pool, (int)w->slots, &storage.iface, opt->prefetch,
                              (colibri_eviction)opt->eviction);
    return 0;
}

/* The image checked and bound, under a budget its resident part held in RAM and its experts
 * brought into slots. Returns the loader's status (0: loaded; else reported by the caller), or -1
 * after an error frame when the slots cannot be set up. */
static int bind_weights(Options *opt, HeldWeights *w)
{
    ColibriWeightsInfo *info = &colibri_weights_info;
    info->mapped = !opt->copy_weights;
    info->budget = opt->budget;
    if (opt->resident) {
        /* Before the checks below read it; nothing reads the file afterwards. */
        uint64_t from, to;
        page_range(0, w->image_len, w->image_len, &from, &to);
        if (copy_in_place(w->image, from, to) != 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the weight image file into memory");
            return -1;
        }
        info->resident_bytes = w->image_len;
        close(image_fd);
        image_fd = -1; /* a file rewritten after this no longer matters (image_changed) */
    }
    if (opt->budget > 0) {
        /* Before the checks below read the resident tensors. */
        const int64_t held = hold_resident(w->image, w->image_len, &info->lock_refused);
        if (held < 0) {
            colibri_report_error(COLIBRI_ERR_NO_IMAGE, "cannot read the resident weights from the weight image file");
            return -1;
        }
        info->locked_bytes = (uint64_t)held;
        info->resident_bytes = (uint64_t)held;
    }
    /* Mapped: the header, the directory and the resident tensors are checked now, each expert when
     * it is first brought in, so start-up does not grow with the experts. */
    const int status = colibri_load_checking(w->image, w->image_len,
                                             opt->copy_weights ? COLIBRI_CHECK_ALL : COLIBRI_CHECK_RESIDENT);
    if (status != 0) {
        return status;
    }
    if (opt->budget == 0) {
        colibri_experts_in_place(w->image, !opt->copy_weights);
        return 0;
    }
    if (w->slots == 0) {
        colibri_experts_in_place(w->image, 1); /* no routed experts: everything is resident */
    } else if (use_expert_slots(opt, w) != 0) {
        return -1;
    }
    if (info->lock_refused) {
        struct rlimit limit;
        unsigned long long soft = getrlimit(RLIMIT_MEMLOCK, &limit) == 0 ? (unsigned long long)limit.rlim_cur : 0;
        fprintf(stderr, "colibri: note: the resident weights and expert slots are NOT locked in RAM: mlock was "
                        "refused (RLIMIT_MEMLOCK %llu B; raise it with ulimit -l); under memory pressure they "
                        "may be paged out and read again\n", soft);
    }
    return 0;
}

static void release_weights(const Options *opt, HeldWeights *w)
{
    if (w->pool != NULL) {
        storage_close(&storage);
        free(w->pool);
    }
    if (opt->copy_weights) {
        free(w->image);
    } else {
        munmap(w->image, (size_t)w->image_len);
        if (image_fd >= 0) {
            close(image_fd);
            image_fd = -1;
        }
    }
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
        } else {
            status = colibri_decode(req);
        }
        len = read_request_line(line, capacity);
    }
    return status;
}

/* The KV cache's arenas asked for in 2 MiB pages (transparent huge pages, where the kernel allows
 * them on request: "madvise", Debian's default), before a key is written: a decode at a long
 * context reads each KV head's keys and values as streams of hundreds of KiB, which in 4 KiB pages
 * cost a TLB walk every 4 KiB and end the hardware prefetchers' runs at every page. Advice only: a
 * kernel without it (or with huge pages off) leaves the pages as they were. */
static void kv_cache_in_huge_pages(void *arena, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)HUGE_PAGE_BYTES;
    const uintptr_t from = ((uintptr_t)arena + huge - 1) & ~(huge - 1), to = ((uintptr_t)arena + bytes) & ~(huge - 1);
    if (to > from) {
        madvise((void *)from, (size_t)(to - from), MADV_HUGEPAGE);
    }
#else
    (void)arena, (void)bytes;
#endif
}

int main(int argc, char **argv)
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
        return fail(COLIBRI_ERR_REQUEST, "no request frame on stdin (or a line longer than any request)");
    }
    ColibriRequest req;
    const char *problem = colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX);
    if (problem != NULL) {
        return fail(COLIBRI_ERR_REQUEST, problem);
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
    if (opt.logits_path != NULL) {
        logits_file = fopen(opt.logits_path, "wb");
        if (logits_file == NULL) {
            return fail(COLIBRI_ERR_REQUEST, "cannot open the --logits-out file");
        }
    }
    int status = bind_weights(&opt, &w);
    if (status < 0) {
        return 1;
    }
    if (status != 0 && req.selftest) {
        colibri_selftest(status, NULL, 1); /* a refused image: the self-test's FAIL says why */
    } else if (status != 0) {
        colibri_report_error(status, colibri_status_message(status));
    } else {
        status = serve_requests(line, (int)sizeof line, len, &req, prompt);
    }
    if (logits_file != NULL) {
        fclose(logits_file);
    }
    release_weights(&opt, &w);
    return status == 0 ? 0 : 1;
}
