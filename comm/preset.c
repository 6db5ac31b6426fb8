/*
 * comm/preset.c — the two tables users name things from: the presets
 * (exact, echo, echo-nofb, bf16, int4, echo3: codec x feedback x tail) and the
 * codec table (wire form, bits, groups), with their parsers, name lists and
 * the one-line descriptions the start-up plan, /metrics and JSON print.
 * echo.c runs the all-reduce over what these rows say.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h"

/* ---- presets: the pairs users name ---- */

/* ECHO_CODEC_DEFAULT in a row: the 4-bit codec the caller chose. */
static const struct preset {
    const char *name;
    echo_codec_id codec;
    int feedback;
    int tail_sites; /* echo_config.tail_sites */
    echo_codec_id tail_codec;
} presets[ECHO_PRESET_COUNT] = {
    [ECHO_PRESET_EXACT] = {"exact", ECHO_CODEC_NONE, 0, 0, 0},
    [ECHO_PRESET_NOFB] = {"echo-nofb", ECHO_CODEC_DEFAULT, 0, 0, 0},
    /* the pass's last 2 calls (a transformer's last layer) in bf16: the
     * last call's error has no next call to take it back (docs/accuracy.md) */
    [ECHO_PRESET_ECHO] = {"echo", ECHO_CODEC_DEFAULT, 1, ECHO_TAIL_SITES, ECHO_CODEC_BF16},
    [ECHO_PRESET_BF16] = {"bf16", ECHO_CODEC_BF16, 0, 0, 0},
    [ECHO_PRESET_INT4] = {"int4", ECHO_CODEC_INT4, 0, 0, 0},
    /* 3.25 bits at G 256, its last call in bf16: 3.46 bits/value over a pass
     * of 60 calls (two tail calls would be 3.68; docs/accuracy.md) */
    [ECHO_PRESET_ECHO3] = {"echo3", ECHO_CODEC_HNF3, 1, ECHO3_TAIL_SITES, ECHO_CODEC_BF16},
};

int echo_preset_parse(const char *s, echo_preset *out) {
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        if (s && !strcmp(s, presets[k].name)) {
            *out = (echo_preset)k;
            return 0;
        }
    return -1;
}

const char *echo_names_join(char *buf, size_t len, const char *sep, const char *(*row)(int i)) {
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; row(i) && at < len; i++) {
        if (!*row(i)) continue;
        int k = snprintf(buf + at, len - at, "%s%s", at ? sep : "", row(i));
        at = k < 0 ? len : at + (size_t)k;
    }
    return buf;
}

static const char *preset_row(int k) {
    return k < ECHO_PRESET_COUNT ? presets[k].name : NULL;
}

const char *echo_preset_names(char *buf, size_t len, const char *sep) {
    return echo_names_join(buf, len, sep, preset_row);
}

const char *echo_preset_name(echo_preset p) {
    return (unsigned)p < ECHO_PRESET_COUNT ? presets[p].name : "unknown";
}

echo_codec_id echo_preset_codec(echo_preset p) {
    return (unsigned)p < ECHO_PRESET_COUNT ? presets[p].codec : ECHO_CODEC_DEFAULT;
}

int echo_preset_config(echo_preset p, echo_codec_id codec, int group, echo_config *cfg) {
    if ((unsigned)p >= ECHO_PRESET_COUNT) return -1;
    echo_codec_id fixed = presets[p].codec;
    const echo_codec_info *fi = echo_codec_get(fixed);
    /* int4 is the paper's codec: another codec without feedback is echo-nofb */
    if (fixed != ECHO_CODEC_DEFAULT && !fi->lossless && codec != ECHO_CODEC_DEFAULT && codec != fixed) return -1;
    cfg->codec = fixed == ECHO_CODEC_DEFAULT ? codec : fixed;
    cfg->feedback = presets[p].feedback;
    cfg->tail_sites = presets[p].tail_sites;
    cfg->tail_codec = presets[p].tail_codec;
    cfg->group_size = group ? group : echo_codec_default_group(fixed != ECHO_CODEC_DEFAULT && !fi->lossless ? fixed : codec);
    return 0;
}

void echo_preset_describe(echo_preset p, echo_codec_id codec, int group, char *buf, size_t len) {
    echo_config c = {0};
    if (echo_preset_config(p, codec, group, &c)) {
        snprintf(buf, len, "%s: not a valid preset and codec", echo_preset_name(p));
        return;
    }
    echo_config_describe(p, &c, buf, len);
}

void echo_config_describe(echo_preset p, const echo_config *cfg, char *buf, size_t len) {
    const echo_codec_info *ci = echo_codec_get(cfg->codec);
    if (!ci) {
        snprintf(buf, len, "%s: unknown codec", echo_preset_name(p));
        return;
    }
    int g = cfg->group_size ? cfg->group_size : echo_codec_default_group(cfg->codec);
    if (ci->lossless) {
        snprintf(buf, len, "%s: %s, %d bits/value", echo_preset_name(p), cfg->codec == ECHO_CODEC_NONE ? "fp32" : ci->name,
                 ci->code_bits);
        return;
    }
    int n = snprintf(buf, len, "%s: %s-g%d, %.3f bits/value, error feedback %s", echo_preset_name(p), ci->name, g,
                     echo_codec_bits(cfg->codec, g), cfg->feedback ? "on" : "off");
    int k = cfg->tail_sites;
    echo_codec_id tc = cfg->tail_codec;
    if (cfg->n_sites > 0) {
        char e[8];
        if (echo_config_tail(cfg, &k, &tc, e, sizeof e)) k = 0;
    }
    if (!k || n < 0 || (size_t)n >= len) return;
    if (cfg->n_sites > 0)
        snprintf(buf + n, len - (size_t)n, ", the last %d of %d calls of a pass %s: %.3f bits/value over a pass", k,
                 cfg->n_sites, tc == ECHO_CODEC_NONE ? "exact" : "bf16", echo_config_bits(cfg));
    else
        snprintf(buf + n, len - (size_t)n, ", the last %d calls of a pass %s", k, tc == ECHO_CODEC_NONE ? "exact" : "bf16");
}

int echo_config_tail(const echo_config *cfg, int *sites, echo_codec_id *codec, char *err, size_t errlen) {
    int k = cfg->tail_sites;
    echo_codec_id tc = cfg->tail_codec;
    const char *env = getenv("ECHO_TAIL");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        tc = ECHO_CODEC_BF16;
        if (end == env || v < 0 || v > 1 << 20 || (*end && strcmp(end, ":bf16") && strcmp(end, ":exact"))) {
            snprintf(err, errlen, "echo: ECHO_TAIL='%s' is not K, K:bf16 or K:exact", env);
            return -1;
        }
        if (!strcmp(end, ":exact")) tc = ECHO_CODEC_NONE;
        k = (int)v;
    }
    if (!(env && *env) && k > cfg->n_sites) k = cfg->n_sites; /* a preset's tail on a shorter pass */
    if (k < 0 || k > cfg->n_sites) {
        snprintf(err, errlen, "echo: tail of %d sites is outside [0, n_sites = %d]", k, cfg->n_sites);
        return -1;
    }
    if (k && tc != ECHO_CODEC_NONE && tc != ECHO_CODEC_BF16) {
        snprintf(err, errlen, "echo: the tail's codec must be exact (none) or bf16");
        return -1;
    }
    *sites = k;
    *codec = k ? tc : ECHO_CODEC_NONE;
    return 0;
}

double echo_config_bits(const echo_config *cfg) {
    const echo_codec_info *ci = echo_codec_get(cfg->codec);
    if (!ci) return 0;
    int g = cfg->group_size ? cfg->group_size : echo_codec_default_group(cfg->codec);
    double b = ci->lossless ? ci->code_bits : echo_codec_bits(cfg->codec, g);
    int k;
    echo_codec_id tc;
    char e[8];
    if (!b || ci->lossless || cfg->n_sites < 1 || echo_config_tail(cfg, &k, &tc, e, sizeof e) || !k) return b;
    return ((double)(cfg->n_sites - k) * b + (double)k * echo_codec_get(tc)->code_bits) / cfg->n_sites;
}

/* The preset that names a path: a lossless codec's own row, the row that
 * fixes this lossy codec with this feedback (int4), else the 4-bit row
 * with this feedback (echo, echo-nofb). */
echo_preset echo_priv_preset_of(echo_codec_id codec, int feedback) {
    int lossless = echo_codec_get(codec)->lossless;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        if (presets[k].codec == codec && (lossless || presets[k].feedback == feedback)) return (echo_preset)k;
    for (int k = 0; k < ECHO_PRESET_COUNT; k++)
        if (!lossless && presets[k].codec == ECHO_CODEC_DEFAULT && presets[k].feedback == feedback)
            return (echo_preset)k;
    return ECHO_PRESET_EXACT; /* unreachable: the table has a row for every codec kind */
}

/* ---- the codec table ---- */

static const echo_codec_info codecs[ECHO_CODEC_COUNT] = {
    [ECHO_CODEC_INT4] = {"int4", 0, 4, 2, 0, ECHO_MIN_GROUP, ECHO_DEFAULT_GROUP, ECHO_FORM_INT4},
    [ECHO_CODEC_HADAMARD] = {"hadamard", -1, 4, 2, 0, ECHO_MIN_GROUP, 32, ECHO_FORM_INT4},
    [ECHO_CODEC_HSUB6] = {"hsub6", ECHO_SUB, 4, 2, 6, 64, 128, ECHO_FORM_HSUB},
    [ECHO_CODEC_OUT2] = {"out2", 0, 4, ECHO_OUT2_REC, 0, 64, 128, ECHO_FORM_OUT2},
    [ECHO_CODEC_HOUT2] = {"hout2", 0, 4, ECHO_OUT2_REC, 0, ECHO_MIN_GROUP, 128, ECHO_FORM_HOUT2},
    /* 3-bit codes, hout2's record */
    [ECHO_CODEC_HNF3] = {"hnf3", 0, 3, ECHO_OUT2_REC, 0, 64, 256, ECHO_FORM_HNF3},
    /* G only sets the shard granularity here; 128 as ECHO_DEFAULT_CODEC's */
    [ECHO_CODEC_NONE] = {"none", 0, 32, 0, 0, ECHO_MIN_GROUP, 128, ECHO_FORM_INT4, 1, 0},
    [ECHO_CODEC_BF16] = {"bf16", 0, 16, 0, 0, ECHO_MIN_GROUP, 128, ECHO_FORM_INT4, 1, 1},
#ifdef ECHO_EXTRA_CODEC_ROWS
    ECHO_EXTRA_CODEC_ROWS
#endif
};

const echo_codec_info *echo_codec_get(echo_codec_id id) {
    if (id == ECHO_CODEC_DEFAULT) id = ECHO_DEFAULT_CODEC;
    return id > ECHO_CODEC_DEFAULT && id < ECHO_CODEC_COUNT ? &codecs[id] : NULL;
}

int echo_priv_group_valid(const echo_codec_info *ci, int g) {
    return ci && g >= ci->min_group && g <= ECHO_MAX_GROUP && !(g & (g - 1));
}

static int default_group(const echo_codec_info *ci) {
    return ci->default_group;
}

static const char *codec_row(int i) {
    int k = ECHO_CODEC_DEFAULT + 1 + i;
    return k < ECHO_CODEC_COUNT ? codecs[k].name : NULL;
}

static const char *lossy_codec_row(int i) {
    int k = ECHO_CODEC_DEFAULT + 1 + i;
    return k >= ECHO_CODEC_COUNT ? NULL : codecs[k].lossless ? "" : codecs[k].name;
}

const char *echo_codec_names(char *buf, size_t len, const char *sep, int lossy_only) {
    return echo_names_join(buf, len, sep, lossy_only ? lossy_codec_row : codec_row);
}

int echo_codec_default_group(echo_codec_id id) {
    const echo_codec_info *ci = echo_codec_get(id);
    return ci ? ci->default_group : 0;
}

int echo_codec_parse(const char *s, echo_codec_id *codec, int *group) {
    if (!s) return -1;
    for (int k = ECHO_CODEC_DEFAULT + 1; k < ECHO_CODEC_COUNT; k++) {
        size_t n = strlen(codecs[k].name);
        if (strncmp(s, codecs[k].name, n)) continue;
        if (!s[n]) {
            *codec = (echo_codec_id)k;
            *group = 0;
            return 0;
        }
        if (s[n] != '-' || s[n + 1] != 'g') continue;
        char *end;
        long g = strtol(s + n + 2, &end, 10);
        if (*end || end == s + n + 2 || g > ECHO_MAX_GROUP || !echo_priv_group_valid(&codecs[k], (int)g)) return -1;
        *codec = (echo_codec_id)k;
        *group = (int)g;
        return 0;
    }
    return -1;
}

size_t echo_codec_group_bytes(echo_codec_id id, int group) {
    const echo_codec_info *ci = echo_codec_get(id);
    if (!group && ci) group = default_group(ci);
    if (!echo_priv_group_valid(ci, group)) return 0;
    return (size_t)group * (size_t)ci->code_bits / 8 + (size_t)ci->scale_bytes +
           (size_t)(group / ECHO_SUB) * (size_t)ci->sub_bits / 8;
}

double echo_codec_bits(echo_codec_id id, int group) {
    const echo_codec_info *ci = echo_codec_get(id);
    if (!group && ci) group = default_group(ci);
    size_t b = echo_codec_group_bytes(id, group);
    return b ? 8.0 * (double)b / group : 0;
}

/* The codec's part of a call's geometry: wire size from the table, rotation. */
void echo_priv_plan_codec(echo_plan *p, echo_codec_id id) {
    const echo_codec_info *ci = echo_codec_get(id);
    size_t gb = echo_codec_group_bytes(id, p->group);
    p->wire = p->shard / (size_t)p->group * gb;
    p->rotate = ci->rotate < 0 ? p->group : ci->rotate;
    p->form = ci->form;
}
