/* --memory-budget auto's starting point: the memory this process may use (memory_limit.h). */
#define _POSIX_C_SOURCE 200809L

#include "memory_limit.h"

#include <stdio.h>
#include <string.h>

#define NO_LIMIT_FROM ((uint64_t)1 << 62) /* v1 writes 2^63 - 4096 for "no limit" */
#define PATH_BYTES 4096

/* A limit file's value: 0 and *value set, or -1 for "max", a value this large, or no such file. */
static int read_limit(const char *path, uint64_t *value)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    char text[32];
    int ok = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    uint64_t v = 0;
    const char *p = text;
    if (!ok || *p < '0' || *p > '9') {
        return -1;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v >= NO_LIMIT_FROM / 10) {
            return -1;
        }
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if ((*p != '\n' && *p != '\0') || v >= NO_LIMIT_FROM) {
        return -1;
    }
    *value = v;
    return 0;
}

/* Keeps the smaller limit: path's, when it has one and is smaller than what *found holds. */
static void consider(const char *path, const char *root, MemorySource source, MemoryFound *found)
{
    uint64_t value;
    if (read_limit(path, &value) != 0 || (found->source != MEMORY_NOT_FOUND && value >= found->bytes)) {
        return;
    }
    found->source = source;
    found->bytes = value;
    snprintf(found->where, sizeof found->where, "%s", path + strlen(root));
}

/* The limits of the cgroup `dir` (under `base`, with no trailing slash) and of each parent up to base. */
static void walk_up(char *dir, size_t base_len, const char *name, const char *root, MemorySource source,
                    MemoryFound *found)
{
    char path[PATH_BYTES + 32];
    for (;;) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        consider(path, root, source, found);
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base_len || slash == NULL || (size_t)(slash - dir) < base_len) {
            return;
        }
        *slash = '\0';
    }
}

static void cgroup_limit(const char *root, MemoryFound *found)
{
    char path[PATH_BYTES], line[PATH_BYTES];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return;
    }
    /* Lines are ID:CONTROLLERS:PATH; v2's is 0::PATH, v1's memory line names memory among them. */
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *group = controllers ? strchr(controllers + 1, ':') : NULL;
        if (group == NULL) {
            continue;
        }
        *controllers++ = '\0';
        *group++ = '\0';
        const char *name;
        MemorySource source;
        int base_len;
        int is_memory = 0;
        for (char *c = controllers, *end; *c; c = *end ? end + 1 : end) {
            end = c + strcspn(c, ",");
            is_memory |= (size_t)(end - c) == 6 && strncmp(c, "memory", 6) == 0;
        }
        if (strcmp(line, "0") == 0 && *controllers == '\0') {
            base_len = snprintf(path, sizeof path, "%s/sys/fs/cgroup", root);
            name = "memory.max";
            source = MEMORY_CGROUP_V2;
        } else if (is_memory) {
            base_len = snprintf(path, sizeof path, "%s/sys/fs/cgroup/memory", root);
            name = "memory.limit_in_bytes";
            source = MEMORY_CGROUP_V1;
        } else {
            continue;
        }
        size_t len = strlen(group);
        while (len > 0 && group[len - 1] == '/') {
            group[--len] = '\0'; /* "/" is the hierarchy's root itself */
        }
        if (base_len < 0 || (size_t)base_len + len + 1 >= sizeof path) {
            continue;
        }
        memcpy(path + base_len, group, len + 1);
        walk_up(path, (size_t)base_len, name, root, source, found);
    }
    fclose(f);
}

/* MemAvailable from /proc/meminfo, in bytes; 0 and *bytes set, or -1. */
static int mem_available(const char *root, uint64_t *bytes)
{
    char path[PATH_BYTES], line[256];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    int status = -1;
    unsigned long long kb;
    while (status != 0 && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 && kb < (1ull << 53)) {
            *bytes = (uint64_t)kb * 1024u;
            status = 0;
        }
    }
    fclose(f);
    return status;
}

int memory_found(const char *root, MemoryFound *found)
{
    memset(found, 0, sizeof *found);
    cgroup_limit(root, found);
    uint64_t available;
    if (mem_available(root, &available) == 0 && (found->source == MEMORY_NOT_FOUND || available < found->bytes)) {
        found->source = MEMORY_MEMINFO;
        found->bytes = available;
        snprintf(found->where, sizeof found->where, "/proc/meminfo");
    }
    return found->source == MEMORY_NOT_FOUND ? -1 : 0;
}

const char *memory_source_name(MemorySource source)
{
    switch (source) {
    case MEMORY_CGROUP_V2:
        return "cgroup-v2";
    case MEMORY_CGROUP_V1:
        return "cgroup-v1";
    case MEMORY_MEMINFO:
        return "meminfo";
    default:
        return "none";
    }
}
