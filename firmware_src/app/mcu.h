/* What the bare-metal BSPs share: reporting a CPU trap, and serving request frames read from a
 * UART byte by byte. */
#ifndef COLIBRI_MCU_H
#define COLIBRI_MCU_H

#include <stdint.h>

/* Send an error frame naming the trap (code 200). */
void colibri_report_trap(uint32_t cause, uint32_t pc, uint32_t value);

/* Read lines with read_byte (blocking) and decode each valid request frame; anything else is
 * ignored. With forever = 0 return the status of the first decode, else never return. */
int colibri_serve(int (*read_byte)(void), int forever);

#endif
