#include "build_id.h"

#include <string.h>

size_t colibri_build_id_from_note(const uint8_t *note, size_t available, const uint8_t **id)
{
    uint32_t namesz, descsz, type;
    if (note == NULL || available < 16) {
        return 0;
    }
    memcpy(&namesz, note, 4);
    memcpy(&descsz, note + 4, 4);
    memcpy(&type, note + 8, 4);
    if (namesz != 4 || type != 3 /* NT_GNU_BUILD_ID */ || memcmp(note + 12, "GNU", 4) != 0 || descsz == 0 ||
        descsz > 64 || descsz > available - 16) {
        return 0;
    }
    *id = note + 16;
    return descsz;
}
