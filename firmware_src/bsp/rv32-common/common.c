/* What the bare-metal RISC-V BSPs (qemu-rv32, esp32p4) do alike, included by each one's common.c:
 * the instruction counter, the build-id from the linker script's note, a trap's report, and the
 * hooks that have nothing to do on an MCU. Each BSP keeps its own UART, clock and bsp_exit. */
#include <stddef.h>
#include <stdint.h>

#include "../../app/bsp.h"
#include "../../app/build_id.h"
#include "../../app/mcu.h"

/* minstret, read high-low-high so that a carry between the two halves is not lost (qemu -icount
 * shift=0 counts exactly; on the P4 it is the core's own counter). */
int bsp_instructions(uint64_t *count)
{
    uint32_t hi, lo, hi2;
    do {
        __asm__ volatile("csrr %0, minstreth" : "=r"(hi));
        __asm__ volatile("csrr %0, minstret" : "=r"(lo));
        __asm__ volatile("csrr %0, minstreth" : "=r"(hi2));
    } while (hi != hi2);
    *count = ((uint64_t)hi << 32) | lo;
    return 1;
}

extern const uint8_t __colibri_build_id_note[]; /* link.ld: the .note.gnu.build-id section */

size_t bsp_build_id(const uint8_t **id)
{
    return colibri_build_id_from_note(__colibri_build_id_note, 16 + 64, id);
}

const char *bsp_machine(void)
{
    return NULL; /* no operating system to ask: the board file says what this is */
}

uint64_t bsp_peak_memory(void)
{
    return 0; /* static arenas: `./colibri report` gives every byte */
}

#define STACK_PAINT 0x5354434bu /* start.S paints the stack with it before main */
extern uint32_t __stack_bottom[], __stack_top[]; /* link.ld: the .stack section */

int bsp_margins(uint64_t *stack_used, uint64_t *stack_size, uint64_t *heap_peak, uint64_t *heap_size)
{
    /* The stack grows down from __stack_top: the lowest word no longer painted is its high-water mark. */
    const uint32_t *w = __stack_bottom;
    while (w < __stack_top && *w == STACK_PAINT) {
        w++;
    }
    *stack_used = (uint64_t)((uintptr_t)__stack_top - (uintptr_t)w);
    *stack_size = (uint64_t)((uintptr_t)__stack_top - (uintptr_t)__stack_bottom);
    *heap_peak = 0; /* no heap: nothing is allocated, the arenas are static (link.ld defines none) */
    *heap_size = 0;
    return 1;
}

void bsp_logits_sink(int32_t step, const float *logits, int32_t n)
{
    (void)step;
    (void)logits;
    (void)n;
}

void bsp_trap(uint32_t cause, uint32_t pc, uint32_t value)
{
    colibri_report_trap(cause, pc, value);
    bsp_exit(3);
}
