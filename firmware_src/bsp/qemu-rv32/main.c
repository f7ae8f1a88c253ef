/* qemu-rv32 BSP: the same runtime as the ESP32-P4 on an emulated rv32imafc MCU.
 * Output and input through the virt machine's NS16550 UART, time from the CLINT, exact
 * instruction counts from rdinstret (qemu -icount shift=0), exit through the SiFive test device,
 * weights read in place from emulated flash. */
#include <stddef.h>
#include <stdint.h>

#include "../../app/bsp.h"
#include "../../app/build_id.h"
#include "../../app/decode.h"
#include "../../app/mcu.h"
#include "../../runtime/image_loader.h"
#include "board_def.h"
#include "model_def.h"

#define UART_BASE 0x10000000u   /* NS16550A */
#define UART_RBR 0              /* receive buffer (read) */
#define UART_THR 0              /* transmit holding (write) */
#define UART_FCR 2              /* FIFO control */
#define UART_LSR 5              /* line status */
#define UART_LSR_DATA_READY 0x01u
#define UART_LSR_THR_EMPTY 0x20u
#define TEST_DEVICE 0x00100000u /* SiFive test finisher: 0x5555 pass, (code << 16) | 0x3333 fail */
#define CLINT_MTIME 0x0200BFF8u /* 64-bit timer at 10 MHz */
#define MTIME_TICKS_PER_US 10u

static volatile uint8_t *const uart = (volatile uint8_t *)UART_BASE;

void bsp_write(const char *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        while (!(uart[UART_LSR] & UART_LSR_THR_EMPTY)) {
        }
        uart[UART_THR] = (uint8_t)data[i];
    }
}

static int uart_read_byte(void)
{
    while (!(uart[UART_LSR] & UART_LSR_DATA_READY)) {
    }
    return uart[UART_RBR];
}

uint64_t bsp_time_us(void)
{
    volatile uint32_t *mtime = (volatile uint32_t *)CLINT_MTIME;
    uint32_t hi, lo;
    do {
        hi = mtime[1];
        lo = mtime[0];
    } while (hi != mtime[1]);
    return (((uint64_t)hi << 32) | lo) / MTIME_TICKS_PER_US;
}

int bsp_instructions(uint64_t *count)
{
    uint32_t hi, lo, hi2;
    do {
        __asm__ volatile("rdinstreth %0" : "=r"(hi));
        __asm__ volatile("rdinstret %0" : "=r"(lo));
        __asm__ volatile("rdinstreth %0" : "=r"(hi2));
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

void bsp_logits_sink(int32_t step, const float *logits, int32_t n)
{
    (void)step;
    (void)logits;
    (void)n;
}

/* Read and drop input for up to `us` microseconds or until a newline: a host that sent its request
 * before it saw our error frame must have it consumed, or closing the socket would reset the
 * connection and lose the frames still on their way to it. */
static void drain_input(uint64_t us)
{
    uint64_t start = bsp_time_us();
    while (bsp_time_us() - start < us) {
        if ((uart[UART_LSR] & UART_LSR_DATA_READY) && uart[UART_RBR] == '\n') {
            return;
        }
    }
}

void bsp_exit(int code)
{
    if (code != 0) {
        drain_input(200000);
    }
    volatile uint32_t *finisher = (volatile uint32_t *)TEST_DEVICE;
    *finisher = code == 0 ? 0x5555u : (((uint32_t)code & 0xFFFFu) << 16) | 0x3333u;
    for (;;) {
    }
}

void bsp_trap(uint32_t cause, uint32_t pc, uint32_t value)
{
    colibri_report_trap(cause, pc, value);
    bsp_exit(3);
}

int main(void)
{
    uart[UART_FCR] = 0x07; /* enable and clear the FIFOs */
    colibri_hello();
    const uint8_t *flash = (const uint8_t *)COLIBRI_WEIGHTS_ADDR;
    int status = colibri_load(flash, colibri_image_length_in_region(flash, COLIBRI_WEIGHTS_REGION_BYTES));
    if (status != 0) {
        return status;
    }
    return colibri_serve(uart_read_byte, 0); /* one request, then exit through the test device */
}
