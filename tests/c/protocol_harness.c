/* Test harness for the firmware's side of the result protocol (firmware_src/app/protocol.c): writes
 * to stdout the frames the tests ask for, so Python reads them with the host's own reader.
 *
 *   protocol_harness experts N      one MoE layer's N expert counts (count i = i * 7)
 *   protocol_harness long BYTES     a hello frame whose one string field is BYTES long
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bsp.h"
#include "protocol.h"

void bsp_write(const char *data, size_t len)
{
    fwrite(data, 1, len, stdout);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        return 2;
    }
    int n = atoi(argv[2]);
    if (strcmp(argv[1], "experts") == 0) {
        int32_t *counts = malloc((size_t)n * sizeof *counts);
        for (int i = 0; i < n; i++) {
            counts[i] = i * 7;
        }
        proto_experts(3, counts, n);
        free(counts);
    } else {
        char *text = malloc((size_t)n + 1);
        memset(text, 'a', (size_t)n);
        text[n] = '\0';
        proto_begin("hello");
        proto_str("note", text);
        proto_end();
        free(text);
    }
    proto_begin("done");
    proto_u64("tokens", 0);
    proto_end();
    return 0;
}
