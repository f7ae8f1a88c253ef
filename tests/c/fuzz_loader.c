/* libFuzzer target: any bytes, as a weight image, in a buffer of exactly their size. Built with
 * FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which makes the loader skip the CRC comparison so the
 * fuzzer reaches the checks behind it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image_loader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ColibriWeights weights;
    void *buf = NULL;
    if (size == 0) {
        colibri_image_open(NULL, 0, &weights);
        return 0;
    }
    if (posix_memalign(&buf, 64, size) != 0) {
        return 0;
    }
    memcpy(buf, data, size);
    colibri_image_open(buf, size, &weights);
    free(buf);
    return 0;
}
