/* A persistent pool of pthreads: workers are created once and spin on a generation counter, so a
 * parallel_for costs a few hundred nanoseconds, not a thread creation (there are hundreds per
 * token). The caller takes the first range itself. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "../parallel.h"

#define MAX_THREADS 64

static struct {
    int n_threads;
    atomic_uint generation; /* bumped once per parallel_for */
    atomic_int pending;     /* workers still running the current job */
    void (*fn)(void *ctx, int begin, int end);
    void *ctx;
    int n;
} pool = {1, 0, 0, 0, 0, 0};

static void range(int id, int n, int *begin, int *end)
{
    *begin = (int)((long long)n * id / pool.n_threads);
    *end = (int)((long long)n * (id + 1) / pool.n_threads);
}

static void relax(int spins)
{
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield(); /* more threads than cores: let the others run */
    }
}

/* The generation when the pool started: a worker that starts late must still see the first job. */
static unsigned first_generation;

static void *worker(void *arg)
{
    const int id = (int)(long)arg;
    unsigned seen = first_generation;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen) {
            relax(spins++);
        }
        seen = atomic_load(&pool.generation);
        int begin, end;
        range(id, pool.n, &begin, &end);
        if (begin < end) {
            pool.fn(pool.ctx, begin, end);
        }
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
    }
    return NULL;
}

int parallel_start(int n_threads)
{
    if (pool.n_threads > 1 || n_threads <= 1) {
        return pool.n_threads;
    }
    if (n_threads > MAX_THREADS) {
        n_threads = MAX_THREADS;
    }
    int started = 1;
    first_generation = atomic_load(&pool.generation);
    for (int id = 1; id < n_threads; id++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(long)id) != 0) {
            break;
        }
        pthread_detach(t);
        started++;
    }
    pool.n_threads = started;
    return started;
}

void parallel_for(void (*fn)(void *ctx, int begin, int end), void *ctx, int n)
{
    if (pool.n_threads == 1 || n < pool.n_threads) {
        fn(ctx, 0, n);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    atomic_store(&pool.pending, pool.n_threads - 1);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    int begin, end;
    range(0, n, &begin, &end);
    fn(ctx, begin, end);
    int spins = 0;
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) {
        relax(spins++);
    }
}

int parallel_threads(void)
{
    return pool.n_threads;
}
