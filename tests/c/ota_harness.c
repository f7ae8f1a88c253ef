/* The A/B update logic (app/ota_state.c) on a simulated otadata partition: updates that pass their
 * self-test, fail it, or lose power before deciding, each followed by the boots the bootloader would
 * make. Built for the host and for qemu-rv32 (semihosting output, then the SiFive test device ends
 * the emulator); tests/boards/test_ota_state.py reads the lines:
 *   crc <seq> <crc>                      bootloader_common_ota_select_crc
 *   <scenario> <step> slot <n> state <s> after each boot: the slot started and its otadata state
 *   <scenario> <step> action <a> [refused]
 *   <scenario> otadata <hex of both entries>
 *   done */
#include <stdio.h>
#include <string.h>

#include "ota_state.h"

#define SLOTS 2

static uint8_t otadata[COLIBRI_OTADATA_BYTES];
static const char *scenario;

static const char *state_name(uint32_t s)
{
    switch (s) {
    case COLIBRI_OTA_IMG_NEW: return "new";
    case COLIBRI_OTA_IMG_PENDING_VERIFY: return "pending";
    case COLIBRI_OTA_IMG_VALID: return "valid";
    case COLIBRI_OTA_IMG_INVALID: return "invalid";
    case COLIBRI_OTA_IMG_ABORTED: return "aborted";
    case COLIBRI_OTA_IMG_UNDEFINED: return "undefined";
    default: return "other";
    }
}

static uint32_t boot(const char *step)
{
    int slot = colibri_ota_boot(otadata, SLOTS);
    uint32_t state = colibri_ota_slot_state(otadata, slot, SLOTS);
    printf("%s %s slot %d state %s\n", scenario, step, slot, state_name(state));
    return state;
}

/* The app after its self-test (0: PASS): the decision, and what it writes. */
static void decide(const char *step, uint32_t state, int selftest_status)
{
    static const char *names[] = {"keep", "confirm", "roll-back"};
    ColibriOtaAction a = colibri_ota_action(state, selftest_status);
    int done = colibri_ota_apply(otadata, a);
    printf("%s %s action %s%s\n", scenario, step, names[a], done ? "" : " refused");
}

static void dump(void)
{
    printf("%s otadata ", scenario);
    for (int i = 0; i < 2; i++) {
        for (uint32_t b = 0; b < COLIBRI_OTA_ENTRY_BYTES; b++) {
            printf("%02x", otadata[i * COLIBRI_OTA_SECTOR_BYTES + b]);
        }
    }
    printf("\n");
}

int main(void)
{
    const uint32_t seqs[] = {1, 2, 3, 0x12345678u};
    for (int i = 0; i < 4; i++) {
        printf("crc %lu %08lx\n", (unsigned long)seqs[i], (unsigned long)colibri_ota_crc(seqs[i]));
    }

    /* A board flashed over serial: blank otadata, the first slot, no state to decide on. */
    scenario = "blank";
    memset(otadata, 0xFF, sizeof otadata);
    decide("boot", boot("boot"), 0);
    dump();

    /* An update to the other slot that passes its self-test, then one that fails it. */
    scenario = "pass";
    colibri_ota_select(otadata, 1, SLOTS);
    dump();
    decide("first-boot", boot("first-boot"), 0);
    boot("next-boot");
    dump();

    scenario = "fail";
    colibri_ota_select(otadata, 0, SLOTS);
    decide("first-boot", boot("first-boot"), 103);
    boot("after-rollback");
    dump();

    /* An update whose first boot never gets to decide (power lost, a hang, a watchdog). */
    scenario = "cut";
    colibri_ota_select(otadata, 0, SLOTS);
    boot("first-boot");
    boot("next-boot");
    dump();

    /* The first update of a serial-flashed board fails: no entry to roll back to, so the app
     * restarts, and the bootloader aborts the unconfirmed entry and starts the first slot again. */
    scenario = "first-fail";
    memset(otadata, 0xFF, sizeof otadata);
    colibri_ota_select(otadata, 1, SLOTS);
    decide("first-boot", boot("first-boot"), 103);
    boot("restart");
    dump();

    printf("done\n");
#if defined(__riscv) && !defined(__linux__)
    fflush(stdout);
    *(volatile uint32_t *)0x00100000u = 0x5555u; /* qemu virt's SiFive test device: power off, exit 0 */
#endif
    return 0;
}
