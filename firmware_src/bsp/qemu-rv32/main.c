/* qemu-rv32 BSP: the same runtime as the ESP32-P4 on an emulated rv32imafc MCU.
 * Output and input through the virt machine's NS16550 UART, time from the CLINT, exit through the
 * SiFive test device, weights read in place from emulated flash; the start-up, the exact instruction
 * counts (minstret, qemu -icount shift=0) and the rest the esp32p4 BSP shares are in ../rv32-common.
 *
 * Input behaves like the ESP32-P4's UART: received bytes land in a receive FIFO of the P4's 128
 * bytes (filled by the UART interrupt whatever the program is doing), and what arrives while it is
 * full is lost. qemu alone would hold every byte back in its socket until the program reads it,
 * hiding a host that sends more than the board can take (the request's flow control). */
#include <stddef.h>
#include <stdint.h>

#include "../../app/bsp.h"
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
#define UART_IER 1              /* interrupt enable */
#define UART_MCR 4              /* modem control (OUT2 gates the interrupt line) */
#define UART_IER_RX 0x01u
#define UART_MCR_OUT2 0x08u
#define CLINT_MTIME 0x0200BFF8u /* 64-bit timer at 10 MHz */
#define MTIME_TICKS_PER_US 10u
#define PLIC_BASE 0x0C000000u   /* the virt machine's interrupt controller */
#define PLIC_UART_IRQ 10u       /* UART0's source */
#define PLIC_PRIORITY(irq) (PLIC_BASE + 4u * (irq))
#define PLIC_ENABLE_HART0_M (PLIC_BASE + 0x2000u)
#define PLIC_THRESHOLD_HART0_M (PLIC_BASE + 0x200000u)
#define PLIC_CLAIM_HART0_M (PLIC_BASE + 0x200004u)
#define MCAUSE_INTERRUPT 0x80000000u
#define MCAUSE_MACHINE_EXTERNAL 11u

#ifndef COLIBRI_UART_RX_FIFO
#define COLIBRI_UART_RX_FIFO 128 /* the ESP32-P4 UART's receive FIFO, in bytes */
#endif
#ifndef COLIBRI_TEST_LOAD_DELAY_US
#define COLIBRI_TEST_LOAD_DELAY_US 0 /* tests: make loading slower, as a big image on a real P4 is */
#endif

static volatile uint8_t *const uart = (volatile uint8_t *)UART_BASE;

/* The receive FIFO: the interrupt handler adds at `head`, uart_read_byte takes at `tail`; each
 * index is written by one side only. */
static volatile uint8_t rx_fifo[COLIBRI_UART_RX_FIFO];
static volatile uint32_t rx_head, rx_tail, rx_lost;

static void uart_receive(void)
{
    while (uart[UART_LSR] & UART_LSR_DATA_READY) {
        uint8_t c = uart[UART_RBR];
        if (rx_head - rx_tail < COLIBRI_UART_RX_FIFO) {
            rx_fifo[rx_head % COLIBRI_UART_RX_FIFO] = c;
            rx_head = rx_head + 1;
        } else {
            rx_lost = rx_lost + 1; /* as on the P4: a full FIFO drops what arrives */
        }
    }
}

/* Every trap: the UART's interrupt fills the FIFO; anything else is a fault, reported. (mtvec needs
 * a 4-byte aligned address: its low two bits are the mode.) */
__attribute__((interrupt("machine"), aligned(4))) static void trap_handler(void)
{
    uint32_t cause, pc, value;
    __asm__ volatile("csrr %0, mcause" : "=r"(cause));
    if (cause == (MCAUSE_INTERRUPT | MCAUSE_MACHINE_EXTERNAL)) {
        volatile uint32_t *claim = (volatile uint32_t *)PLIC_CLAIM_HART0_M;
        uint32_t irq = *claim;
        if (irq == PLIC_UART_IRQ) {
            uart_receive();
        }
        *claim = irq;
        return;
    }
    __asm__ volatile("csrr %0, mepc" : "=r"(pc));
    __asm__ volatile("csrr %0, mtval" : "=r"(value));
    bsp_trap(cause, pc, value);
}

static void uart_receive_by_interrupt(void)
{
    *(volatile uint32_t *)PLIC_PRIORITY(PLIC_UART_IRQ) = 1;
    *(volatile uint32_t *)PLIC_ENABLE_HART0_M |= 1u << PLIC_UART_IRQ;
    *(volatile uint32_t *)PLIC_THRESHOLD_HART0_M = 0;
    uart[UART_IER] = UART_IER_RX;
    uart[UART_MCR] = UART_MCR_OUT2;
    __asm__ volatile("csrw mtvec, %0" ::"r"(trap_handler));
    __asm__ volatile("csrs mie, %0" ::"r"(1u << MCAUSE_MACHINE_EXTERNAL));
    __asm__ volatile("csrsi mstatus, 8"); /* MIE */
}

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
    /* Wait for a byte with interrupts masked around the check: a byte arriving between the check
     * and wfi would otherwise be taken before wfi, which would then sleep past it. wfi still wakes
     * for the pending interrupt, taken once they are enabled again. */
    for (;;) {
        __asm__ volatile("csrci mstatus, 8");
        if (rx_tail != rx_head) {
            __asm__ volatile("csrsi mstatus, 8");
            break;
        }
        __asm__ volatile("wfi");
        __asm__ volatile("csrsi mstatus, 8");
    }
    uint8_t c = rx_fifo[rx_tail % COLIBRI_UART_RX_FIFO];
    rx_tail = rx_tail + 1;
    return c;
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

/* Read and drop input for up to `us` microseconds or until a newline: a host that sent its request
 * before it saw our error frame must have it consumed, or closing the socket would reset the
 * connection and lose the frames still on their way to it. */
static void drain_input(uint64_t us)
{
    uint64_t start = bsp_time_us();
    while (bsp_time_us() - start < us) {
        if (rx_tail != rx_head && uart_read_byte() == '\n') {
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

int main(void)
{
    uart[UART_FCR] = 0x07; /* enable and clear the FIFOs */
    uart_receive_by_interrupt();
    /* Load before saying hello, as on the P4: the host sends its request when it sees the hello. */
    const uint8_t *flash = (const uint8_t *)COLIBRI_WEIGHTS_ADDR;
    int status = colibri_load(flash, colibri_image_length_in_region(flash, COLIBRI_WEIGHTS_REGION_BYTES));
#if COLIBRI_TEST_LOAD_DELAY_US > 0
    for (uint64_t start = bsp_time_us(); bsp_time_us() - start < COLIBRI_TEST_LOAD_DELAY_US;) {
    }
#endif
    colibri_hello();
    colibri_boot_selftest(status, NULL);
    if (status != 0) {
        colibri_report_error(status, colibri_status_message(status));
        return status;
    }
    /* Requests until the host stops the emulator, as a real board serves them until it is reset: a
     * conversation continues from one to the next. */
    return colibri_serve(uart_read_byte, 1, 0);
}
