/*
 * comm/auto.c — --allreduce auto: the figures that decide the all-reduce
 * (the link per call-size class, the codecs' speed), measured at start-up,
 * and the policy, a pure function of them (echo_auto_pick). The cost model
 * of one call of n values over N ranks, B wire bits per value:
 *   two-shot: 2 latencies + 2 (N-1)/N n B/8 bytes sent + encode of
 *             n (1 + 1/N) values + decode of 2 n (N-1)/N values;
 *   one-shot: 1 latency + (N-1) n B/8 bytes sent + encode of n values +
 *             decode of (N-1) n values (not bf16: its world keeps two-shot);
 * codec work split over the rank's threads (the workers split messages at
 * whole groups). docs/network.md ("--allreduce auto") says what it leaves out.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/codec/codec.h"
#include "comm/codec/echo_codec.h"
#include "comm/echo_internal.h"

const echo_preset echo_auto_candidates[ECHO_AUTO_CANDIDATES] = {ECHO_PRESET_EXACT, ECHO_PRESET_BF16,
                                                                 ECHO_PRESET_ECHO, ECHO_PRESET_ECHO3};

/* A lossier candidate must be this much faster than the best more accurate
 * one: it costs accuracy, and the figures are noisy. */
#define AUTO_MARGIN 1.05

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wire bits per value of candidate i's codec (the tail's calls not counted). */
static double cand_bits(int i) {
    echo_config c = {0};
    if (echo_preset_config(echo_auto_candidates[i], ECHO_CODEC_DEFAULT, 0, &c)) return 32;
    const echo_codec_info *ci = echo_codec_get(c.codec);
    return ci->lossless ? ci->code_bits : echo_codec_bits(c.codec, c.group_size);
}

/* Seconds of one call of candidate i in class k, two-shot or one-shot;
 * NAN when the schedule does not exist for it. */
static double call_s(const echo_auto_figures *f, int k, int i, int oneshot) {
    double N = f->nranks, n = f->call_bytes[k] / 4, B = cand_bits(i) / 8;
    double th = f->threads > 0 ? f->threads : 1;
    const echo_auto_link *l = &f->link[k];
    if (oneshot && echo_auto_candidates[i] == ECHO_PRESET_BF16) return NAN;
    double steps = oneshot ? 1 : 2, sent = oneshot ? (N - 1) * n * B : 2 * (N - 1) / N * n * B;
    double enc = oneshot ? n : n * (1 + 1 / N), dec = oneshot ? (N - 1) * n : 2 * (N - 1) / N * n;
    double t = steps * l->latency_s + sent / l->bytes_per_s;
    if (echo_auto_candidates[i] != ECHO_PRESET_EXACT) {
        if (f->encode_vps[i] > 0) t += enc / (f->encode_vps[i] * th);
        if (f->decode_vps[i] > 0) t += dec / (f->decode_vps[i] * th);
    }
    return t;
}

/* The prefill's seconds per layer's call with k micro-batches: the
 * all-reduce of each micro-batch runs while the next computes, so the pass
 * takes the longer of compute and all-reduce plus one micro-batch of the
 * shorter; every micro-batch's call pays the latencies again. */
static double overlap_s(double C, double M, double lat, int k) {
    double Mk = M + (k - 1) * 2 * lat;
    return (C > Mk ? C : Mk) + (C < Mk ? C : Mk) / k;
}

int echo_auto_pick(const echo_auto_figures *f, int allow_echo3, echo_auto_choice *out, char *err, size_t errlen) {
    if (f->nranks < 2 || f->nranks > ECHO_MAX_RANKS) {
        snprintf(err, errlen, "auto all-reduce: %d ranks (2..%d)", f->nranks, ECHO_MAX_RANKS);
        return -1;
    }
    for (int k = 0; k < ECHO_AUTO_CLASSES; k++)
        if (!(f->link[k].bytes_per_s > 0) || !(f->link[k].latency_s >= 0) || !(f->call_bytes[k] > 0)) {
            snprintf(err, errlen, "auto all-reduce: the %s calls' link figures are not usable (%g B/s, %g s, %g B)",
                     k == ECHO_AUTO_SMALL ? "small" : "large", f->link[k].bytes_per_s, f->link[k].latency_s,
                     f->call_bytes[k]);
            return -1;
        }
    int ncand = allow_echo3 ? ECHO_AUTO_CANDIDATES : ECHO_AUTO_CANDIDATES - 1;
    memset(out, 0, sizeof *out);
    for (int k = 0; k < ECHO_AUTO_CLASSES; k++)
        for (int i = 0; i < ECHO_AUTO_CANDIDATES; i++) out->est_s[k][i] = i < ncand ? call_s(f, k, i, 0) : NAN;
    /* large calls: the world's codec; candidates in order of accuracy */
    int big = 0;
    for (int i = 1; i < ncand; i++)
        if (out->est_s[ECHO_AUTO_LARGE][i] * AUTO_MARGIN < out->est_s[ECHO_AUTO_LARGE][big]) big = i;
    out->preset[ECHO_AUTO_LARGE] = echo_auto_candidates[big];
    /* small calls: that codec or exact (a world runs one codec; exact below
     * min_bytes), each two-shot or one-shot */
    int best = 0, best_os = 0;
    double bt = INFINITY;
    int opts[2] = {0, big};
    for (int j = 0; j < (big ? 2 : 1); j++)
        for (int os = 0; os < 2; os++) {
            double t = call_s(f, ECHO_AUTO_SMALL, opts[j], os);
            if (isnan(t)) continue;
            double need = opts[j] != best ? bt / AUTO_MARGIN : bt; /* a lossier codec needs the margin */
            if (t < need) {
                best = opts[j], best_os = os, bt = t;
            }
        }
    out->preset[ECHO_AUTO_SMALL] = echo_auto_candidates[best];
    out->oneshot[ECHO_AUTO_SMALL] = best_os;
    /* overlap: by the model when the compute is known, else on a network
     * (two micro-batches) and off on shared memory */
    if (!(f->compute_s > 0)) {
        out->overlap_k = f->shared_memory ? 1 : 2;
    } else {
        double M = out->est_s[ECHO_AUTO_LARGE][big], lat = f->link[ECHO_AUTO_LARGE].latency_s;
        out->overlap_k = 1;
        for (int k = 2; k <= 4; k++)
            if (overlap_s(f->compute_s, M, lat, k) * 1.03 < overlap_s(f->compute_s, M, lat, out->overlap_k))
                out->overlap_k = k;
    }
    return 0;
}

void echo_auto_describe(const echo_auto_figures *f, const echo_auto_choice *c, char *buf, size_t len) {
    const echo_auto_link *s = &f->link[ECHO_AUTO_SMALL], *l = &f->link[ECHO_AUTO_LARGE];
    int n = snprintf(buf, len,
                     "auto: calls <= %d KB %s %s, larger %s, overlap %d; measured %s: small calls %.0f us + %.1f "
                     "MB/s, large %.0f us + %.1f MB/s; codec Mvalues/s/thread x %d threads: bf16 %.0f/%.0f, echo "
                     "%.0f/%.0f, echo3 %.0f/%.0f (encode/decode); est. large call ms:",
                     ECHO_AUTO_SMALL_BYTES / 1024, echo_preset_name(c->preset[ECHO_AUTO_SMALL]),
                     c->oneshot[ECHO_AUTO_SMALL] ? "one-shot" : "two-shot", echo_preset_name(c->preset[ECHO_AUTO_LARGE]),
                     c->overlap_k, f->shared_memory ? "shared memory" : "link", s->latency_s * 1e6,
                     s->bytes_per_s / 1e6, l->latency_s * 1e6, l->bytes_per_s / 1e6, f->threads,
                     f->encode_vps[1] / 1e6, f->decode_vps[1] / 1e6, f->encode_vps[2] / 1e6, f->decode_vps[2] / 1e6,
                     f->encode_vps[3] / 1e6, f->decode_vps[3] / 1e6);
    for (int i = 0; i < ECHO_AUTO_CANDIDATES && n > 0 && (size_t)n < len; i++)
        if (!isnan(c->est_s[ECHO_AUTO_LARGE][i]))
            n += snprintf(buf + n, len - (size_t)n, " %s %.2f", echo_preset_name(echo_auto_candidates[i]),
                          c->est_s[ECHO_AUTO_LARGE][i] * 1e3);
}

/* ---- measurements ---- */

#define CODEC_N 65536

int echo_auto_measure_codecs(echo_auto_figures *f, char *err, size_t errlen) {
    float *x = malloc(CODEC_N * sizeof *x), *res = calloc(CODEC_N, sizeof *res), *y = malloc(CODEC_N * sizeof *y);
    uint16_t *h = malloc(CODEC_N * sizeof *h);
    void *wire = malloc(CODEC_N * 8);
    int rc = 0;
    if (!x || !res || !y || !h || !wire) {
        snprintf(err, errlen, "auto all-reduce: out of memory measuring the codecs");
        rc = -1;
        goto out;
    }
    uint32_t s = 12345;
    for (int i = 0; i < CODEC_N; i++) { /* a fixed pseudo-random message */
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((int)(s >> 9) - (1 << 22)) / (float)(1 << 22);
    }
    for (int i = 0; i < ECHO_AUTO_CANDIDATES; i++) {
        echo_config c = {0};
        echo_preset_config(echo_auto_candidates[i], ECHO_CODEC_DEFAULT, 0, &c);
        f->encode_vps[i] = f->decode_vps[i] = 0;
        if (c.codec == ECHO_CODEC_NONE) continue;
        double be = INFINITY, bd = INFINITY;
        /* best of a few rounds, at most ~50 ms per codec */
        double t_end = now_s() + 0.05;
        for (int r = 0; r < 8 && (r < 2 || now_s() < t_end); r++) {
            double t0 = now_s();
            if (c.codec == ECHO_CODEC_BF16) {
                for (int j = 0; j < CODEC_N; j++) h[j] = echo_f32_to_bf16(x[j] + res[j]);
            } else if (echo_codec_encode_as(c.codec, x, res, CODEC_N, c.group_size, wire, err, errlen)) {
                rc = -1;
                goto out;
            }
            double t1 = now_s();
            if (c.codec == ECHO_CODEC_BF16) {
                for (int j = 0; j < CODEC_N; j++) y[j] += echo_bf16_to_f32(h[j]);
            } else if (echo_codec_decode_as(c.codec, wire, CODEC_N, c.group_size, y, 1, err, errlen)) {
                rc = -1;
                goto out;
            }
            double t2 = now_s();
            if (t1 - t0 < be) be = t1 - t0;
            if (t2 - t1 < bd) bd = t2 - t1;
        }
        f->encode_vps[i] = CODEC_N / (be > 1e-7 ? be : 1e-7);
        f->decode_vps[i] = CODEC_N / (bd > 1e-7 ? bd : 1e-7);
    }
out:
    free(x);
    free(res);
    free(y);
    free(h);
    free(wire);
    return rc;
}

void echo_auto_measure_memory(echo_auto_figures *f) {
    size_t n = 4 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = INFINITY;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int r = 0; r < 4; r++) {
            double t0 = now_s();
            memcpy(b, a, n);
            double t = now_s() - t0;
            if (t < best) best = t;
            a[r] = b[n - 1 - (size_t)r]; /* keep the copies */
        }
    }
    free(a);
    free(b);
    double bw = isfinite(best) && best > 0 ? (double)n / best : 1e10;
    f->shared_memory = 1;
    for (int k = 0; k < ECHO_AUTO_CLASSES; k++) {
        f->link[k].bytes_per_s = bw;
        f->link[k].latency_s = 5e-6; /* two barriers of threads: microseconds, not measured */
    }
}

/* Best of `reps` exact all-reduces of `count` values after one warm-up. */
static int time_calls(echo_comm *c, float *buf, size_t count, int reps, double *best, char *err, size_t errlen) {
    *best = INFINITY;
    for (int r = 0; r <= reps; r++) {
        for (size_t i = 0; i < count; i++) buf[i] = (float)(i & 7);
        if (echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen)) return -1;
        double t0 = now_s();
        int rc = echo_allreduce(c, 0, buf, count, ECHO_F32, NULL, err, errlen);
        double t = now_s() - t0;
        if (echo_end_pass(c, NULL, NULL, err, errlen) || rc) return -1;
        if (r && t < *best) *best = t;
    }
    return 0;
}

int echo_auto_measure_link(echo_comm *c, size_t max_count, echo_auto_figures *f, char *err, size_t errlen) {
    /* fp32 bytes of the two probes per class */
    static const size_t sizes[ECHO_AUTO_CLASSES][2] = {{1024, 16384}, {ECHO_AUTO_SMALL_BYTES, 1 << 20}};
    size_t most = max_count < ((size_t)1 << 18) ? max_count : (size_t)1 << 18;
    float *buf = malloc((most ? most : 1) * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "auto all-reduce: out of memory measuring the link");
        return -1;
    }
    double N = echo_world_nranks(c->w);
    f->nranks = (int)N;
    f->shared_memory = 0;
    int rc = 0;
    for (int k = 0; k < ECHO_AUTO_CLASSES && !rc; k++) {
        size_t n1 = sizes[k][0] / 4, n2 = sizes[k][1] / 4;
        if (n2 > most) n2 = most;
        if (n1 >= n2) n1 = n2 / 4 > 0 ? n2 / 4 : 1;
        double t1, t2;
        if (time_calls(c, buf, n1, 3, &t1, err, errlen) || time_calls(c, buf, n2, 3, &t2, err, errlen)) {
            rc = -1;
            break;
        }
        /* bytes one rank sends two-shot: 2 (N-1)/N of the message */
        double b1 = 2 * (N - 1) / N * 4 * (double)n1, b2 = 2 * (N - 1) / N * 4 * (double)n2;
        /* noise (a loaded host, probes capped small by the world's size) can
         * leave t2 <= t1: then the larger probe's rate with no latency, a
         * finite lower bound, rather than an infinitely fast link */
        double bw = t2 > t1 ? (b2 - b1) / (t2 - t1) : b2 / t2;
        double lat = t2 > t1 ? (t1 - b1 / bw) / 2 : 0;
        f->link[k].bytes_per_s = bw;
        f->link[k].latency_s = lat > 0 ? lat : 0;
    }
    free(buf);
    return rc;
}

int echo_allreduce_parse(const char *s, echo_preset *p, int *auto_mode) {
    if (!s) return -1;
    if (!strcmp(s, "auto") || !strcmp(s, "auto:echo3")) {
        *auto_mode = s[4] ? 2 : 1;
        return 0;
    }
    if (echo_preset_parse(s, p)) return -1;
    *auto_mode = 0;
    return 0;
}
