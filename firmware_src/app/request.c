/* The request frame a host sends to an MCU board after its hello (Linux boards take argv instead):
 *
 *   @CLB <seq> request prompt=1,2,3 steps=N temperature=XXXXXXXX top_k=K top_p=XXXXXXXX
 *        min_p=XXXXXXXX seed=S eos=0|1 [digests=0|1] *<crc32>
 *
 * Floats travel as the 8 hex digits of their IEEE-754 bits, so both sides hold the same value. */
#include <string.h>

#include "../runtime/checksum.h"
#include "decode.h"

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Parse an unsigned decimal at *p (advancing it); 0 on no digits or overflow past `max`. */
static int parse_dec(const char **p, const char *end, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = *p;
    while (s < end && *s >= '0' && *s <= '9') {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (max - d) / 10) {
            return 0;
        }
        v = v * 10 + d;
        s++;
    }
    if (s == *p) {
        return 0;
    }
    *p = s;
    *out = v;
    return 1;
}

static int parse_f32_bits(const char *s, const char *end, float *out)
{
    uint32_t bits = 0;
    if (end - s != 8) {
        return 0;
    }
    for (int i = 0; i < 8; i++) {
        int d = hex_digit(s[i]);
        if (d < 0) {
            return 0;
        }
        bits = bits << 4 | (uint32_t)d;
    }
    memcpy(out, &bits, sizeof *out);
    return 1;
}

static int key_is(const char *key, const char *key_end, const char *name)
{
    size_t n = strlen(name);
    return (size_t)(key_end - key) == n && memcmp(key, name, n) == 0;
}

int colibri_parse_request(const char *line, int len, ColibriRequest *req, int32_t *prompt_buf, int32_t capacity)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
        len--;
    }
    /* "@CLB " ... " *xxxxxxxx" */
    if (len < 16 || memcmp(line, "@CLB ", 5) != 0 || line[len - 10] != ' ' || line[len - 9] != '*') {
        return 0;
    }
    uint32_t want = 0;
    for (int i = len - 8; i < len; i++) {
        int d = hex_digit(line[i]);
        if (d < 0) {
            return 0;
        }
        want = want << 4 | (uint32_t)d;
    }
    const char *end = line + len - 10;
    if (crc32_update(0, (const uint8_t *)line, (size_t)(end - line)) != want) {
        return 0;
    }
    const char *p = line + 5;
    uint64_t seq;
    if (!parse_dec(&p, end, UINT32_MAX, &seq) || end - p < 8 || memcmp(p, " request", 8) != 0) {
        return 0;
    }
    p += 8;
    ColibriRequest r = {prompt_buf, 0, 0, {0.0f, 0, 1.0f, 0.0f, 0}, 1, 1};
    int have_prompt = 0, have_steps = 0;
    while (p < end) {
        if (*p != ' ') {
            return 0;
        }
        const char *key = ++p;
        while (p < end && *p != '=') {
            p++;
        }
        if (p == end) {
            return 0;
        }
        const char *key_end = p++;
        const char *val = p;
        while (p < end && *p != ' ') {
            p++;
        }
        const char *val_end = p;
        uint64_t v;
        const char *q = val;
        if (key_is(key, key_end, "prompt")) {
            while (q < val_end) {
                if (r.n_prompt == capacity || !parse_dec(&q, val_end, INT32_MAX, &v)) {
                    return 0;
                }
                prompt_buf[r.n_prompt++] = (int32_t)v;
                if (q < val_end && *q++ != ',') {
                    return 0;
                }
            }
            have_prompt = r.n_prompt > 0;
        } else if (key_is(key, key_end, "steps")) {
            if (!parse_dec(&q, val_end, INT32_MAX, &v) || q != val_end) {
                return 0;
            }
            r.n_steps = (int32_t)v;
            have_steps = 1;
        } else if (key_is(key, key_end, "top_k")) {
            if (!parse_dec(&q, val_end, INT32_MAX, &v) || q != val_end) {
                return 0;
            }
            r.sampling.top_k = (int32_t)v;
        } else if (key_is(key, key_end, "seed")) {
            if (!parse_dec(&q, val_end, UINT64_MAX, &v) || q != val_end) {
                return 0;
            }
            r.sampling.seed = v;
        } else if (key_is(key, key_end, "eos")) {
            if (!parse_dec(&q, val_end, 1, &v) || q != val_end) {
                return 0;
            }
            r.stop_at_eos = (int)v;
        } else if (key_is(key, key_end, "digests")) {
            if (!parse_dec(&q, val_end, 1, &v) || q != val_end) {
                return 0;
            }
            r.digests = (int)v;
        } else if (key_is(key, key_end, "temperature")) {
            if (!parse_f32_bits(val, val_end, &r.sampling.temperature)) {
                return 0;
            }
        } else if (key_is(key, key_end, "top_p")) {
            if (!parse_f32_bits(val, val_end, &r.sampling.top_p)) {
                return 0;
            }
        } else if (key_is(key, key_end, "min_p")) {
            if (!parse_f32_bits(val, val_end, &r.sampling.min_p)) {
                return 0;
            }
        } else {
            return 0;
        }
    }
    if (!have_prompt || !have_steps) {
        return 0;
    }
    *req = r;
    return 1;
}
