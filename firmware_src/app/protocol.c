#include "protocol.h"

#include <string.h>

#include "../runtime/checksum.h"
#include "../runtime/decimal.h"
#include "bsp.h"

#define LINE_CAPACITY 2048 /* an experts frame lists one count per expert */

static char line[LINE_CAPACITY];
static int line_len;
static int line_overflow; /* the frame being built did not fit: it is never sent cut short */
static uint64_t next_seq;

static void put_char(char c)
{
    /* Room is kept for the " *xxxxxxxx\n" trailer. */
    if (line_len < LINE_CAPACITY - 12) {
        line[line_len++] = c;
    } else {
        line_overflow = 1;
    }
}

static void put_text(const char *s)
{
    while (*s) {
        put_char(*s++);
    }
}

static void put_u64(uint64_t v)
{
    char text[DECIMAL_U64_BYTES];
    decimal_u64(text, v);
    put_text(text);
}

static const char hex_digits[] = "0123456789abcdef";


/* " key=": how every field of a frame starts. */
static void put_key(const char *key)
{
    put_char(' ');
    put_text(key);
    put_char('=');
}

/* A float as the 8 hex digits of its bits: the bits themselves, nothing lost in a decimal. */
static void put_f32_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    for (int shift = 28; shift >= 0; shift -= 4) {
        put_char(hex_digits[(bits >> shift) & 15]);
    }
}

void proto_begin(const char *kind)
{
    line_len = 0;
    line_overflow = 0;
    put_text("@CLB ");
    put_u64(next_seq);
    put_char(' ');
    put_text(kind);
}

void proto_u64(const char *key, uint64_t value)
{
    put_key(key);
    put_u64(value);
}

void proto_i64(const char *key, int64_t value)
{
    put_key(key);
    if (value < 0) {
        put_char('-');
        put_u64((uint64_t)0 - (uint64_t)value);
    } else {
        put_u64((uint64_t)value);
    }
}

void proto_str(const char *key, const char *value)
{
    put_key(key);
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        if (*p <= ' ' || *p >= 0x7f || *p == '%' || *p == '*' || *p == '=') {
            put_char('%');
            put_char(hex_digits[*p >> 4]);
            put_char(hex_digits[*p & 15]);
        } else {
            put_char((char)*p);
        }
    }
}

void proto_f32(const char *key, float value)
{
    put_key(key);
    put_f32_bits(value);
}

void proto_hex(const char *key, const uint8_t *bytes, int n)
{
    put_key(key);
    for (int i = 0; i < n; i++) {
        put_char(hex_digits[bytes[i] >> 4]);
        put_char(hex_digits[bytes[i] & 15]);
    }
}

void proto_experts(int layer, const int32_t *counts, int n)
{
    /* At most PROTO_EXPERTS_PER_FRAME counts (10 digits and a comma each) per frame: a model with
     * hundreds of experts sends several frames for one layer, each saying where its part starts. */
    for (int first = 0; first < n; first += PROTO_EXPERTS_PER_FRAME) {
        const int count = n - first < PROTO_EXPERTS_PER_FRAME ? n - first : PROTO_EXPERTS_PER_FRAME;
        proto_begin("experts");
        proto_u64("layer", (uint64_t)layer);
        proto_u64("first", (uint64_t)first);
        proto_u64("of", (uint64_t)n);
        proto_u32_list("counts", counts + first, count);
        proto_end();
    }
}

void proto_f32_list(const char *key, const float *values, int n)
{
    put_key(key);
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            put_char(',');
        }
        put_f32_bits(values[i]);
    }
}

void proto_u32_list(const char *key, const int32_t *values, int n)
{
    put_key(key);
    for (int i = 0; i < n; i++) {
        if (i > 0) {
            put_char(',');
        }
        put_u64((uint64_t)(uint32_t)values[i]);
    }
}

void proto_end(void)
{
    if (line_overflow) {
        /* A frame with a valid CRC over a shortened line would be believed: say what happened. */
        proto_begin("error");
        proto_u64("code", PROTO_ERR_FRAME_TOO_LONG);
        proto_str("msg", "a result frame did not fit the firmware's line buffer");
    }
    uint32_t crc = crc32_update(0, (const uint8_t *)line, (size_t)line_len);
    line[line_len++] = ' ';
    line[line_len++] = '*';
    for (int i = 7; i >= 0; i--) {
        line[line_len++] = hex_digits[(crc >> (4 * i)) & 15];
    }
    line[line_len++] = '\n';
    bsp_write(line, (size_t)line_len);
    next_seq++;
}
