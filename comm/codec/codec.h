/*
 * comm/codec/codec.h — the codecs on host memory, outside any world: code
 * and decode one message (comm/codec/codec.c). For tests, echo-bench codec
 * and tools that study a codec's wire form; the all-reduce itself needs
 * none of this (comm/echo.h). Wire forms in docs/echo.md §2. Functions
 * that can fail return 0 or -1 with a message in err.
 */
#ifndef ECHO_COMM_CODEC_CODEC_H
#define ECHO_COMM_CODEC_CODEC_H

#include <stddef.h>

#include "comm/echo.h"

/* Bytes of the int4 codec's wire form of `count` values in groups of `group`. */
size_t echo_codec_wire_bytes(size_t count, int group);
/* The int4 codec: wire = code(x (+ *res)); with res, res = that - decode
 * (error feedback). -1 if a value is not finite or |y| >= 2^127. */
int echo_codec_encode(const float *x, float *res, size_t count, int group, void *wire, char *err, size_t errlen);
/* out = decode(wire) (accumulate = 0) or out += decode(wire). */
void echo_codec_decode(const void *wire, size_t count, int group, float *out, int accumulate);
/* The decoded scale of group g of a wire form (NaN for a poisoned group). */
float echo_codec_group_scale(const void *wire, size_t count, int group, size_t g);
/* The same for any 4-bit codec of the table, rotating ones keeping res in
 * the rotated basis. -1 for an unknown or exact codec, a bad group, out of
 * memory, or a value the codec cannot code. */
int echo_codec_encode_as(echo_codec_id id, const float *x, float *res, size_t count, int group, void *wire, char *err,
                         size_t errlen);
int echo_codec_decode_as(echo_codec_id id, const void *wire, size_t count, int group, float *out, int accumulate,
                         char *err, size_t errlen);
/* Which host codec loops this process runs: "avx512", "avx2" or "scalar"
 * (the CPU's best, capped by the environment variable ECHO_CODEC_ISA =
 * scalar or avx2; docs/echo.md §8). */
const char *echo_codec_host_isa(void);

#endif
