/* esp32p4 BSP: bare metal on the HP core, booted by the ROM loader (no ESP-IDF). Frames go out
 * and requests come in on UART0 (TX GPIO37, 115200 baud as the ROM left it) through the ROM's UART
 * functions; time from mcycle; the weight image is linked in. The start-up, the instruction counts
 * (minstret) and the rest the qemu-rv32 BSP shares are in ../rv32-common. */
#include <stddef.h>
#include <stdint.h>

#include "../../app/bsp.h"
#include "../../app/decode.h"
#include "../../app/mcu.h"
#include "../../runtime/image_loader.h"
#include "model_def.h"

/* ROM functions; addresses in link.ld. */
extern uint32_t ets_get_cpu_frequency(void); /* MHz */
extern int uart_tx_one_char(uint8_t c);
extern int uart_rx_one_char(uint8_t *c); /* 0 when a byte was read */
extern void uart_tx_flush(uint8_t uart_no);
extern void disable_default_watchdog(void);

extern const uint8_t colibri_weights_image[];
extern const uint8_t colibri_weights_end[];

/* Watchdog registers (ESP32-P4 TRM; ESP-IDF soc/esp32p4/register). */
#define WDT_WRITE_KEY 0x50D83AA1u
#define LP_WDT_BASE 0x50116000u
#define LP_WDT_CONFIG0 (LP_WDT_BASE + 0x00u)
#define LP_WDT_WPROTECT (LP_WDT_BASE + 0x18u)
#define LP_WDT_SWD_CONFIG (LP_WDT_BASE + 0x1Cu)
#define LP_WDT_SWD_WPROTECT (LP_WDT_BASE + 0x20u)
#define LP_WDT_SWD_AUTO_FEED_EN (1u << 18)
#define TIMG0_BASE 0x500C2000u
#define TIMG1_BASE 0x500C3000u
#define TIMG_WDTCONFIG0 0x48u
#define TIMG_WDTWPROTECT 0x64u

static void write_reg(uint32_t addr, uint32_t value)
{
    *(volatile uint32_t *)addr = value;
}

static uint32_t read_reg(uint32_t addr)
{
    return *(volatile uint32_t *)addr;
}

static void watchdogs_off(void)
{
    disable_default_watchdog();
    const uint32_t timg[2] = {TIMG0_BASE, TIMG1_BASE};
    for (int i = 0; i < 2; i++) {
        write_reg(timg[i] + TIMG_WDTWPROTECT, WDT_WRITE_KEY);
        write_reg(timg[i] + TIMG_WDTCONFIG0, 0);
        write_reg(timg[i] + TIMG_WDTWPROTECT, 0);
    }
    write_reg(LP_WDT_WPROTECT, WDT_WRITE_KEY);
    write_reg(LP_WDT_CONFIG0, 0);
    write_reg(LP_WDT_WPROTECT, 0);
    /* The super watchdog cannot be turned off; let the hardware feed it. */
    write_reg(LP_WDT_SWD_WPROTECT, WDT_WRITE_KEY);
    write_reg(LP_WDT_SWD_CONFIG, read_reg(LP_WDT_SWD_CONFIG) | LP_WDT_SWD_AUTO_FEED_EN);
    write_reg(LP_WDT_SWD_WPROTECT, 0);
}

void bsp_write(const char *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        uart_tx_one_char((uint8_t)data[i]);
    }
    uart_tx_flush(0);
}

static uint64_t read_cycles(void)
{
    uint32_t hi, lo, hi2;
    do {
        __asm__ volatile("csrr %0, mcycleh" : "=r"(hi));
        __asm__ volatile("csrr %0, mcycle" : "=r"(lo));
        __asm__ volatile("csrr %0, mcycleh" : "=r"(hi2));
    } while (hi != hi2);
    return ((uint64_t)hi << 32) | lo;
}

uint64_t bsp_time_us(void)
{
    uint32_t mhz = ets_get_cpu_frequency();
    return read_cycles() / (mhz ? mhz : 1u);
}

/* Nothing to return to: a board stops only when it is reset. */
void bsp_exit(int code)
{
    (void)code;
    for (;;) {
    }
}

static int uart_read_byte(void)
{
    uint8_t c;
    while (uart_rx_one_char(&c) != 0) {
    }
    return c;
}

int main(void)
{
    watchdogs_off();
    /* Load (seconds of CRC-32 and SHA-256 over the image) before saying hello: the host sends its
     * request when it sees the hello, and nothing reads the UART while the image is checked. */
    uint64_t image_bytes = (uint64_t)(colibri_weights_end - colibri_weights_image);
    int status = colibri_load(colibri_weights_image, image_bytes);
    colibri_hello();
    colibri_boot_selftest(status, NULL);
    if (status != 0) {
        colibri_report_error(status, colibri_status_message(status));
    }
    /* Serve requests for as long as the board is powered (each answered with the load error if
     * the image was refused); noise between them is ignored. */
    return colibri_serve(uart_read_byte, 1, status);
}
