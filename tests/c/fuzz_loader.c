/* libFuzzer target: any bytes, as a weight image, in a buffer of exactly their size, opened checking
 * every tensor (MCU boards) and checking the resident ones, then each routed expert as bringing it in
 * does (a mapped image on a Linux board). Built with
 * FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which makes the loader skip the CRC comparison so the
 * fuzzer reaches the checks behind it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image_loader.h"
#include "tensor_table.h"

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
    if (colibri_image_open_checking(buf, size, &weights, COLIBRI_CHECK_RESIDENT) == COLIBRI_OK) {
        for (uint32_t i = 0; i < COLIBRI_IMAGE_TENSOR_COUNT; i++) {
            if (colibri_tensor_is_expert(i)) {
                colibri_image_check_tensor(buf, i);
            }
        }
    }
    free(buf);
    return 0;
}
