/*
 * gpu_test_cuda_model: every fixture model under tests/fixtures/models run by
 * the engine on the cuda backend against the cpu backend (the fp32 oracle,
 * itself within 1e-5 of HF transformers), through the public engine API
 * only, so the whole product path is exercised: weight upload, every op, the
 * paged KV cache, and at tp > 1 the device all-reduce (several ranks on one
 * GPU through comm/'s local device transport, or NCCL when there are enough
 * GPUs).
 *
 * Per model and reference prompt (reference.json: prompt + HF's 32 greedy
 * tokens), one eng_step over prompt + greedy with logits for every row:
 *   cuda tp 1            vs cpu tp 1: rel err ‖cuda − cpu‖₂/‖cpu‖₂ <= 2e-2
 *   cuda tp 2, 4 (exact) vs cpu tp 1: the same limit, where the model splits
 *   cuda tp 4 (echo)     vs cuda tp 4 exact: reported, not asserted (the
 *                        codec's error is the subject of docs/echo.md)
 * and greedy agreement over 32 generated tokens, cuda vs HF's, reported
 * (bf16 may flip near-ties). One line per check:
 *     model tp N mode  rel_err=E  limit  PASS|FAIL|INFO
 * Exit status: 0 when every asserted check passes, 1 otherwise, 77 when
 * there is no GPU (or no cuda backend in this build).
 *
 * Usage: gpu_test_cuda_model [--self-check] [MODEL_DIR ...]
 * --self-check runs the cpu backend in place of cuda (a harness check that
 * needs no GPU; the errors are then those of tensor parallelism in fp32).
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/model.h"

#define TOL 2e-2
#define MODELS_DIR "tests/fixtures/models"
#define MAX_MODELS 32

typedef struct prompt {
    int32_t *ids; /* prompt then HF's greedy continuation */
    int n_prompt, n_greedy;
} prompt;

static int g_fail, g_checks;

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (!isfinite(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int load_prompts(const char *dir, prompt **out, int *n) {
    char path[1024];
    json_error_t je;
    snprintf(path, sizeof path, "%.1000s/reference.json", dir);
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        printf("%s: %s\n", path, je.text);
        return -1;
    }
    json_t *ps = json_object_get(root, "prompts");
    *n = (int)json_array_size(ps);
    *out = calloc((size_t)(*n ? *n : 1), sizeof **out);
    for (int i = 0; i < *n; i++) {
        json_t *e = json_array_get(ps, (size_t)i), *pa = json_object_get(e, "prompt"),
               *ga = json_object_get(e, "greedy");
        prompt *p = &(*out)[i];
        p->n_prompt = (int)json_array_size(pa);
        p->n_greedy = (int)json_array_size(ga);
        p->ids = malloc((size_t)(p->n_prompt + p->n_greedy + 1) * sizeof *p->ids);
        for (int j = 0; j < p->n_prompt; j++) p->ids[j] = (int32_t)json_integer_value(json_array_get(pa, (size_t)j));
        for (int j = 0; j < p->n_greedy; j++)
            p->ids[p->n_prompt + j] = (int32_t)json_integer_value(json_array_get(ga, (size_t)j));
    }
    json_decref(root);
    return 0;
}

static eng *open_engine(const char *dir, const char *device, int tp, echo_mode mode) {
    char err[1024];
    eng_config c = {.model_dir = dir, .device = device, .tp = tp, .allreduce = mode, .max_model_len = 256,
                    .max_num_seqs = 2, .threads = 0};
    eng *e = NULL;
    if (eng_create(&c, &e, err, sizeof err)) {
        printf("%s %s tp %d: engine: %s\n", dir, device, tp, err);
        return NULL;
    }
    return e;
}

/* Logits for every row of prompt + greedy, in one step; NULL on error. */
static float *all_logits(eng *e, const prompt *p, int vocab) {
    char err[1024];
    int n = p->n_prompt + p->n_greedy, seq;
    if (eng_seq_new(e, &seq, err, sizeof err)) {
        printf("seq: %s\n", err);
        return NULL;
    }
    float *l = malloc((size_t)n * vocab * sizeof *l);
    eng_item it = {seq, p->ids, n, ENG_LOGITS_ALL};
    if (!l || eng_step(e, &it, 1, l, err, sizeof err)) {
        printf("step: %s\n", l ? err : "out of memory");
        free(l);
        l = NULL;
    }
    eng_seq_free(e, seq);
    return l;
}

typedef struct gen_acc {
    int32_t toks[64];
    int n;
} gen_acc;

static int collect(void *user, const eng_step_out *st) {
    gen_acc *g = user;
    if (g->n < 64) g->toks[g->n++] = st->token;
    return 0;
}

static void report(const char *model, int tp, const char *what, double err, double tol, int assert_it) {
    const char *verdict = !assert_it ? "INFO" : err <= tol ? "PASS" : "FAIL";
    if (assert_it) {
        g_checks++;
        if (err > tol) g_fail++;
    }
    printf("%-16s tp %d %-26s rel_err=%.3e  limit %.0e  %s\n", model, tp, what, err, tol, verdict);
}

static void fail_line(const char *model, int tp, const char *what) {
    g_checks++;
    g_fail++;
    printf("%-16s tp %d %-26s  FAIL (see the message above)\n", model, tp, what);
}

static void test_model(const char *dir, const char *dev) {
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    prompt *ps = NULL;
    int np = 0;
    model_config mc;
    char err[1024];
    if (model_config_load(dir, &mc, err, sizeof err) || load_prompts(dir, &ps, &np)) {
        fail_line(name, 1, "load");
        return;
    }
    const int V = mc.vocab_size;
    float **ref = calloc((size_t)np, sizeof *ref), **dev1 = calloc((size_t)np, sizeof *dev1);
    eng *cpu = open_engine(dir, "cpu", 1, ECHO_MODE_EXACT);
    for (int i = 0; cpu && i < np; i++) ref[i] = all_logits(cpu, &ps[i], V);
    eng_destroy(cpu);

    static const struct {
        int tp;
        echo_mode mode;
    } runs[] = {{1, ECHO_MODE_EXACT}, {2, ECHO_MODE_EXACT}, {4, ECHO_MODE_EXACT}, {4, ECHO_MODE_ECHO}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        int tp = runs[r].tp;
        char what[64];
        snprintf(what, sizeof what, "%s %s vs %s", dev, echo_mode_name(runs[r].mode),
                 runs[r].mode == ECHO_MODE_ECHO ? "exact" : "cpu");
        if (tp > 1 && model_check_tp(&mc, tp, err, sizeof err)) {
            printf("%-16s tp %d %-26s skipped: %s\n", name, tp, what, err);
            continue;
        }
        eng *e = open_engine(dir, dev, tp, runs[r].mode);
        if (!e) {
            fail_line(name, tp, what);
            continue;
        }
        double worst = 0;
        int ok = 1;
        float **exact4 = runs[r].mode == ECHO_MODE_ECHO ? dev1 : NULL; /* dev1 holds tp 4 exact by then */
        for (int i = 0; i < np && ok; i++) {
            float *l = all_logits(e, &ps[i], V);
            const float *base = exact4 ? exact4[i] : ref[i];
            if (!l || !base) {
                ok = 0;
                free(l);
                break;
            }
            double re = rel_err(l, base, (size_t)(ps[i].n_prompt + ps[i].n_greedy) * V);
            worst = re > worst ? re : worst;
            if (tp == 4 && runs[r].mode == ECHO_MODE_EXACT) {
                free(dev1[i]); /* keep tp 4 exact for the echo comparison */
                dev1[i] = l;
            } else {
                free(l);
            }
        }
        if (!ok)
            fail_line(name, tp, what);
        else
            report(name, tp, what, worst, TOL, runs[r].mode != ECHO_MODE_ECHO);
        if (tp == 1 && ok) { /* greedy agreement with HF, reported */
            int agree = 0, total = 0;
            for (int i = 0; i < np; i++) {
                gen_acc g = {.n = 0};
                eng_gen_params gp = {.max_tokens = ps[i].n_greedy, .sampling = {.top_p = 1}, .ignore_eos = 1};
                eng_finish fin;
                total += ps[i].n_greedy;
                if (eng_generate(e, ps[i].ids, ps[i].n_prompt, &gp, collect, &g, &fin, err, sizeof err)) {
                    printf("generate: %s\n", err);
                    continue;
                }
                /* agreement = the common prefix: after a flip the contexts differ */
                for (int j = 0; j < ps[i].n_greedy && j < g.n && g.toks[j] == ps[i].ids[ps[i].n_prompt + j]; j++)
                    agree++;
            }
            printf("%-16s tp 1 %-26s %d/%d tokens before the first difference (%d prompts)  INFO\n", name,
                   "greedy vs HF", agree, total, np);
        }
        eng_destroy(e);
    }
    for (int i = 0; i < np; i++) {
        free(ref[i]);
        free(dev1[i]);
        free(ps[i].ids);
    }
    free(ref);
    free(dev1);
    free(ps);
}

int main(int argc, char **argv) {
    int self = 0, n = 0;
    static char dirs[MAX_MODELS][512];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--self-check")) {
            self = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--self-check] [MODEL_DIR ...]\n", argv[0]);
            return 2;
        } else if (n < MAX_MODELS) {
            snprintf(dirs[n++], sizeof dirs[0], "%s", argv[i]);
        }
    }
    const char *dev = self ? "cpu" : "cuda";
    if (!self && strcmp(kern_auto_device(), "cuda") != 0) {
        printf("no GPU: skipped (no cuda backend in this build or no visible GPU)\n");
        return 77;
    }
    if (n == 0) {
        DIR *d = opendir(MODELS_DIR);
        struct dirent *de;
        while (d && (de = readdir(d)) && n < MAX_MODELS) {
            char cfg[1024];
            struct stat st;
            if (de->d_name[0] == '.' || strlen(de->d_name) > 400) continue;
            snprintf(cfg, sizeof cfg, "%s/%s/reference.json", MODELS_DIR, de->d_name);
            if (stat(cfg, &st) == 0) snprintf(dirs[n++], sizeof dirs[0], "%s/%s", MODELS_DIR, de->d_name);
        }
        if (d) closedir(d);
        qsort(dirs, (size_t)n, sizeof dirs[0], (int (*)(const void *, const void *))strcmp);
    }
    if (n == 0) {
        printf("no fixture models under %s (run from the repository root)\n", MODELS_DIR);
        return 1;
    }
    printf("device %s vs cpu, tolerance %.0e, %d models\n", dev, TOL, n);
    for (int i = 0; i < n; i++) test_model(dirs[i], dev);
    printf("%d of %d checks passed\n", g_checks - g_fail, g_checks);
    return g_fail ? 1 : 0;
}
