#include "mcu.h"

#include <string.h>

#include "../runtime/image_loader.h"
#include "protocol.h"
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

#define REQUEST_LINE_BYTES COLIBRI_REQUEST_LINE_BYTES(COLIBRI_N_CTX)

int colibri_serve_line(const char *line, int len, int load_status, const char *load_message)
{
    static int32_t prompt[COLIBRI_N_CTX];
    ColibriRequest req;
    if (len < 5 || memcmp(line, "@CLB ", 5) != 0) {
        return -1; /* a stray newline or noise: not addressed to the firmware */
    }
    const char *problem = colibri_parse_request(line, len, &req, prompt, COLIBRI_N_CTX);
    if (problem == NULL && req.threads != 1) {
        problem = "this board runs one thread";
    }
    if (problem == NULL && req.probe_mib >= 0) {
        problem = "this board has no read-bandwidth probe";
    }
    if (problem != NULL) {
        colibri_report_error(COLIBRI_ERR_REQUEST, problem);
        return COLIBRI_ERR_REQUEST;
    }
    if (load_status != 0) {
        colibri_report_error(load_status, load_message != NULL ? load_message : colibri_status_message(load_status));
        return load_status;
    }
    return colibri_decode(&req);
}

int colibri_request_restarts(const char *line, int len, char c)
{
    return c == ' ' && len > 4 && memcmp(line + len - 4, "@CLB", 4) == 0;
}

int colibri_restart_line(char *line)
{
    memcpy(line, "@CLB", 4);
    return 4;
}

void colibri_acknowledge(int received)
{
    if (received > 0 && received % PROTO_ACK_BYTES == 0) {
        proto_begin("ack");
        proto_u64("bytes", (uint64_t)received);
        proto_end();
    }
}

int colibri_serve(int (*read_byte)(void), int forever, int load_status)
{
    static char line[REQUEST_LINE_BYTES];
    int len = 0, received = 0, too_long = 0;
    for (;;) {
        int c = read_byte();
        if (c != '\n') {
            if (len <= REQUEST_LINE_BYTES && colibri_request_restarts(line, len, (char)c)) {
                len = received = colibri_restart_line(line); /* acknowledged from the new frame's start */
                too_long = 0;
            }
            if (len < REQUEST_LINE_BYTES) {
                line[len++] = (char)c;
            } else {
                too_long = 1; /* the rest is read (and acknowledged) but not kept */
            }
            colibri_acknowledge(++received);
            continue;
        }
        int status = -1;
        if (too_long) {
            colibri_report_error(COLIBRI_ERR_REQUEST, "request line longer than this firmware's context allows");
        } else {
            status = colibri_serve_line(line, len, load_status, NULL);
        }
        len = received = too_long = 0;
        if (status == 0 && !forever) {
            return status;
        }
    }
}
