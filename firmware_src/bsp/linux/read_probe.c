/* Memory read bandwidth measured by the firmware itself, with the decode's thread count: the
 * figure bench sets a run's weight bytes per second against. The host's own probe (a NumPy sum,
 * one thread, another process) moved by 40 % within minutes and knew nothing of the threads; this
 * one runs next to each decode run, on the same machine state, and reads the way the decode does. */
#define _GNU_SOURCE /* sysconf(_SC_PHYS_PAGES) */

#include "read_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/parallel.h"

#define MIB ((uint64_t)1 << 20)
#define HUGE_PAGE_BYTES (2 * MIB)
#define BLOCK_BYTES 4096u /* parallel_for hands out whole pages */
#define PASSES 5          /* the best of these: the others lost time to the scheduler, not to memory */

/* The largest cache cpu0 has, in bytes (0 where Linux does not say, as on many ARM boards). */
static uint64_t largest_cache(void)
{
    uint64_t largest = 0;
    for (int i = 0; i < 16; i++) {
        char path[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            break;
        }
        unsigned long long n = 0;
        char unit = 0;
        if (fscanf(f, "%llu%c", &n, &unit) >= 1) {
            uint64_t bytes = (uint64_t)n * (unit == 'K' ? 1024u : unit == 'M' ? MIB : unit == 'G' ? 1024u * MIB : 1u);
            largest = bytes > largest ? bytes : largest;
        }
        fclose(f);
    }
    return largest;
}

uint64_t read_probe_default_mib(void)
{
    uint64_t mib = 2 * ((largest_cache() + MIB - 1) / MIB); /* twice it: most of the reads miss */
    if (mib < 256) {
        mib = 256;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) {
        uint64_t quarter = (uint64_t)pages * (uint64_t)page / 4 / MIB; /* leave the board its memory */
        if (mib > quarter && quarter > 0) {
            mib = quarter;
        }
    }
    return mib;
}

typedef struct {
    unsigned char *data;
    atomic_uint_fast64_t sink; /* every sum ends here, so no pass can be optimised away */
} Sweep;

static void fill_blocks(void *ctx, int begin, int end)
{
    /* Each thread touches the pages it will read: they are allocated next to it. */
    Sweep *s = ctx;
    memset(s->data + (size_t)begin * BLOCK_BYTES, 1, (size_t)(end - begin) * BLOCK_BYTES);
}

/* Eight independent sums, one cache line per iteration: no add waits for the one before, so the
 * loads set the pace, as the memory does for the decode's weight rows. The compiler turns them
 * into the target's 16-byte vector loads (SSE2, NEON). */
static uint64_t sum_words(const uint64_t *p, const uint64_t *stop)
{
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (; p < stop; p += 8) {
        a0 += p[0];
        a1 += p[1];
        a2 += p[2];
        a3 += p[3];
        a4 += p[4];
        a5 += p[5];
        a6 += p[6];
        a7 += p[7];
    }
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#if defined(__x86_64__)
/* The same with 32-byte loads, as the AVX2 kernels read the weights: one core's bandwidth depends
 * on the width of its loads (13.7 GB/s against 10.2 with 16-byte ones on the build machine). */
typedef uint64_t U64x4 __attribute__((vector_size(32)));

__attribute__((target("avx2"))) static uint64_t sum_words_avx2(const uint64_t *p, const uint64_t *stop)
{
    U64x4 a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0};
    for (; p < stop; p += 8) {
        U64x4 v0, v1;
        memcpy(&v0, p, sizeof v0);
        memcpy(&v1, p + 4, sizeof v1);
        a0 += v0;
        a1 += v1;
    }
    a0 += a1;
    return a0[0] + a0[1] + a0[2] + a0[3];
}
#endif

/* The sum the probe runs: sum_words, or a wider one the CPU has (chosen in measure()). */
static uint64_t (*sum_range)(const uint64_t *p, const uint64_t *stop) = sum_words;

static void sum_blocks(void *ctx, int begin, int end)
{
    Sweep *s = ctx;
    const uint64_t *p = (const uint64_t *)(void *)(s->data + (size_t)begin * BLOCK_BYTES);
    const uint64_t *stop = (const uint64_t *)(void *)(s->data + (size_t)end * BLOCK_BYTES);
    atomic_fetch_add_explicit(&s->sink, sum_range(p, stop), memory_order_relaxed);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The child's side: returns 0 and fills *out, or -1 if the buffer cannot be had. */
static int measure(int threads, uint64_t mib, int huge_pages, ReadProbe *out)
{
    const int blocks = (int)(mib * MIB / BLOCK_BYTES);
    Sweep s;
    /* On a huge page's boundary and in whole huge pages, so that every byte can sit in one. */
    const size_t bytes = ((size_t)blocks * BLOCK_BYTES + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    s.data = aligned_alloc(HUGE_PAGE_BYTES, bytes);
    if (s.data == NULL) {
        return -1;
    }
    out->huge_pages = 0;
#ifdef MADV_HUGEPAGE
    if (huge_pages) {
        out->huge_pages = madvise(s.data, bytes, MADV_HUGEPAGE) == 0;
    }
#else
    (void)huge_pages;
#endif
    atomic_init(&s.sink, 0);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        sum_range = sum_words_avx2;
    }
#endif
    out->threads = parallel_start(threads);
    out->mib = mib;
    out->passes = PASSES;
    out->bytes_per_s = 0;
    parallel_for(fill_blocks, &s, blocks);
    for (int pass = 0; pass < PASSES; pass++) {
        uint64_t t0 = now_ns();
        parallel_for(sum_blocks, &s, blocks);
        uint64_t ns = now_ns() - t0;
        uint64_t rate = ns ? (uint64_t)((double)blocks * BLOCK_BYTES * 1e9 / (double)ns) : 0;
        out->bytes_per_s = rate > out->bytes_per_s ? rate : out->bytes_per_s;
    }
    free(s.data);
    return atomic_load(&s.sink) == (uint64_t)blocks * (BLOCK_BYTES / 8) * 0x0101010101010101u * PASSES ? 0 : -1;
}

int read_probe_run(int threads, uint64_t mib, int huge_pages, ReadProbe *out)
{
    if (mib == 0 || mib > ((uint64_t)INT32_MAX * BLOCK_BYTES) / MIB) {
        return -1;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        return -1;
    }
    pid_t child = fork();
    if (child < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (child == 0) {
        /* The child: its pages, its threads and its peak RSS end with it. _exit, not exit: the
         * parent's stdio buffers are not the child's to flush. */
        close(fds[0]);
        ReadProbe r;
        int ok = measure(threads, mib, huge_pages, &r) == 0 && write(fds[1], &r, sizeof r) == (ssize_t)sizeof r;
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    ReadProbe r;
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = read(fds[0], (char *)&r + got, sizeof r - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (got != sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return -1;
    }
    *out = r;
    return 0;
}

int storage_probe_run(const char *path, uint64_t mib, uint64_t chunk, StorageProbe *out)
{
    int direct = 1;
    int fd = open(path, O_RDONLY | O_DIRECT);
    void *buf = NULL;
    if (chunk == 0 || chunk % 4096 != 0 || posix_memalign(&buf, 4096, (size_t)chunk) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    if (fd >= 0 && pread(fd, buf, 4096, 0) <= 0) { /* refused at the first read, not at open */
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        direct = 0;
        fd = open(path, O_RDONLY);
        if (fd < 0) {
            free(buf);
            return -1;
        }
    }
    off_t size = lseek(fd, 0, SEEK_END);
    uint64_t want = mib * MIB;
    if (size > 0 && (uint64_t)size < want) {
        want = (uint64_t)size;
    }
    if (!direct) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    uint64_t total = 0;
    const uint64_t t0 = now_ns();
    while (total < want) {
        ssize_t n = pread(fd, buf, (size_t)chunk, (off_t)total);
        if (n <= 0) {
            break;
        }
        total += (uint64_t)n;
    }
    const uint64_t ns = now_ns() - t0;
    if (!direct) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    close(fd);
    free(buf);
    if (total == 0 || ns == 0) {
        return -1;
    }
    out->bytes_per_s = (uint64_t)((double)total * 1e9 / (double)ns);
    out->bytes = total;
    out->chunk = chunk;
    out->direct = direct;
    return 0;
}
