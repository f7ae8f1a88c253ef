/* What the bare-metal BSPs share: reporting a CPU trap, and serving request frames read from a
 * UART byte by byte. */
#ifndef COLIBRI_MCU_H
#define COLIBRI_MCU_H

#include <stdint.h>

/* The bare-metal BSP's own ending, with main's return value (bsp/rv32-common/start.S calls it
 * when main returns, bsp_trap after a fault): qemu-rv32 ends the emulator, esp32p4 spins. */
void bsp_exit(int code);

/* A CPU trap (bsp/rv32-common: an error frame, then bsp_exit(3)). */
void bsp_trap(uint32_t cause, uint32_t pc, uint32_t value);

/* Send an error frame naming the trap (code 200). */
void colibri_report_trap(uint32_t cause, uint32_t pc, uint32_t value);

/* Serve one line that arrived on the link: a request frame is decoded (when load_status, the weight
 * image's colibri_status, is 0; load_message says why it is not, or NULL for the status's own
 * message); a bad one is answered with an error frame saying why. Returns the
 * decode's status, the error code, or -1 for a line that is not a frame (noise, a stray newline). */
int colibri_serve_line(const char *line, int len, int load_status, const char *load_message);

/* Flow control for links without it (an MCU's UART, whose receive FIFO holds 128 bytes on the
 * ESP32-P4): after every PROTO_ACK_BYTES bytes of a request line that has not ended, an ack frame
 * (bytes=received); the host sends the next piece only then. Call with the count so far. */
/* Whether byte c, after line[0..len), starts a new request frame's marker ("@CLB " with c its
 * space) inside a line already begun: a line cut short (a host killed mid-send, a cable pulled) and
 * then a whole request sent. The caller drops the fragment and keeps the marker (colibri_restart_line),
 * so the new request is served instead of refused with the fragment in front of it. */
int colibri_request_restarts(const char *line, int len, char c);

/* The line reduced to the marker's first 4 bytes ("@CLB"): its new length. */
int colibri_restart_line(char *line);

void colibri_acknowledge(int received);

/* Read lines with read_byte (blocking) and serve each (colibri_serve_line, acknowledging as they
 * come); a line longer than any request is answered with an error frame. load_status is the weight
 * image's colibri_status (requests are answered with it when it is not 0). With forever = 0
 * return after the first successful decode, else never return. */
int colibri_serve(int (*read_byte)(void), int forever, int load_status);

#endif
