/*
 * tests/comm_preset.h — a world configuration from a preset, in the
 * argument order the comm/ tests list their cases in (comm/echo.h,
 * echo_preset_config), without the preset's tail policy. An unknown preset
 * gives a codec every world refuses.
 */
#ifndef ECHO_TESTS_COMM_PRESET_H
#define ECHO_TESTS_COMM_PRESET_H

#include "comm/echo.h"

static inline echo_config test_echo_cfg(echo_preset p, int group, size_t min_bytes, int n_sites, size_t max_count,
                                        int deferred, echo_codec_id codec) {
    echo_config c = {.min_bytes = min_bytes, .n_sites = n_sites, .max_count = max_count, .deferred = deferred};
    if (echo_preset_config(p, codec, group, &c)) c.codec = ECHO_CODEC_COUNT;
    /* the codec's own calls: a preset's tail policy (the last calls of a
     * pass in bf16) has its own tests (test_comm's test_tail_policy) */
    c.tail_sites = 0;
    return c;
}

#endif
