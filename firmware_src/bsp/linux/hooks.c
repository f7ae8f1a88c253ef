/* The board support hooks of app/bsp.h as a Linux process has them: frames written to stdout, the
 * monotonic clock, the build-id from the program's notes, uname's machine, peak memory from
 * /proc/self/status, and every step's logits into the --logits-out file. */
#define _GNU_SOURCE /* dl_iterate_phdr, for the build-id */
#define _POSIX_C_SOURCE 200809L

#include "hooks.h"

#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "../../app/bsp.h"
#include "../../app/build_id.h"

static FILE *logits_file; /* --logits-out; NULL: none */

/* Frames go straight to the file descriptor (no stdio buffer), so that the SIGBUS handler
 * (image_map.c) can send one too. */
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

int bsp_margins(uint64_t *stack_used, uint64_t *stack_size, uint64_t *heap_peak, uint64_t *heap_size)
{
    (void)stack_used;
    (void)stack_size;
    (void)heap_peak;
    (void)heap_size;
    return 0; /* a process: its peak RSS says what it used (bsp_peak_memory) */
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

int logits_out_open(const char *path)
{
    logits_file = fopen(path, "wb");
    return logits_file != NULL ? 0 : -1;
}

void logits_out_close(void)
{
    if (logits_file != NULL) {
        fclose(logits_file);
        logits_file = NULL;
    }
}
