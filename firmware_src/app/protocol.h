/* The framed result protocol (generator/device/protocol.py reads it):
 *
 *   @CLB <seq> <kind> <key>=<value> ... *<crc32>\n
 *
 * seq counts frames from 0 since reset; kind is hello, bandwidth (Linux boards, when asked), score (when
 * asked), token, stats, experts, selftest, checkpoint, done, error or ack; values contain no spaces (strings are percent-encoded); crc32 is 8 lowercase hex
 * digits of the CRC-32 of every byte from '@' up to the space before '*'. Anything else is not a frame. */
#ifndef COLIBRI_PROTOCOL_H
#define COLIBRI_PROTOCOL_H

#include <stdint.h>

#define PROTO_VERSION 7 /* 2: the board acknowledges each PROTO_ACK_BYTES of a request it reads;
                         * 3: requests may continue a conversation (start) and score a prompt (score
                         * frames); stats carry how a Linux board holds the weights and its expert
                         * cache's counters; a storage frame;
                         * 4: requests may decode the prompt's tail one token per forward pass
                         * (decode_from: teacher forcing, bench's text stream);
                         * 5: a selftest request and the selftest frame (app/selftest.c);
                         * 6: token and score frames carry nonfinite=LAYER|head when the logits hold
                         * a NaN or an infinity, and the request ends there (an error frame);
                         * 7: a request may ask for the checkpoints of one step's forward pass
                         * (trace=STEP: checkpoint frames, runtime/checkpoint.h) */
#define PROTO_ACK_BYTES 64 /* half the ESP32-P4's 128-byte UART receive FIFO */
#define PROTO_ERR_FRAME_TOO_LONG 101 /* a frame that did not fit is replaced by this error, never cut */
#define PROTO_EXPERTS_PER_FRAME 128 /* expert counts per experts frame (a layer may take several) */

void proto_begin(const char *kind);
void proto_u64(const char *key, uint64_t value);
void proto_i64(const char *key, int64_t value);
void proto_str(const char *key, const char *value);
void proto_hex(const char *key, const uint8_t *bytes, int n);
void proto_f32(const char *key, float value); /* the 8 hex digits of its IEEE-754 bits */
void proto_u32_list(const char *key, const int32_t *values, int n); /* comma-separated */
void proto_f32_list(const char *key, const float *values, int n);   /* proto_f32's digits, comma-separated */
/* The experts frames of one MoE layer: layer=L first=F of=N counts=c_F,... (N counts in all). */
void proto_experts(int layer, const int32_t *counts, int n);
void proto_end(void);

#endif
