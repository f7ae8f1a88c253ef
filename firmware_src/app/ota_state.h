/* A/B app updates with rollback, as ESP-IDF's bootloader and esp_ota_ops keep them: the decision
 * logic, on a buffer holding the OTA data partition (otadata), with no ESP-IDF call in it. The
 * ESP-IDF BSP (bsp/esp32p4-idf) asks ESP-IDF for the running app's state and makes the esp_ota_*
 * call that colibri_ota_action names; tests run the same functions on a simulated otadata on the
 * host and on qemu-rv32.
 *
 * otadata is two 4 KiB flash sectors; each starts with one esp_ota_select_entry_t (32 bytes,
 * little-endian): ota_seq, seq_label[20], ota_state, crc, where crc = esp_rom_crc32_le(UINT32_MAX,
 * &ota_seq, 4) (bootloader_common_ota_select_crc). An entry is valid when its seq is not 0xFFFFFFFF,
 * its state is neither INVALID nor ABORTED and its crc matches; the valid entry with the highest
 * seq selects app slot (seq - 1) % slots; with no valid entry the bootloader starts slot 0. */
#ifndef COLIBRI_OTA_STATE_H
#define COLIBRI_OTA_STATE_H

#include <stdint.h>

#define COLIBRI_OTA_SECTOR_BYTES 0x1000u /* one entry per flash sector: a cut write spoils one copy at most */
#define COLIBRI_OTA_ENTRY_BYTES 32u
#define COLIBRI_OTADATA_BYTES (2u * COLIBRI_OTA_SECTOR_BYTES)

/* esp_ota_img_states_t */
enum {
    COLIBRI_OTA_IMG_NEW = 0,            /* written by an update, not booted yet */
    COLIBRI_OTA_IMG_PENDING_VERIFY = 1, /* booted once by the bootloader: the app must confirm it */
    COLIBRI_OTA_IMG_VALID = 2,
    COLIBRI_OTA_IMG_INVALID = 3,        /* the app refused itself (rollback) */
    COLIBRI_OTA_IMG_ABORTED = 4,        /* booted, never confirmed: the bootloader gave up on it */
};
#define COLIBRI_OTA_IMG_UNDEFINED 0xFFFFFFFFu /* no otadata entry (a slot flashed over serial) */

typedef struct {
    uint32_t seq;
    uint8_t label[20];
    uint32_t state;
    uint32_t crc;
} ColibriOtaEntry;

/* What the app does once its self-test has run. */
typedef enum {
    COLIBRI_OTA_KEEP = 0,      /* not a pending update: nothing to decide */
    COLIBRI_OTA_CONFIRM = 1,   /* esp_ota_mark_app_valid_cancel_rollback() */
    COLIBRI_OTA_ROLL_BACK = 2, /* esp_ota_mark_app_invalid_rollback_and_reboot() */
} ColibriOtaAction;

uint32_t colibri_ota_crc(uint32_t seq);

/* Entry index (0 or 1) of the otadata buffer (COLIBRI_OTADATA_BYTES). */
void colibri_ota_read_entry(const uint8_t *otadata, int index, ColibriOtaEntry *entry);
/* Erase the entry's sector (0xFF) and write the entry at its start, with its crc recomputed. */
void colibri_ota_write_entry(uint8_t *otadata, int index, ColibriOtaEntry *entry);

int colibri_ota_entry_valid(const ColibriOtaEntry *entry);
/* The valid entry with the highest seq (bootloader_common_get_active_otadata), or -1. */
int colibri_ota_active_entry(const uint8_t *otadata);
/* The slot the active entry selects, or -1 when there is none. */
int colibri_ota_selected_slot(const uint8_t *otadata, int slots);

/* The second-stage bootloader with CONFIG_BOOTLOADER_APP_ROLLBACK_ENABLE: every PENDING_VERIFY entry
 * becomes ABORTED (an update that booted and never confirmed itself), then the active entry picks
 * the slot (slot 0 when none is valid); a NEW one becomes PENDING_VERIFY. Returns the slot booted. */
int colibri_ota_boot(uint8_t *otadata, int slots);

/* esp_ota_set_boot_partition(slot) with rollback enabled: the entry that is not active gets the
 * next seq that selects `slot` and state NEW. Returns that entry's index, or -1 for a bad slot. */
int colibri_ota_select(uint8_t *otadata, int slot, int slots);

/* esp_ota_get_state_partition for the running slot: the state of the valid-crc entry that selects
 * it, or COLIBRI_OTA_IMG_UNDEFINED. */
uint32_t colibri_ota_slot_state(const uint8_t *otadata, int slot, int slots);

/* The decision: a PENDING_VERIFY app confirms itself when its self-test passed (selftest_status
 * 0) and rolls back otherwise; an app in any other state keeps running as it is. */
ColibriOtaAction colibri_ota_action(uint32_t state, int selftest_status);

/* What esp_ota_mark_app_valid_cancel_rollback / esp_ota_mark_app_invalid_rollback_and_reboot write:
 * the active entry becomes VALID or INVALID. Rolling back needs another valid entry to go back to:
 * returns 0 when there is none (ESP_ERR_OTA_ROLLBACK_FAILED: nothing is written), else 1. */
int colibri_ota_apply(uint8_t *otadata, ColibriOtaAction action);

#endif
