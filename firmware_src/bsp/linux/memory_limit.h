/* What --memory-budget auto starts from: the memory this process may use where it runs. The host
 * has the same rule (generator/compile/cache_plan.py, find_memory), so `report` says beforehand what
 * the firmware will find on that machine; the firmware finds it itself because under
 * tools/in-memory-cgroup or on a board over SSH it is in another cgroup, or machine, than the CLI. */
#ifndef COLIBRI_MEMORY_LIMIT_H
#define COLIBRI_MEMORY_LIMIT_H

#include <stdint.h>

/* What auto leaves of what it finds: page tables (1/512 of what the budget touches), kernel stacks
 * and slab, a buffered expert read's pages before they are dropped, and, under MemAvailable, the
 * rest of the system's growth while the firmware's pages are locked. The plan already counts the
 * resident image, the arenas and the board's budget_reserve. compile/sizes.py's AUTO_MARGIN_BYTES. */
#define COLIBRI_AUTO_MARGIN_BYTES (128ull << 20)

typedef enum {
    MEMORY_NOT_FOUND = 0,
    MEMORY_CGROUP_V2,  /* memory.max */
    MEMORY_CGROUP_V1,  /* memory.limit_in_bytes */
    MEMORY_MEMINFO,    /* MemAvailable */
} MemorySource;

typedef struct {
    MemorySource source;
    uint64_t bytes;
    char where[200]; /* the file the number came from */
} MemoryFound;

/* The smaller of this process's memory cgroup limit (the smallest up each hierarchy named in
 * /proc/self/cgroup: v2 under /sys/fs/cgroup, v1 under /sys/fs/cgroup/memory; "max" or 2^62 and
 * above is no limit; missing levels are skipped) and MemAvailable; the cgroup's on a tie. `root`
 * prefixes every path ("" on a board; a fake tree in tests). Returns 0, or -1 when neither exists. */
int memory_found(const char *root, MemoryFound *found);

/* "cgroup-v2", "cgroup-v1", "meminfo": as the stats frame names the source. */
const char *memory_source_name(MemorySource source);

#endif
