/* The weight image file in memory (image_map.h): the read-only mapping on a 2 MiB boundary, its
 * pages replaced by private memory in 2 MiB pages where the image (or its resident part) is held,
 * and the SIGBUS handler for a fault on the mapping. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, posix_fadvise, st_mtim */
#define _POSIX_C_SOURCE 200809L

#include "image_map.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../app/decode.h"
#include "../../runtime/decimal.h"
#include "../../runtime/image_loader.h"
#include "../../runtime/tensor_table.h"
#include "model_def.h"

/* The image file opened for reading, or -1: a regular file only (a FIFO or a device would block
 * the open or the reads forever; O_NONBLOCK lets the open return so fstat can say what it is). */
static int open_regular(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || fcntl(fd, F_SETFL, 0) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

uint8_t *copy_image(const char *path, uint64_t *len, int *refused)
{
    struct stat st;
    int fd = open_regular(path, &st);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (f == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return NULL;
    }
    uint8_t *buf = NULL;
    uint8_t header[COLIBRI_IMAGE_HEADER_BYTES] = {0};
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        /* The header first: a file longer (or shorter) than it says is refused before the rest is read. */
        if (size > 0 && fseek(f, 0, SEEK_SET) == 0) {
            const size_t head = fread(header, 1, sizeof header, f);
            *refused = colibri_image_check_length(header, head < sizeof header ? head : (uint64_t)size);
        }
        if (size > 0 && *refused == COLIBRI_OK && fseek(f, 0, SEEK_SET) == 0) {
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

uint8_t *map_image(const char *path, uint64_t *len)
{
    int fd = open_regular(path, &image_stat);
    if (fd < 0) {
        return NULL;
    }
    void *map = MAP_FAILED;
    if (image_stat.st_size > 0) {
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

int image_changed(void)
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
    char message[320] = "reading the mapped weight image file failed at byte ", number[DECIMAL_U64_BYTES];
    decimal_u64(number, offset);
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
            decimal_u64(number, (uint64_t)l);
            append(message, sizeof message, number);
            append(message, sizeof message, " expert ");
            decimal_u64(number, (offset - start) / group->stride);
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

void catch_mapping_faults(const uint8_t *image, uint64_t len)
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
    /* This rank's experts of the layer (a single board's: all of them), one after another. */
    *start = (uint64_t)COLIBRI_IMAGE_DATA_OFFSET + colibri_expert_offset(group, 0);
    *end = *start + (uint64_t)colibri_rank_budget()->experts_per_layer * group->stride;
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
int64_t hold_resident(uint8_t *image, uint64_t len, int *refused)
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

int read_image_into_memory(uint8_t *image, uint64_t len)
{
    uint64_t from, to;
    page_range(0, len, len, &from, &to);
    if (copy_in_place(image, from, to) != 0) {
        return -1;
    }
    close(image_fd);
    image_fd = -1; /* a file rewritten after this no longer matters (image_changed) */
    return 0;
}

void unmap_image(uint8_t *image, uint64_t len)
{
    munmap(image, (size_t)len);
    if (image_fd >= 0) {
        close(image_fd);
        image_fd = -1;
    }
}

/* The KV cache's arenas asked for in 2 MiB pages (transparent huge pages, where the kernel allows
 * them on request: "madvise", Debian's default), before a key is written: a decode at a long
 * context reads each KV head's keys and values as streams of hundreds of KiB, which in 4 KiB pages
 * cost a TLB walk every 4 KiB and end the hardware prefetchers' runs at every page. Advice only: a
 * kernel without it (or with huge pages off) leaves the pages as they were. */
void kv_cache_in_huge_pages(void *arena, size_t bytes)
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
