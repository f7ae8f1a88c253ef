#include "ota_state.h"

#include <string.h>

#include "../runtime/checksum.h"

#define LABEL_AT 4
#define STATE_AT 24
#define CRC_AT 28

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

uint32_t colibri_ota_crc(uint32_t seq)
{
    uint8_t bytes[4];
    wr_u32(bytes, seq);
    /* esp_rom_crc32_le(UINT32_MAX, ...) is zlib's CRC-32 continued from 0xFFFFFFFF. */
    return crc32_update(0xFFFFFFFFu, bytes, 4);
}

void colibri_ota_read_entry(const uint8_t *otadata, int index, ColibriOtaEntry *entry)
{
    const uint8_t *p = otadata + (uint32_t)index * COLIBRI_OTA_SECTOR_BYTES;
    entry->seq = rd_u32(p);
    memcpy(entry->label, p + LABEL_AT, sizeof entry->label);
    entry->state = rd_u32(p + STATE_AT);
    entry->crc = rd_u32(p + CRC_AT);
}

void colibri_ota_write_entry(uint8_t *otadata, int index, ColibriOtaEntry *entry)
{
    uint8_t *p = otadata + (uint32_t)index * COLIBRI_OTA_SECTOR_BYTES;
    entry->crc = colibri_ota_crc(entry->seq);
    memset(p, 0xFF, COLIBRI_OTA_SECTOR_BYTES);
    wr_u32(p, entry->seq);
    memcpy(p + LABEL_AT, entry->label, sizeof entry->label);
    wr_u32(p + STATE_AT, entry->state);
    wr_u32(p + CRC_AT, entry->crc);
}

int colibri_ota_entry_valid(const ColibriOtaEntry *entry)
{
    return entry->seq != 0xFFFFFFFFu && entry->state != COLIBRI_OTA_IMG_INVALID &&
           entry->state != COLIBRI_OTA_IMG_ABORTED && entry->crc == colibri_ota_crc(entry->seq);
}

int colibri_ota_active_entry(const uint8_t *otadata)
{
    ColibriOtaEntry e[2];
    colibri_ota_read_entry(otadata, 0, &e[0]);
    colibri_ota_read_entry(otadata, 1, &e[1]);
    int v0 = colibri_ota_entry_valid(&e[0]), v1 = colibri_ota_entry_valid(&e[1]);
    if (v0 && v1) {
        return e[1].seq > e[0].seq ? 1 : 0;
    }
    return v0 ? 0 : v1 ? 1 : -1;
}

int colibri_ota_selected_slot(const uint8_t *otadata, int slots)
{
    int active = colibri_ota_active_entry(otadata);
    if (active < 0 || slots <= 0) {
        return -1;
    }
    ColibriOtaEntry e;
    colibri_ota_read_entry(otadata, active, &e);
    return (int)((e.seq - 1u) % (uint32_t)slots);
}

int colibri_ota_boot(uint8_t *otadata, int slots)
{
    for (int i = 0; i < 2; i++) {
        ColibriOtaEntry e;
        colibri_ota_read_entry(otadata, i, &e);
        if (e.state == COLIBRI_OTA_IMG_PENDING_VERIFY) {
            e.state = COLIBRI_OTA_IMG_ABORTED;
            colibri_ota_write_entry(otadata, i, &e);
        }
    }
    int active = colibri_ota_active_entry(otadata);
    if (active < 0 || slots <= 0) {
        return 0; /* blank or spoiled otadata: the first OTA slot */
    }
    ColibriOtaEntry e;
    colibri_ota_read_entry(otadata, active, &e);
    if (e.state == COLIBRI_OTA_IMG_NEW) {
        e.state = COLIBRI_OTA_IMG_PENDING_VERIFY;
        colibri_ota_write_entry(otadata, active, &e);
    }
    return (int)((e.seq - 1u) % (uint32_t)slots);
}

int colibri_ota_select(uint8_t *otadata, int slot, int slots)
{
    if (slots <= 0 || slot < 0 || slot >= slots) {
        return -1;
    }
    uint32_t n = (uint32_t)slots, first = ((uint32_t)slot + 1u) % n;
    int active = colibri_ota_active_entry(otadata);
    int next = active < 0 ? 0 : active ^ 1;
    ColibriOtaEntry e;
    colibri_ota_read_entry(otadata, next, &e);
    if (active < 0) {
        e.seq = (uint32_t)slot + 1u;
    } else {
        ColibriOtaEntry current;
        colibri_ota_read_entry(otadata, active, &current);
        uint32_t i = 0;
        while (current.seq > first + i * n) { /* the smallest seq >= the active one that selects slot */
            i++;
        }
        e.seq = first + i * n;
    }
    e.state = COLIBRI_OTA_IMG_NEW;
    colibri_ota_write_entry(otadata, next, &e);
    return next;
}

uint32_t colibri_ota_slot_state(const uint8_t *otadata, int slot, int slots)
{
    uint32_t state = COLIBRI_OTA_IMG_UNDEFINED, best = 0;
    int found = 0;
    for (int i = 0; i < 2 && slots > 0; i++) {
        ColibriOtaEntry e;
        colibri_ota_read_entry(otadata, i, &e);
        if (e.seq != 0xFFFFFFFFu && e.crc == colibri_ota_crc(e.seq) && (int)((e.seq - 1u) % (uint32_t)slots) == slot &&
            (!found || e.seq > best)) {
            state = e.state;
            best = e.seq;
            found = 1;
        }
    }
    return state;
}

ColibriOtaAction colibri_ota_action(uint32_t state, int selftest_status)
{
    if (state != COLIBRI_OTA_IMG_PENDING_VERIFY) {
        return COLIBRI_OTA_KEEP;
    }
    return selftest_status == 0 ? COLIBRI_OTA_CONFIRM : COLIBRI_OTA_ROLL_BACK;
}

int colibri_ota_apply(uint8_t *otadata, ColibriOtaAction action)
{
    int active = colibri_ota_active_entry(otadata);
    if (action == COLIBRI_OTA_KEEP || active < 0) {
        return action == COLIBRI_OTA_KEEP;
    }
    ColibriOtaEntry e, other;
    colibri_ota_read_entry(otadata, active, &e);
    colibri_ota_read_entry(otadata, active ^ 1, &other);
    if (action == COLIBRI_OTA_ROLL_BACK && !colibri_ota_entry_valid(&other)) {
        return 0;
    }
    e.state = action == COLIBRI_OTA_CONFIRM ? COLIBRI_OTA_IMG_VALID : COLIBRI_OTA_IMG_INVALID;
    colibri_ota_write_entry(otadata, active, &e);
    return 1;
}
