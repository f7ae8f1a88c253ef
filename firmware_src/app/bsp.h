/* What a board support package provides to the application. */
#ifndef COLIBRI_BSP_H
#define COLIBRI_BSP_H

#include <stddef.h>
#include <stdint.h>

/* Write bytes of the result protocol (stdout on Linux boards, the UART on MCUs). */
void bsp_write(const char *data, size_t len);

/* A monotonic clock in microseconds, for the stats frame. */
uint64_t bsp_time_us(void);

/* Peak resident memory of the firmware in bytes, where the board can tell (Linux); else 0. */
uint64_t bsp_peak_memory(void);

/* The MCU's memory margins where the board can tell (returns 1; else 0): the most of its stack ever
 * used (a high-water mark over the stack painted at start-up) and the stack's size, the largest heap
 * use and the heap's size (0 and 0 where nothing is allocated: static arenas, no heap linked). */
int bsp_margins(uint64_t *stack_used, uint64_t *stack_size, uint64_t *heap_peak, uint64_t *heap_size);

/* Retired-instruction counter: returns 1 and sets *count where the board has one, else 0. */
int bsp_instructions(uint64_t *count);

/* This firmware's GNU build-id (the linker's hash of the program): points *id at it and returns
 * its length, or returns 0 where the program carries none. */
size_t bsp_build_id(const uint8_t **id);

/* The machine the firmware runs on as its operating system names it (`uname -m` on Linux boards:
 * what a board reached over SSH really is, or what an emulator claims), or NULL on an MCU, which is
 * what its board file says. */
const char *bsp_machine(void);

/* Called with every step's logits; boards that can store them (host: --logits-out) do. */
void bsp_logits_sink(int32_t step, const float *logits, int32_t n);

#endif
