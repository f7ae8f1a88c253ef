/* The GNU build-id note (NT_GNU_BUILD_ID) a linker writes with --build-id. */
#ifndef COLIBRI_BUILD_ID_H
#define COLIBRI_BUILD_ID_H

#include <stddef.h>
#include <stdint.h>

/* `note` points at an ELF note (namesz, descsz, type, "GNU\0", descriptor); returns the
 * descriptor's length and points *id at it, or 0 if it is not a GNU build-id note. */
size_t colibri_build_id_from_note(const uint8_t *note, size_t available, const uint8_t **id);

#endif
