/* ESP32-P4 BSP on ESP-IDF: the runtime inside an ESP-IDF application (generator/compile/esp32/idf_project.py
 * generates the project around it).
 *
 * Results go out and requests come in on UART0 (the console UART, on the board's USB-serial
 * bridge). The weight image sits in a flash data partition, mapped into the data address space
 * with esp_partition_mmap and read in place. The arenas live in PSRAM and the hot code in IRAM
 * because of the project's linker fragment, not because of anything here. After reset the
 * firmware sends its hello frame and loads the image, then serves request frames forever; while
 * idle it repeats the hello frame, so a host that opens the port later still sees one.
 *
 * A/B updates (`colibri ota`): an update's first boot finds its app PENDING_VERIFY (the bootloader,
 * built with CONFIG_BOOTLOADER_APP_ROLLBACK_ENABLE, marked it so); it runs the self-test whatever
 * [selftest] boot says, and confirms itself on PASS or rolls back on FAIL (app/ota_state.c decides,
 * the esp_ota_* calls are here). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "driver/uart.h"
#include "esp_app_desc.h"
#include "esp_err.h"
#include "esp_heap_caps.h"
#include "esp_ota_ops.h"
#include "esp_partition.h"
#include "esp_system.h"
#include "esp_task.h"
#include "esp_timer.h"
#include "freertos/FreeRTOS.h"
#include "freertos/task.h"

#include "../../app/bsp.h"
#include "../../app/decode.h"
#include "../../app/mcu.h"
#include "../../app/ota_state.h"
#include "../../app/selftest.h"
#include "../../runtime/image_loader.h"
#include "colibri_idf.h" /* generated with the project: partition label and subtype, UART settings */
#include "model_def.h"

#define REQUEST_LINE_BYTES COLIBRI_REQUEST_LINE_BYTES(COLIBRI_N_CTX)
#define UART_PORT ((uart_port_t)COLIBRI_IDF_UART_NUM)
#define READ_CHUNK 128
#define READ_WAIT_MS 20

static int uart_ready;

void bsp_write(const char *data, size_t len)
{
    if (!uart_ready) { /* before the driver is installed (or if it could not be): the console */
        fwrite(data, 1, len, stdout);
        fflush(stdout);
        return;
    }
    while (len > 0) {
        int sent = uart_write_bytes(UART_PORT, data, len); /* no TX ring buffer: blocks until sent */
        if (sent <= 0) {
            return;
        }
        data += sent;
        len -= (size_t)sent;
    }
}

uint64_t bsp_time_us(void)
{
    return (uint64_t)esp_timer_get_time();
}

int bsp_instructions(uint64_t *count)
{
    (void)count;
    return 0; /* the P4's HP core has no retired-instruction counter ESP-IDF exposes reliably */
}

uint64_t bsp_peak_memory(void)
{
    return 0; /* static arenas: `./colibri report` gives every byte */
}

/* The heap whatever is allocated for this firmware comes from: ESP-IDF allocates for it (the UART
 * driver's buffers, FreeRTOS's task stacks and control blocks), in internal RAM; the arenas are
 * static (in PSRAM, by the project's linker fragment) and nothing allocates from PSRAM's heap. */
#define FIRMWARE_HEAP_CAPS (MALLOC_CAP_INTERNAL | MALLOC_CAP_8BIT)

int bsp_margins(uint64_t *stack_used, uint64_t *stack_size, uint64_t *heap_peak, uint64_t *heap_size)
{
    /* The decode runs in app_main, on ESP-IDF's "main" task, which its start-up code creates with
     * ESP_TASK_MAIN_STACK bytes (CONFIG_ESP_MAIN_TASK_STACK_SIZE plus ESP-IDF's TASK_EXTRA_STACK_SIZE).
     * ESP-IDF's FreeRTOS counts stacks in bytes, not words: the high-water mark is the fewest bytes
     * the calling task ever had left. */
    uint64_t size = (uint64_t)ESP_TASK_MAIN_STACK;
    uint64_t never_used = (uint64_t)uxTaskGetStackHighWaterMark(NULL);
    *stack_size = size;
    *stack_used = never_used < size ? size - never_used : 0;
    /* The largest use since boot: the heap's size less the least it ever had free. */
    uint64_t total = (uint64_t)heap_caps_get_total_size(FIRMWARE_HEAP_CAPS);
    uint64_t least_free = (uint64_t)heap_caps_get_minimum_free_size(FIRMWARE_HEAP_CAPS);
    *heap_size = total;
    *heap_peak = least_free < total ? total - least_free : 0;
    return 1;
}

void bsp_logits_sink(int32_t step, const float *logits, int32_t n)
{
    (void)step;
    (void)logits;
    (void)n;
}

/* The result of loading the weight image, repeated in answer to every request when it failed. */
static int load_status = COLIBRI_ERR_NO_IMAGE;
static const char *load_message = "the weight image was not loaded";

static void load_weights(void)
{
    const esp_partition_t *part = esp_partition_find_first(
        ESP_PARTITION_TYPE_DATA, (esp_partition_subtype_t)COLIBRI_IDF_WEIGHTS_SUBTYPE, COLIBRI_IDF_WEIGHTS_LABEL);
    if (part == NULL) {
        load_message = "no weights partition in the partition table (flash the project's partition table)";
        return;
    }
    const void *mapped = NULL;
    esp_partition_mmap_handle_t handle; /* kept mapped for the life of the firmware */
    if (esp_partition_mmap(part, 0, part->size, ESP_PARTITION_MMAP_DATA, &mapped, &handle) != ESP_OK ||
        mapped == NULL) {
        load_message = "cannot map the weights partition (esp_partition_mmap failed)";
        return;
    }
    const uint8_t *image = (const uint8_t *)mapped;
    /* The length the image's header declares (read only if the partition can hold a header),
     * bounded by the partition: the loader checks everything else. */
    load_status = colibri_load(image, colibri_image_length_in_region(image, (uint64_t)part->size));
    load_message = colibri_status_message(load_status);
}

/* The firmware's identity in the hello frame: ESP-IDF's SHA-256 of the application ELF. */
size_t bsp_build_id(const uint8_t **id)
{
    *id = esp_app_get_description()->app_elf_sha256;
    return sizeof esp_app_get_description()->app_elf_sha256;
}

const char *bsp_machine(void)
{
    return NULL; /* no operating system to ask: the board file says what this is */
}

/* The running app's state in otadata: PENDING_VERIFY on an update's first boot, UNDEFINED for an
 * app flashed over serial (no otadata entry). */
static uint32_t running_ota_state(void)
{
    esp_ota_img_states_t state;
    const esp_partition_t *running = esp_ota_get_running_partition();
    if (running == NULL || esp_ota_get_state_partition(running, &state) != ESP_OK) {
        return COLIBRI_OTA_IMG_UNDEFINED;
    }
    return (uint32_t)state;
}

static void settle_update(uint32_t state, int selftest_status)
{
    switch (colibri_ota_action(state, selftest_status)) {
    case COLIBRI_OTA_CONFIRM:
        if (esp_ota_mark_app_valid_cancel_rollback() != ESP_OK) {
            colibri_report_error(COLIBRI_ERR_SELFTEST, "this update passed its self-test but could not confirm itself");
        }
        break;
    case COLIBRI_OTA_ROLL_BACK:
        colibri_report_error(COLIBRI_ERR_SELFTEST, "this update failed its self-test: going back to the previous app");
        esp_ota_mark_app_invalid_rollback_and_reboot(); /* returns only when there is no app to go back to */
        esp_restart(); /* then the bootloader aborts this unconfirmed app and starts the first slot */
        break;
    case COLIBRI_OTA_KEEP:
        break;
    }
}

void app_main(void)
{
    static char line[REQUEST_LINE_BYTES];
    static uint8_t chunk[READ_CHUNK];

    uart_ready = uart_driver_install(UART_PORT, COLIBRI_IDF_UART_RX_BUFFER, 0, 0, NULL, 0) == ESP_OK;
    /* Load before saying hello: the host sends its request when it sees the hello. */
    load_weights();
    colibri_hello();
    if (!uart_ready) {
        colibri_report_error(COLIBRI_ERR_REQUEST, "cannot install the UART driver: no requests can be read");
        for (;;) {
            vTaskDelay(portMAX_DELAY);
        }
    }
    uint32_t ota_state = running_ota_state();
    int selftest_status = ota_state == COLIBRI_OTA_IMG_PENDING_VERIFY ? colibri_selftest(load_status, load_message, 0)
                                                                      : colibri_boot_selftest(load_status, load_message);
    settle_update(ota_state, selftest_status);
    if (load_status != COLIBRI_OK) {
        colibri_report_error(load_status, load_message);
    }

    int len = 0;
    int received = 0; /* bytes of the current line, kept or not: what colibri_acknowledge counts */
    int too_long = 0;
    int64_t idle_since = esp_timer_get_time();
    for (;;) {
        int n = uart_read_bytes(UART_PORT, chunk, READ_CHUNK, pdMS_TO_TICKS(READ_WAIT_MS));
        if (n <= 0) {
            int64_t now = esp_timer_get_time();
            if (len == 0 && !too_long && now - idle_since >= (int64_t)COLIBRI_IDF_IDLE_HELLO_MS * 1000) {
                colibri_hello();
                idle_since = now;
            }
            continue;
        }
        for (int i = 0; i < n; i++) {
            char c = (char)chunk[i];
            if (!too_long && colibri_request_restarts(line, len, c)) {
                len = received = colibri_restart_line(line); /* a cut line, then a whole request: that one */
            }
            if (c != '\n') {
                colibri_acknowledge(++received); /* the host sends the next piece of a request only then */
            } else {
                received = 0;
            }
            if (too_long) { /* drop the rest of an over-long line, then say so */
                if (c == '\n') {
                    too_long = 0;
                    colibri_report_error(COLIBRI_ERR_REQUEST, "request line longer than this firmware's context allows");
                }
                continue;
            }
            if (len == REQUEST_LINE_BYTES) {
                len = 0;
                too_long = (c != '\n');
                if (!too_long) {
                    colibri_report_error(COLIBRI_ERR_REQUEST, "request line longer than this firmware's context allows");
                }
                continue;
            }
            line[len++] = c;
            if (c == '\n') {
                colibri_serve_line(line, len, load_status, load_message);
                len = 0;
            }
        }
        idle_since = esp_timer_get_time();
    }
}
