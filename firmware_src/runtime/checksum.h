/* CRC-32 (IEEE 802.3, as zlib) for image and frame integrity; SHA-256 for identities. */
#ifndef COLIBRI_CHECKSUM_H
#define COLIBRI_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32_update(uint32_t crc, const uint8_t *data, size_t len); /* start with crc = 0 */

typedef struct {
    uint32_t state[8];
    uint64_t length;
    uint8_t block[64];
    uint32_t used;
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const uint8_t *data, size_t len);
void sha256_final(Sha256 *s, uint8_t digest[32]);

#endif
