#include "mcu.h"

#include "decode.h"
#include "model_def.h"

void colibri_report_trap(uint32_t cause, uint32_t pc, uint32_t value)
{
    static const char hex[] = "0123456789abcdef";
    char msg[] = "cpu trap: mcause ******** mepc ******** mtval ********";
    const uint32_t fields[3] = {cause, pc, value};
    const int at[3] = {17, 31, 46}; /* where each field's 8 digits go in msg */
    for (int f = 0; f < 3; f++) {
        for (int i = 0; i < 8; i++) {
            msg[at[f] + i] = hex[(fields[f] >> (28 - 4 * i)) & 15];
        }
    }
    colibri_report_error(200, msg);
}

/* Longest request line: every prompt id as up to 10 digits and a comma, plus the other fields. */
#define REQUEST_LINE_BYTES (COLIBRI_N_CTX * 11 + 256)

int colibri_serve(int (*read_byte)(void), int forever)
{
    static char line[REQUEST_LINE_BYTES];
    static int32_t prompt[COLIBRI_N_CTX];
    ColibriRequest req;
    int len = 0;
    for (;;) {
        int c = read_byte();
        if (len < REQUEST_LINE_BYTES) {
            line[len++] = (char)c;
        }
        if (c != '\n') {
            continue;
        }
        if (len < REQUEST_LINE_BYTES && colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX)) {
            int status = colibri_decode(&req);
            if (!forever) {
                return status;
            }
        }
        len = 0;
    }
}
