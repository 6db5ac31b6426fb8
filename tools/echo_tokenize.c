/*
 * echo-tokenize: encode/decode through tokenizer/ from the command line.
 *
 *   echo-tokenize (--model DIR|GGUF | --tokenizer FILE) [--add-special] --jsonl
 *       each stdin line is a JSON string -> one line with a JSON array of ids
 *   echo-tokenize (--model DIR|GGUF | --tokenizer FILE) --decode [--skip-special] --jsonl
 *       each stdin line is a JSON array of ids -> one line with a JSON string
 *   echo-tokenize (--model DIR|GGUF | --tokenizer FILE) [--add-special]
 *       all of stdin as text -> ids separated by spaces
 *   echo-tokenize (--model DIR|GGUF | --tokenizer FILE) --bench FILE [--repeat N]
 *       single-thread encode throughput on FILE, whole file as one string and
 *       line by line (best of N each)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

static void usage(void) {
    fprintf(stderr,
            "usage: echo-tokenize (--model DIR|GGUF | --tokenizer FILE) [--decode] [--add-special]\n"
            "                     [--skip-special] [--jsonl] [--bench FILE [--repeat N]]\n");
}

static char *slurp(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    *len = n;
    return buf;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Two timings, best of `repeat` each: the whole file as one string, and
 * line by line (each line with its newline, as a server sees requests). */
static int bench(const tok_tokenizer *t, const char *path, int repeat) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t len;
    char *text = slurp(f, &len);
    fclose(f);
    if (!text) return 1;
    char err[256];
    int status = 0;
    for (int mode = 0; mode < 2 && !status; mode++) {
        double best = 1e30;
        size_t ntok = 0;
        for (int r = 0; r < repeat && !status; r++) {
            double t0 = now();
            ntok = 0;
            size_t pos = 0;
            while (pos < len) {
                size_t end = len;
                if (mode == 1) {
                    const char *nl = memchr(text + pos, '\n', len - pos);
                    end = nl ? (size_t)(nl - text) + 1 : len;
                }
                int32_t *ids;
                size_t n;
                if (tok_encode(t, text + pos, end - pos, 0, &ids, &n, err, sizeof err)) {
                    fprintf(stderr, "encode: %s\n", err);
                    status = 1;
                    break;
                }
                free(ids);
                ntok += n;
                pos = end;
            }
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        if (!status)
            printf("echo %s: %zu bytes, %zu tokens, %.3f s, %.2f MB/s, %.0f tokens/s\n",
                   mode ? "lines" : "whole", len, ntok, best, len / best / 1e6, ntok / best);
    }
    free(text);
    return status;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *bench_file = NULL;
    int decode = 0, add_special = 0, skip_special = 0, jsonl = 0, repeat = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--tokenizer") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(a, "--bench") && i + 1 < argc) bench_file = argv[++i];
        else if (!strcmp(a, "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--add-special")) add_special = 1;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "--jsonl")) jsonl = 1;
        else {
            usage();
            return 2;
        }
    }
    if (!model == !file || repeat < 1) {
        usage();
        return 2;
    }
    char err[512];
    tok_tokenizer *t = NULL;
    int rc;
    if (model) rc = eng_tokenizer_load(model, &t, NULL, err, sizeof err);
    else {
        size_t n = strlen(file);
        rc = n > 6 && !strcmp(file + n - 6, ".model") ? tok_load_sentencepiece(file, &t, err, sizeof err)
                                                      : tok_load_json_file(file, NULL, &t, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "echo-tokenize: %s\n", err);
        return 1;
    }
    int status = 0;
    if (bench_file) {
        status = bench(t, bench_file, repeat);
        goto out;
    }
    if (!jsonl) {
        size_t len;
        char *text = slurp(stdin, &len);
        int32_t *ids = NULL;
        size_t n = 0;
        if (!text || tok_encode(t, text, len, add_special, &ids, &n, err, sizeof err)) {
            fprintf(stderr, "echo-tokenize: %s\n", text ? err : "out of memory");
            status = 1;
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        }
        free(text);
        free(ids);
        goto out;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v) {
            fprintf(stderr, "echo-tokenize: line %ld: bad JSON: %s\n", lineno, je.text);
            status = 1;
            break;
        }
        if (!decode) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (!json_is_string(v)) {
                fprintf(stderr, "echo-tokenize: line %ld: expected a JSON string\n", lineno);
                status = 1;
            } else if (tok_encode(t, json_string_value(v), json_string_length(v), add_special, &ids, &n,
                                  err, sizeof err)) {
                fprintf(stderr, "echo-tokenize: line %ld: %s\n", lineno, err);
                status = 1;
            } else {
                putchar('[');
                for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
                fputs("]\n", stdout);
            }
            free(ids);
        } else {
            size_t n = json_array_size(v);
            int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
            char *text = NULL;
            size_t tl = 0;
            if (!json_is_array(v) || !ids) {
                fprintf(stderr, "echo-tokenize: line %ld: expected a JSON array of ids\n", lineno);
                status = 1;
            } else {
                for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(v, i));
                if (tok_decode(t, ids, n, skip_special, &text, &tl, err, sizeof err)) {
                    fprintf(stderr, "echo-tokenize: line %ld: %s\n", lineno, err);
                    status = 1;
                } else {
                    json_t *s = json_stringn(text, tl);
                    char *out = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
                    if (out) puts(out);
                    else status = 1;
                    free(out);
                    json_decref(s);
                }
            }
            free(ids);
            free(text);
        }
        json_decref(v);
        if (status) break;
    }
    free(line);
out:
    tok_free(t);
    return status;
}
