/* LD_PRELOAD shim for tests/compile/test_expert_cache.py: makes the firmware's expert reads slow, slow in a
 * scrambled order, failing or short, so that the tests can see several reads in flight and what
 * happens when one of them goes wrong. Only preads of at least COLIBRI_SLOW_MIN_BYTES are touched
 * (the expert reads; not the 4 KiB O_DIRECT probe at open).
 *
 *   COLIBRI_SLOW_US=N        each such read takes N microseconds longer
 *   COLIBRI_SLOW_SCRAMBLE=S  ... 1 to 4 times N, by a hash of the file offset (S: its shift): reads of one layer
 *                            finish in an order that is not the order they were issued in
 *   COLIBRI_SLOW_FAIL=N      the N-th such read (from 1) fails with EIO
 *   COLIBRI_SLOW_SHORT=N     the N-th such read delivers half its bytes and the file ends there */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static long setting(const char *name)
{
    const char *v = getenv(name);
    return v == NULL ? 0 : atol(v);
}

static long reads;              /* such reads so far, over all threads */
static int64_t short_end = -1;  /* the file offset where the short read made the file end */

static void pause_us(long us)
{
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static ssize_t shimmed(int fd, void *buf, size_t count, off_t offset)
{
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (real == NULL) {
        real = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    }
    if ((int64_t)offset == __atomic_load_n(&short_end, __ATOMIC_SEQ_CST)) {
        return 0; /* the rest of the short read: the end of the file */
    }
    if ((long)count < setting("COLIBRI_SLOW_MIN_BYTES")) {
        return real(fd, buf, count, offset);
    }
    const long n = __atomic_add_fetch(&reads, 1, __ATOMIC_SEQ_CST);
    long us = setting("COLIBRI_SLOW_US");
    if (setting("COLIBRI_SLOW_SCRAMBLE")) {
        us *= 1 + (long)((((uint64_t)offset >> 12) * 2654435761u >> setting("COLIBRI_SLOW_SCRAMBLE")) % 4);
    }
    pause_us(us);
    if (n == setting("COLIBRI_SLOW_FAIL")) {
        errno = EIO;
        return -1;
    }
    if (n == setting("COLIBRI_SLOW_SHORT")) {
        const size_t half = count / 2 / 4096 * 4096; /* O_DIRECT: whole blocks */
        const ssize_t got = half > 0 ? real(fd, buf, half, offset) : 0;
        __atomic_store_n(&short_end, (int64_t)offset + (int64_t)half, __ATOMIC_SEQ_CST);
        return got;
    }
    return real(fd, buf, count, offset);
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset)
{
    return shimmed(fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t offset)
{
    return shimmed(fd, buf, count, offset);
}
