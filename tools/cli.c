/* Flag parsing shared by the programs (see cli.h). */
#include "engine/report.h"
#include "tools/cli.h"

#include "comm/echo.h"
#include "comm/proc.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void cli_usage_error(const char *prog, const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help'.\n", prog);
    exit(2);
}

int cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

long cli_long(const char *prog, const char *s, const char *flag, long lo, long hi) {
    long v;
    if (cli_parse_long(s, lo, hi, &v)) {
        char msg[192];
        snprintf(msg, sizeof msg, "%s expects an integer in [%ld, %ld], got '%%s'", flag, lo, hi);
        cli_usage_error(prog, msg, s);
    }
    return v;
}

double cli_double(const char *prog, const char *s, const char *flag, double lo, double hi) {
    double v;
    if (cli_parse_double(s, lo, hi, &v)) {
        char msg[192];
        snprintf(msg, sizeof msg, "%s expects a number in [%g, %g], got '%%s'", flag, lo, hi);
        cli_usage_error(prog, msg, s);
    }
    return v;
}

const char *const *cli_transports(void) {
    static const char *names[ECHO_MAX_TRANSPORTS + 2];
    if (!names[0]) {
        int n = 0;
        names[n++] = "auto";
        for (int i = 0; echo_transport_at(i) && n <= ECHO_MAX_TRANSPORTS; i++)
            names[n++] = echo_transport_at(i)->name;
    }
    return names;
}

const char *const *cli_devices(void) {
    static const char *names[KERN_MAX_BACKENDS + 2];
    if (!names[0]) {
        int n = 0;
        names[n++] = "auto";
        for (int i = 0; kern_backend_at(i) && n <= KERN_MAX_BACKENDS; i++)
            names[n++] = kern_backend_at(i)->name;
    }
    return names;
}

static void join_choices(char *buf, size_t len, const char *const *c) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; c[i] && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", c[i]);
}

int cli_allreduce(const char *prog, const char *s, echo_preset *p) {
    int am = 0;
    if (echo_allreduce_parse(s, p, &am)) {
        char names[256], msg[400];
        snprintf(msg, sizeof msg, "--allreduce expects auto, auto:echo3, %s, got '%%s'",
                 echo_preset_names(names, sizeof names, ", "));
        cli_usage_error(prog, msg, s);
    }
    return am;
}

json_t *cli_allreduce_auto_json(const eng *e) {
    echo_auto_figures f;
    echo_auto_choice c;
    if (!eng_allreduce_auto(e, &f, &c)) return NULL;
    char d[1024];
    echo_auto_describe(&f, &c, d, sizeof d);
    json_t *est = json_object();
    for (int i = 0; i < ECHO_AUTO_CANDIDATES; i++)
        if (!isnan(c.est_s[ECHO_AUTO_LARGE][i]))
            json_object_set_new(est, echo_preset_name(echo_auto_candidates[i]), json_real(c.est_s[ECHO_AUTO_LARGE][i] * 1e3));
    json_t *codec = json_object();
    for (int i = 1; i < ECHO_AUTO_CANDIDATES; i++)
        json_object_set_new(codec, echo_preset_name(echo_auto_candidates[i]),
                            json_pack("{s:f,s:f}", "encode_mvalues_s", f.encode_vps[i] / 1e6, "decode_mvalues_s",
                                      f.decode_vps[i] / 1e6));
    return json_pack("{s:s,s:s,s:b,s:s,s:i,s:i,s:b,s:i,s:{s:f,s:f},s:{s:f,s:f},s:o,s:o,s:s}", "small_calls",
                     echo_preset_name(c.preset[ECHO_AUTO_SMALL]), "large_calls",
                     echo_preset_name(c.preset[ECHO_AUTO_LARGE]), "small_oneshot", c.oneshot[ECHO_AUTO_SMALL],
                     "small_calls_le", "fp32 bytes", "small_bytes", ECHO_AUTO_SMALL_BYTES, "overlap", c.overlap_k,
                     "shared_memory", f.shared_memory, "threads", f.threads, "link_small", "latency_us",
                     f.link[ECHO_AUTO_SMALL].latency_s * 1e6, "mbytes_s", f.link[ECHO_AUTO_SMALL].bytes_per_s / 1e6,
                     "link_large", "latency_us", f.link[ECHO_AUTO_LARGE].latency_s * 1e6, "mbytes_s",
                     f.link[ECHO_AUTO_LARGE].bytes_per_s / 1e6, "codec_per_thread", codec, "est_large_call_ms", est,
                     "plan", d);
}

void cli_help(const char *usage) {
    char b[512];
    fputs(usage, stdout);
    printf("\nChoices (from the tables in comm/ and kernels/):\n");
    printf("  --allreduce    auto, auto:echo3, %s\n", echo_preset_names(b, sizeof b, ", "));
    printf("  --echo-codec   %s (lossy codes: hnf3 3-bit, the others 4-bit; NAME-gG sets the group)\n", echo_codec_names(b, sizeof b, ", ", 1));
    join_choices(b, sizeof b, cli_transports());
    printf("  --transport    %s\n", b);
    join_choices(b, sizeof b, cli_devices());
    printf("  --device       %s\n", b);
}

const char *cli_choice(const char *prog, const char *s, const char *flag, const char *const *choices) {
    char msg[256];
    size_t len = (size_t)snprintf(msg, sizeof msg, "%s expects ", flag);
    int n = 0;
    for (const char *const *c = choices; *c; c++, n++)
        if (!strcmp(s, *c)) return s;
    for (int i = 0; i < n && len < sizeof msg; i++)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s", choices[i],
                                i + 2 < n ? ", " : i + 2 == n ? " or " : "");
    if (len < sizeof msg) snprintf(msg + len, sizeof msg - len, ", got '%%s'");
    cli_usage_error(prog, msg, s);
}

int cli_parse_act_quant(const char *s, int *out) {
    if (strcmp(s, "q8_0") && strcmp(s, "none") && strcmp(s, "auto")) return -1;
    *out = !strcmp(s, "q8_0") ? ENG_ACT_Q8 : !strcmp(s, "none") ? ENG_ACT_NONE : ENG_ACT_AUTO;
    return 0;
}

int cli_act_quant(const char *prog, const char *s) {
    int aq = ENG_ACT_AUTO;
    cli_parse_act_quant(cli_choice(prog, s, "--act-quant", (const char *const[]){"auto", "none", "q8_0", NULL}), &aq);
    return aq;
}

int cli_parse_kv_dtype(const char *s, kern_kv_dtype *out) {
    static const struct {
        const char *name;
        kern_kv_dtype dt;
    } t[] = {{"auto", KERN_KV_BF16}, {"fp32", KERN_KV_F32}, {"bf16", KERN_KV_BF16}, {"fp16", KERN_KV_F16},
             {"q8_0", KERN_KV_Q8_0}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(s, t[i].name)) {
            *out = t[i].dt;
            return 0;
        }
    return -1;
}

kern_kv_dtype cli_kv_dtype(const char *prog, const char *s) {
    kern_kv_dtype dt = KERN_KV_BF16;
    cli_parse_kv_dtype(
        cli_choice(prog, s, "--kv-cache-dtype", (const char *const[]){"auto", "fp32", "bf16", "fp16", "q8_0", NULL}),
        &dt);
    return dt;
}

int cli_parse_kv_memory(const char *s, size_t *out) {
    if (!strcmp(s, "auto")) {
        *out = ENG_KV_MEMORY_AUTO;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-') return -1;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10;
    else if (*end == 'm' || *end == 'M') mul = 1ull << 20;
    else if (*end == 'g' || *end == 'G') mul = 1ull << 30;
    else if (*end) return -1;
    if (mul > 1 && end[1]) return -1;
    if (v == 0 || v > (1ull << 50) / mul) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

size_t cli_kv_memory(const char *prog, const char *s) {
    size_t v;
    if (cli_parse_kv_memory(s, &v))
        cli_usage_error(prog, "--kv-cache-memory expects auto or a positive number of bytes (k, m, g: powers of 1024), "
                              "got '%s'", s);
    return v;
}

double cli_gpu_util(const char *prog, const char *s) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v > 0 && v <= 1))
        cli_usage_error(prog, "--gpu-memory-utilization expects a fraction in (0, 1], got '%s'", s);
    return v;
}

int cli_overlap(const char *prog, const char *s) {
    if (!strcmp(s, "auto")) return 0;
    if (!strcmp(s, "off")) return -1;
    long n;
    if (cli_parse_long(s, 1, 8, &n)) cli_usage_error(prog, "--overlap expects auto, off or a count 1..8, got '%s'", s);
    return (int)n;
}

long cli_oneshot(const char *prog, const char *s) {
    if (!strcmp(s, "auto")) return ENG_ONESHOT_AUTO;
    if (!strcmp(s, "off")) return ENG_ONESHOT_OFF;
    long n;
    if (cli_parse_long(s, 1, 1L << 30, &n))
        cli_usage_error(prog, "--oneshot expects auto, off or a byte count 1..1073741824, got '%s'", s);
    return n;
}

int cli_spec_flag(const char *prog, const char *flag, const char *arg, cli_spec *sp) {
    if (!strcmp(flag, "speculative")) {
        sp->on = !strcmp(cli_choice(prog, arg, "--speculative", (const char *const[]){"none", "ngram", NULL}), "ngram");
    } else if (!strcmp(flag, "spec-ngram-min")) {
        sp->p.ngram_min = (int)cli_long(prog, arg, "--spec-ngram-min", 1, 16);
    } else if (!strcmp(flag, "spec-ngram-max")) {
        sp->p.ngram_max = (int)cli_long(prog, arg, "--spec-ngram-max", 1, 16);
    } else if (!strcmp(flag, "spec-max-batch")) {
        sp->max_batch = (int)cli_long(prog, arg, "--spec-max-batch", 0, 1 << 20);
    } else if (!strcmp(flag, "spec-draft-max")) {
        sp->p.draft_max = (int)cli_long(prog, arg, "--spec-draft-max", 1, ENG_SPEC_DRAFT_LIMIT);
    } else {
        return 0;
    }
    return 1;
}

void cli_spec_finish(const char *prog, cli_spec *sp) {
    if (sp->p.ngram_min > sp->p.ngram_max) {
        char msg[96];
        snprintf(msg, sizeof msg, "%d > --spec-ngram-max %d", sp->p.ngram_min, sp->p.ngram_max);
        cli_usage_error(prog, "--spec-ngram-min %s (the smallest n-gram must not exceed the largest)", msg);
    }
    if (!sp->on) sp->p.draft_max = 0;
}

static void procs_end(void) {
    eng_procs_exit();
    echo_proc_finalize();
}

void cli_procs_start(const char *prog) {
    int rank, n;
    char err[1024];
    if (echo_proc_init(&rank, &n, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        exit(1);
    }
    if (n == 1) {
        atexit(echo_proc_finalize);
        return;
    }
    if (rank > 0) {
        int rc = eng_follow(err, sizeof err);
        if (rc) fprintf(stderr, "%s (rank %d): %s\n", prog, rank, err);
        echo_proc_finalize();
        exit(rc ? 1 : 0);
    }
    atexit(procs_end);
}

int cli_echo_codec(const char *prog, const char *s, int *group) {
    echo_codec_id id;
    int g = 0;
    if (echo_codec_parse(s, &id, &g))
        cli_usage_error(prog, "--echo-codec expects a codec of the table, optionally -gG (e.g. hadamard-g32), got '%s'",
                        s);
    if (g) *group = g;
    return (int)id;
}

const char *cli_rope_scaling(const char *prog, const char *s) {
    /* checked on a stand-in config: a config's own theta cannot make a
     * well-formed spec invalid */
    model_config mc = {.max_position_embeddings = 32768, .rope = {.theta = 10000.0}};
    char err[512], msg[1100];
    if (model_config_rope_override(&mc, s, err, sizeof err)) {
        size_t o = 0;
        for (const char *p = err; *p && o + 3 < 1000; p++) { /* err is text, not a format */
            if (*p == '%') msg[o++] = '%';
            msg[o++] = *p;
        }
        snprintf(msg + o, sizeof msg - o, " (got '%%s')");
        cli_usage_error(prog, msg, s);
    }
    return s;
}
