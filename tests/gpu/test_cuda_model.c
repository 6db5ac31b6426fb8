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
 *   cuda tp 1            vs cpu tp 1: rel err ‖cuda − cpu‖₂/‖cpu‖₂ <= the
 *                        model's limit: max(2e-2, the fixture's bf16
 *                        yardstick), see TOL below
 *   cuda tp 2, 4 (exact) vs cpu tp 1: the same limit, where the model splits
 *   cuda tp 4 (echo)     vs cuda tp 4 exact: reported, not asserted (the
 *                        codec's error is the subject of docs/echo.md)
 * and greedy agreement over 32 generated tokens, cuda vs HF's, reported
 * (bf16 may flip near-ties). Then CUDA graphs (eng_config.cuda_graphs) at
 * tp 1: a batch of GRAPH_SEQS sequences of different lengths (the
 * reference prompts, the k-th one without its first k tokens) is
 * prefilled, then fed HF's greedy tokens one per step (decode-only steps);
 * the logits of every decode step with graphs on must be BIT-IDENTICAL to
 * those with graphs off (same kernels, same attention splits), within the limit
 * of the cpu, and the graphs must have run (steps through a graph > 0).
 * At tp 2 and 4 on the nccl transport (one GPU per rank; "skipped" with
 * fewer GPUs), echo mode: the all-reduces are captured with the step, and
 * graphs on == off bit for bit again (test_graphs_tp).
 * The same on a random Qwen3-0.6B-shaped model (head_dim 128: the fast
 * attention paths; graphs on == off and steps as graphs only; with --emu
 * on random:tiny-hd128).
 * With --self-check (no graphs on cpu) those lines say "skipped".
 * Fused decode weights (eng_config.fuse_weights, on by default on cuda):
 * one sequence decoding one token per step, fused vs unfused and vs the
 * cpu within the limit, fused graph steps bit-identical to fused eager ones.
 * One line per check:
 *     model tp N mode  rel_err=E  limit  PASS|FAIL|INFO
 * Exit status: 0 when every asserted check passes, 1 otherwise, 77 when
 * there is no GPU (or no cuda backend in this build).
 *
 * Usage: gpu_test_cuda_model [--self-check] [--emu] [MODEL_DIR ...]
 * --self-check runs the cpu backend in place of cuda (a harness check that
 * needs no GPU; the errors are then those of tensor parallelism in fp32).
 * --emu is for the CPU emulator of tests/emu (make test-emu), where every
 * CUDA thread is a coroutine: the same checks on less work. Per model only
 * the first reference prompt goes through the tp 1/2/4 comparisons, the
 * greedy-vs-HF report is skipped (INFO only), decode checks (graphs, fused)
 * run EMU_STEPS steps instead of 32, models over EMU_MAX_LAYERS layers or
 * EMU_MAX_VOCAB vocabulary entries are skipped (they print "skipped
 * (--emu: too large to emulate)"), and the random-model graph check runs on
 * random:tiny-hd128 instead of the Qwen3-0.6B shape.
 */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/report.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* The limit on a bf16 path's logits vs the fp32 cpu oracle: issue 6's
 * 2e-2, or the fixture's bf16 yardstick where that is larger. The cuda
 * backend keeps activations (the residual stream included) in bf16, the
 * cpu oracle in fp32: every op adds ~2^-9 relative rounding, and the
 * fixtures' random weights amplify it layer by layer, so that even
 * transformers' own bf16 forward is 1.2e-2 to 5.4e-2 from its fp32 one on
 * these models (reference.json "hf_bf16_max_rel_err", computed by
 * tests/fixtures/make_reference.py; see tests/fixtures/README.md). A
 * correct bf16 implementation cannot be held to less than an independent
 * one achieves; it is held to no more. (Emulated, tests/emu, the cuda
 * logits are 0.9e-2 to 2.6e-2 from the cpu, each below its fixture's
 * yardstick, while every op alone is within 2e-3.) Comparisons of two bf16
 * runs (fused vs unfused) keep TOL. */
#define TOL 2e-2
#define MODELS_DIR "tests/fixtures/models"
#define MAX_MODELS 32

typedef struct prompt {
    int32_t *ids; /* prompt then HF's greedy continuation */
    int n_prompt, n_greedy;
} prompt;

static int g_fail, g_checks;
static int g_emu; /* --emu: less work per check (see the file comment) */

#define EMU_STEPS 6
#define EMU_MAX_LAYERS 12
#define EMU_MAX_VOCAB 4096

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

/* *tol = max(TOL, the fixture's hf_bf16_max_rel_err) (TOL when absent). */
/* `dir`: a fixture folder, or the model.gguf inside one. */
static int load_prompts(const char *dir, prompt **out, int *n, double *tol) {
    char path[1024], folder[1024];
    json_error_t je;
    snprintf(folder, sizeof folder, "%.1000s", dir);
    size_t fl = strlen(folder);
    if (fl > 11 && !strcmp(folder + fl - 11, "/model.gguf")) folder[fl - 11] = 0;
    snprintf(path, sizeof path, "%.1000s/reference.json", folder);
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        printf("%s: %s\n", path, je.text);
        return -1;
    }
    json_t *ps = json_object_get(root, "prompts");
    double yard = json_number_value(json_object_get(root, "hf_bf16_max_rel_err"));
    *tol = yard > TOL ? yard : TOL;
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

static eng *open_engine(const char *dir, const char *device, int tp, echo_preset mode) {
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
    if (assert_it)
        printf("%-16s tp %d %-26s rel_err=%.3e  limit %.2e  %s\n", model, tp, what, err, tol, verdict);
    else
        printf("%-16s tp %d %-26s rel_err=%.3e  (reported)      %s\n", model, tp, what, err, verdict);
}

static void fail_line(const char *model, int tp, const char *what) {
    g_checks++;
    g_fail++;
    printf("%-16s tp %d %-26s  FAIL (see the message above)\n", model, tp, what);
}

#define GRAPH_SEQS 3

/* tests/emu's hooks (runtime.cpp): after `after` more graph launches
 * (instantiations) on `device` the next one fails. Weak: NULL on a real
 * GPU, where the checks that need them say "skipped". */
void echo_emu_fail_graph_launch(int device, int after) __attribute__((weak));
void echo_emu_fail_graph_instantiate(int device, int after) __attribute__((weak));
void echo_emu_fail_comm_init(int after) __attribute__((weak)); /* the next ncclCommInitAll but `after` fails */

/* A failure of one rank injected into a decode run: before decode step
 * `step` the next graph launch (instantiate = 0) or instantiation (1) on
 * GPU `device` is made to fail. A step that fails is run again (a failed
 * eng_step leaves every sequence as it was). */
typedef struct fault {
    int step, device, instantiate;
    int failed;  /* eng_step calls that failed */
    long resets; /* eng_comm_resets at the end */
    long graphs_after; /* steps through a graph after the failed one */
    char err[400];     /* the failed step's message */
} fault;

/* The logits (steps, GRAPH_SEQS, V) of the decode steps described at the
 * top, on a fresh engine; NULL on error. *graph_steps: steps that ran as a
 * graph. */
static float *decode_steps_tp(const char *dir, const char *dev, int tp, echo_preset mode, int graphs, int fuse,
                              int nseqs, const prompt *ps, int np, int V, int max_len, int *steps, long *graph_steps,
                              fault *f) {
    char err[1024] = "bad sequence count";
    eng_config c = {.model_dir = dir, .device = dev, .tp = tp, .allreduce = mode, .max_model_len = max_len,
                    .max_num_seqs = nseqs, .threads = 0, .cuda_graphs = graphs, .fuse_weights = fuse};
    eng *e = NULL;
    if (eng_create(&c, &e, err, sizeof err)) {
        printf("%s %s graphs %d: engine: %s\n", dir, dev, graphs, err);
        return NULL;
    }
    int seq[GRAPH_SEQS], off[GRAPH_SEQS], T = 1 << 30, ok = nseqs >= 1 && nseqs <= GRAPH_SEQS, nseq = 0;
    eng_item it[GRAPH_SEQS];
    for (int k = 0; k < nseqs; k++) {
        const prompt *p = &ps[k % np];
        off[k] = p->n_prompt - k >= 1 ? k : 0; /* different lengths */
        int room = max_len - (p->n_prompt - off[k]);
        int t = p->n_greedy < room ? p->n_greedy : room;
        T = t < T ? t : T;
    }
    if (g_emu && T > EMU_STEPS) T = EMU_STEPS;
    float *out = T > 0 ? malloc((size_t)T * nseqs * V * sizeof *out) : NULL;
    if (!out) ok = 0;
    for (int k = 0; ok && k < nseqs; k++, nseq++)
        if (eng_seq_new(e, &seq[k], err, sizeof err)) ok = 0;
    for (int k = 0; ok && k < nseqs; k++) {
        const prompt *p = &ps[k % np];
        it[k] = (eng_item){seq[k], p->ids + off[k], p->n_prompt - off[k], ENG_LOGITS_LAST};
    }
    if (ok && eng_step(e, it, nseqs, out, err, sizeof err)) ok = 0; /* the prefill; overwritten below */
    long g_fault = 0;
    for (int t = 0; ok && t < T; t++) {
        for (int k = 0; k < nseqs; k++) {
            const prompt *p = &ps[k % np];
            it[k] = (eng_item){seq[k], p->ids + p->n_prompt + t, 1, ENG_LOGITS_LAST};
        }
        int rc = -1;
        if (f && t == f->step) {
            void (*arm)(int, int) = f->instantiate ? echo_emu_fail_graph_instantiate : echo_emu_fail_graph_launch;
            arm(f->device, 0);
            rc = eng_step(e, it, nseqs, out + (size_t)t * nseqs * V, f->err, sizeof f->err);
            arm(-1, 0); /* in case nothing reached it */
            f->failed += rc != 0;
            g_fault = eng_graph_steps(e);
        }
        if (rc && eng_step(e, it, nseqs, out + (size_t)t * nseqs * V, err, sizeof err)) ok = 0;
    }
    if (f) {
        f->resets = eng_comm_resets(e);
        f->graphs_after = eng_graph_steps(e) - g_fault;
    }
    if (!ok) printf("%s %s graphs %d: decode: %s\n", dir, dev, graphs, out ? err : "no steps or out of memory");
    *graph_steps = eng_graph_steps(e);
    for (int k = 0; k < nseq; k++)
        eng_seq_free(e, seq[k]);
    eng_destroy(e);
    if (!ok) {
        free(out);
        return NULL;
    }
    *steps = T;
    return out;
}

static float *decode_steps(const char *dir, const char *dev, int graphs, int fuse, int nseqs, const prompt *ps, int np,
                           int V, int max_len, int *steps, long *graph_steps) {
    return decode_steps_tp(dir, dev, 1, ECHO_PRESET_EXACT, graphs, fuse, nseqs, ps, np, V, max_len, steps, graph_steps,
                           NULL);
}

/* Graphs on == off, bit for bit, over T1 decode steps of GRAPH_SEQS rows:
 * one check line (a FAIL line when either run failed). */
static void check_graph_bits(const char *name, int tp, const char *what, const float *eager, const float *graph,
                             int T1, int T2, int V) {
    if (!eager || !graph || T1 != T2) {
        fail_line(name, tp, what);
        return;
    }
    size_t n = (size_t)T1 * GRAPH_SEQS * V, diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += memcmp(&eager[i], &graph[i], sizeof *eager) != 0;
    g_checks++;
    if (diff) g_fail++;
    printf("%-16s tp %d %-26s %zu of %zu values differ (%d steps x %d seqs)  %s\n", name, tp, what, diff, n, T1,
           GRAPH_SEQS, diff ? "FAIL" : "PASS");
}

/* The graph engine ran its decode steps as graphs (the first step or two
 * may run eagerly: a capture that had to grow a buffer is retried), the
 * eager engine none. */
static void check_graph_steps(const char *name, int tp, const char *what, const float *graph, long g1, long g2,
                              int T2) {
    g_checks++;
    int used = graph && g2 >= T2 - 2 && g2 > 0 && g1 == 0;
    if (!used) g_fail++;
    printf("%-16s tp %d %-26s %ld of %d decode steps (eager engine: %ld)  %s\n", name, tp, what, g2, T2, g1,
           used ? "PASS" : "FAIL");
}

/* One rank's graph launch fails mid-decode (tp > 1 over nccl, graphs on;
 * the emulator's hooks): that step fails, the engine aborts the world,
 * drops every rank's graphs (NCCL frees the aborted communicators only
 * once they are gone) and re-creates the communicators; the step run again
 * and every later one give the eager run's bits, and decode steps go
 * through graphs again. Without the drop the re-creation would wait for
 * the graphs and leave the world dead; ending the communicators in place
 * would wait for them for ever. And one rank's capture fails (its
 * instantiation): the ranks' votes differ (echo_vote), so every rank drops
 * its graph and runs that step eagerly: no failure, no reset, the eager
 * bits, graphs from the next step. */
static void check_graph_fault(const char *dir, const char *name, int tp, const prompt *ps, int np, int V, int max_len,
                              const float *eager, int T1) {
    for (int inst = 0; inst < 2; inst++) {
        const char *what = inst ? "rank's capture fails" : "rank fails in a graph";
        if (!(inst ? echo_emu_fail_graph_instantiate : echo_emu_fail_graph_launch)) {
            printf("%-16s tp %d %-26s skipped: needs tests/emu's fault hook\n", name, tp, what);
            continue;
        }
        /* a launch fails at a replay (step 2); a capture at the first decode
         * step (later ones replay) */
        fault f = {.step = inst ? 0 : 2, .device = tp - 1, .instantiate = inst};
        int T = 0;
        long g = 0;
        float *l = decode_steps_tp(dir, "cuda", tp, ECHO_PRESET_ECHO, 1, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V, max_len,
                                   &T, &g, &f);
        if (f.failed) printf("%-16s tp %d %-26s the failed step said: %s\n", name, tp, what, f.err);
        /* a failed launch: one failed step, one reset, graphs again from the
         * step run again; a failed capture: the ranks' votes differ, every
         * rank runs the step eagerly, nothing fails, graphs from the next.
         * Exactly: a stale error (a failed call left as the thread's last
         * error, then reported by the next launch check) costs one more
         * step eagerly. */
        int ok = inst ? f.failed == 0 && f.resets == 0 && f.graphs_after == T - f.step - 1
                      : f.failed == 1 && strstr(f.err, "launch") && f.resets == 1 && f.graphs_after == T - f.step;
        ok &= l != NULL;
        g_checks++;
        if (!ok) g_fail++;
        printf("%-16s tp %d %-26s failed steps %d, comm resets %ld, graph steps after %ld of %d  %s\n", name, tp,
               what, f.failed, f.resets, f.graphs_after, T - f.step, ok ? "PASS" : "FAIL");
        check_graph_bits(name, tp, inst ? "after a lost capture == eager" : "after the failure == eager", eager, l, T1,
                         T, V);
        free(l);
    }
}

/* The world cannot be re-armed: one rank's graph launch fails mid-decode
 * and re-creating the communicators fails too. The step fails, the engine
 * says it is unusable (eng_usable, with the reason: what a server reports
 * on /health), and the next step fails at once with that reason instead of
 * hanging. */
static void check_dead_world(const char *dir, const char *name, int tp, const prompt *ps, int V) {
    const char *what = "world dead after a failure";
    if (!echo_emu_fail_graph_launch || !echo_emu_fail_comm_init) {
        printf("%-16s tp %d %-26s skipped: needs tests/emu's fault hooks\n", name, tp, what);
        return;
    }
    char err[1024] = "", why[512] = "", err2[1024] = "";
    eng_config c = {.model_dir = dir, .device = "cuda", .tp = tp, .allreduce = ECHO_PRESET_ECHO, .max_model_len = 256,
                    .max_num_seqs = 1, .threads = 0, .cuda_graphs = 1};
    eng *e = NULL;
    int seq = -1, ok = eng_create(&c, &e, err, sizeof err) == 0 && eng_seq_new(e, &seq, err, sizeof err) == 0;
    float *l = ok ? malloc((size_t)V * sizeof *l) : NULL;
    eng_item it = {seq, ps->ids, ps->n_prompt, ENG_LOGITS_LAST};
    ok = ok && l && eng_step(e, &it, 1, l, err, sizeof err) == 0;
    int usable0 = ok && eng_usable(e, why, sizeof why), failed = 0;
    for (int t = 0; ok && t < 3; t++) { /* graphs from the first decode step */
        it = (eng_item){seq, ps->ids + ps->n_prompt + t, 1, ENG_LOGITS_LAST};
        ok = eng_step(e, &it, 1, l, err, sizeof err) == 0;
    }
    if (ok) {
        echo_emu_fail_graph_launch(tp - 1, 0);
        echo_emu_fail_comm_init(0);
        it = (eng_item){seq, ps->ids + ps->n_prompt + 3, 1, ENG_LOGITS_LAST};
        failed = eng_step(e, &it, 1, l, err, sizeof err) != 0;
        echo_emu_fail_graph_launch(-1, 0);
        echo_emu_fail_comm_init(-1);
        failed += eng_step(e, &it, 1, l, err2, sizeof err2) != 0;
    }
    int usable1 = e ? eng_usable(e, why, sizeof why) : 1;
    int pass = ok && usable0 && failed == 2 && !usable1 && strstr(why, "re-creating the communicators") &&
               strstr(err2, "re-creating the communicators") && eng_comm_resets(e) == 1;
    g_checks++;
    if (!pass) g_fail++;
    printf("%-16s tp %d %-26s usable %d -> %d (%s); next step: %.120s  %s\n", name, tp, what, usable0, usable1, why,
           err2, pass ? "PASS" : "FAIL");
    if (!ok) printf("  set-up: %s\n", err);
    free(l);
    if (seq >= 0) eng_seq_free(e, seq);
    eng_destroy(e);
}

/* Graphs at tp > 1: the decode steps with their all-reduces (echo mode, so
 * residuals and the codec are inside the graph) captured on the nccl
 * transport (one GPU per rank; the local transport cannot be captured), on
 * == off bit for bit, and the steps ran as graphs on every... rank 0 (the
 * engine's count). */
static void test_graphs_tp(const char *dir, const char *name, const model_config *mc, const prompt *ps, int np, int V,
                           int max_len) {
    for (int tp = 2; tp <= 4; tp *= 2) {
        const char *w1 = "graphs == eager, nccl echo", *w3 = "graph steps, nccl";
        if (mc->num_heads % tp || (mc->num_kv_heads % tp && tp % mc->num_kv_heads)) {
            printf("%-16s tp %d %-26s skipped: %d/%d heads do not split %d ways\n", name, tp, w1, mc->num_heads,
                   mc->num_kv_heads, tp);
            continue;
        }
        if (kern_gpu_count() < tp) {
            printf("%-16s tp %d %-26s skipped: needs %d GPUs for nccl, %d visible\n", name, tp, w1, tp,
                   kern_gpu_count());
            continue;
        }
        int T1 = 0, T2 = 0;
        long g1 = 0, g2 = 0;
        float *eager = decode_steps_tp(dir, "cuda", tp, ECHO_PRESET_ECHO, 0, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V,
                                       max_len, &T1, &g1, NULL);
        float *graph = decode_steps_tp(dir, "cuda", tp, ECHO_PRESET_ECHO, 1, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V,
                                       max_len, &T2, &g2, NULL);
        check_graph_bits(name, tp, w1, eager, graph, T1, T2, V);
        check_graph_steps(name, tp, w3, graph, g1, g2, T2);
        check_graph_fault(dir, name, tp, ps, np, V, max_len, eager, T1);
        check_dead_world(dir, name, tp, ps, V);
        free(eager);
        free(graph);
    }
}

static void test_graphs(const char *dir, const char *name, const char *dev, const prompt *ps, int np, int V,
                        int max_len, double tol) {
    const char *w1 = "graphs == eager (bits)", *w2 = "graphs vs cpu (decode)", *w3 = "graph steps";
    if (strcmp(dev, "cuda") != 0) {
        /* the harness still runs (the flag is a no-op there) */
        int T = 0;
        long g = 0;
        float *l = np > 0 ? decode_steps(dir, dev, 1, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V, 256, &T, &g) : NULL;
        if (!l || g != 0) fail_line(name, 1, "decode steps (harness)");
        free(l);
        printf("%-16s tp 1 %-26s skipped: no graphs on %s\n", name, w1, dev);
        printf("%-16s tp 1 %-26s skipped: no graphs on %s\n", name, w2, dev);
        printf("%-16s tp 1 %-26s skipped: no graphs on %s\n", name, w3, dev);
        return;
    }
    if (np < 1) {
        fail_line(name, 1, w1);
        return;
    }
    int T0 = 0, T1 = 0, T2 = 0;
    long g0 = 0, g1 = 0, g2 = 0;
    /* max_model_len up to 1024: a long table capacity for short rows (the
     * fixtures' head dims take the simple kernel, whose tables graph mode
     * pads to the capacity) */
    float *cpu = decode_steps(dir, "cpu", 0, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V, max_len, &T0, &g0);
    float *eager = decode_steps(dir, dev, 0, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V, max_len, &T1, &g1);
    float *graph = decode_steps(dir, dev, 1, ENG_FUSE_AUTO, GRAPH_SEQS, ps, np, V, max_len, &T2, &g2);
    check_graph_bits(name, 1, w1, eager, graph, T1, T2, V);
    if (!graph || !cpu || T0 != T2)
        fail_line(name, 1, w2);
    else
        report(name, 1, w2, rel_err(graph, cpu, (size_t)T2 * GRAPH_SEQS * V), tol, 1);
    check_graph_steps(name, 1, w3, graph, g1, g2, T2);
    free(cpu);
    free(eager);
    free(graph);
}

/* Fused decode weights (eng_config.fuse_weights): one sequence decoding
 * one token per step, so every decode step runs the fused q|k|v and
 * gate|up matmuls. Fused vs unfused within TOL (on cuda cuBLASLt may pick
 * another algorithm for the fused shape; on cpu they are bit-identical),
 * fused vs the cpu within the model's limit, and fused steps through graphs bit-identical
 * to fused eager steps (the fused path captures like the unfused one). */
static void test_fused(const char *dir, const char *name, const char *dev, const prompt *ps, int np, int V,
                       int max_len, double tol) {
    const char *w1 = "fused vs unfused (decode)", *w2 = "fused vs cpu (decode)", *w3 = "fused graphs == eager";
    int T[4] = {0, 0, 0, 0};
    long g[4] = {0, 0, 0, 0};
    float *l[4] = {NULL, NULL, NULL, NULL};
    if (np >= 1) {
        l[0] = decode_steps(dir, dev, 0, ENG_FUSE_OFF, 1, ps, np, V, max_len, &T[0], &g[0]);
        l[1] = decode_steps(dir, dev, 0, ENG_FUSE_ON, 1, ps, np, V, max_len, &T[1], &g[1]);
        l[2] = decode_steps(dir, dev, 1, ENG_FUSE_ON, 1, ps, np, V, max_len, &T[2], &g[2]);
        l[3] = decode_steps(dir, "cpu", 0, ENG_FUSE_OFF, 1, ps, np, V, max_len, &T[3], &g[3]);
    }
    if (!l[0] || !l[1] || T[0] != T[1])
        fail_line(name, 1, w1);
    else
        report(name, 1, w1, rel_err(l[1], l[0], (size_t)T[1] * V), TOL, 1);
    if (!l[1] || !l[3] || T[1] != T[3])
        fail_line(name, 1, w2);
    else
        report(name, 1, w2, rel_err(l[1], l[3], (size_t)T[1] * V), tol, 1);
    if (!l[1] || !l[2] || T[1] != T[2]) {
        fail_line(name, 1, w3);
    } else {
        size_t n = (size_t)T[1] * V, diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&l[1][i], &l[2][i], sizeof *l[1]) != 0;
        g_checks++;
        if (diff) g_fail++;
        printf("%-16s tp 1 %-26s %zu of %zu values differ (%d steps, %ld as graphs)  %s\n", name, w3, diff, n, T[1],
               g[2], diff ? "FAIL" : "PASS");
    }
    for (int i = 0; i < 4; i++)
        free(l[i]);
}

/* The fast attention paths (head_dim 128) under graphs: a random
 * Qwen3-0.6B-shaped model (4 layers) in GPU memory, three sequences of 700,
 * 300 and 20 prompt tokens in a 2048-position table (8 decode splits of
 * 256 keys: the short rows' later splits are empty), 24 decode steps:
 * graphs on == off bit for bit, and the steps ran as graphs. With --emu:
 * random:tiny-hd128 (2 layers, vocab 512), prompts of 300, 100 and 20
 * tokens, 6 decode steps. */
static void test_graphs_random(const char *dev) {
    /* --emu: the same paths on random:tiny-hd128 (head_dim 128, vocab 512,
     * 2 layers) with shorter prompts and fewer steps; the 2048-position
     * table still splits every decode row (empty splits included) */
    const char *spec = g_emu ? "random:tiny-hd128,seed=7" : "random:qwen3-0.6b,layers=4,seed=7";
    const char *name = g_emu ? "rand-hd128-2L" : "rand-0.6b-4L";
    if (strcmp(dev, "cuda") != 0) {
        printf("%-16s tp 1 %-26s skipped: no graphs on %s\n", name, "graphs == eager (bits)", dev);
        printf("%-16s tp 1 %-26s skipped: no graphs on %s\n", name, "graph steps", dev);
        return;
    }
    model_config mc;
    char err[512];
    if (model_random_parse(spec, &mc, NULL, err, sizeof err)) {
        printf("%s: %s\n", spec, err);
        fail_line(name, 1, "graphs == eager (bits)");
        return;
    }
    const int V = mc.vocab_size, greedy = g_emu ? 6 : 24;
    const int lens[GRAPH_SEQS] = {g_emu ? 300 : 700, g_emu ? 100 : 300, 20};
    prompt ps[GRAPH_SEQS];
    uint32_t x = 12345u;
    for (int k = 0; k < GRAPH_SEQS; k++) {
        ps[k].n_prompt = lens[k];
        ps[k].n_greedy = greedy;
        ps[k].ids = malloc((size_t)(lens[k] + greedy) * sizeof *ps[k].ids);
        for (int i = 0; i < lens[k] + greedy; i++) {
            x = x * 1664525u + 1013904223u;
            ps[k].ids[i] = (int32_t)((x >> 8) % (uint32_t)V);
        }
    }
    int T1 = 0, T2 = 0;
    long g1 = 0, g2 = 0;
    float *eager = decode_steps(spec, dev, 0, ENG_FUSE_AUTO, GRAPH_SEQS, ps, GRAPH_SEQS, V, 2048, &T1, &g1);
    float *graph = decode_steps(spec, dev, 1, ENG_FUSE_AUTO, GRAPH_SEQS, ps, GRAPH_SEQS, V, 2048, &T2, &g2);
    check_graph_bits(name, 1, "graphs == eager (bits)", eager, graph, T1, T2, V);
    check_graph_steps(name, 1, "graph steps", graph, g1, g2, T2);
    free(eager);
    free(graph);
    for (int k = 0; k < GRAPH_SEQS; k++)
        free(ps[k].ids);
}

static void test_model(const char *dir, const char *dev) {
    char label[512];
    snprintf(label, sizeof label, "%s", dir);
    size_t ll = strlen(label);
    if (ll > 11 && !strcmp(label + ll - 11, "/model.gguf")) label[ll - 11] = 0; /* name GGUF fixtures by folder */
    const char *name = strrchr(label, '/') ? strrchr(label, '/') + 1 : label;
    prompt *ps = NULL;
    int np = 0;
    double tol = TOL;
    model_config mc;
    char err[1024];
    if (model_config_load(dir, &mc, err, sizeof err) || load_prompts(dir, &ps, &np, &tol)) {
        fail_line(name, 1, "load");
        return;
    }
    const int V = mc.vocab_size;
    if (g_emu && (mc.num_layers > EMU_MAX_LAYERS || V > EMU_MAX_VOCAB)) {
        printf("%-16s tp * %-26s skipped (--emu: too large to emulate: %d layers, vocab %d)\n", name, "every check",
               mc.num_layers, V);
        for (int i = 0; i < np; i++)
            free(ps[i].ids);
        free(ps);
        return;
    }
    const int npr = g_emu && np > 1 ? 1 : np; /* prompts through the tp comparisons */
    float **ref = calloc((size_t)np, sizeof *ref), **dev1 = calloc((size_t)np, sizeof *dev1);
    eng *cpu = open_engine(dir, "cpu", 1, ECHO_PRESET_EXACT);
    for (int i = 0; cpu && i < npr; i++) ref[i] = all_logits(cpu, &ps[i], V);
    eng_destroy(cpu);

    static const struct {
        int tp;
        echo_preset mode;
    } runs[] = {{1, ECHO_PRESET_EXACT}, {2, ECHO_PRESET_EXACT}, {3, ECHO_PRESET_EXACT}, {4, ECHO_PRESET_EXACT},
                {4, ECHO_PRESET_ECHO}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        int tp = runs[r].tp;
        char what[64];
        snprintf(what, sizeof what, "%s %s vs %s", dev, echo_preset_name(runs[r].mode),
                 runs[r].mode == ECHO_PRESET_ECHO ? "exact" : "cpu");
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
        float **exact4 = runs[r].mode == ECHO_PRESET_ECHO ? dev1 : NULL; /* dev1 holds tp 4 exact by then */
        for (int i = 0; i < npr && ok; i++) {
            float *l = all_logits(e, &ps[i], V);
            const float *base = exact4 ? exact4[i] : ref[i];
            if (!l || !base) {
                ok = 0;
                free(l);
                break;
            }
            double re = rel_err(l, base, (size_t)(ps[i].n_prompt + ps[i].n_greedy) * V);
            worst = re > worst ? re : worst;
            if (tp == 4 && runs[r].mode == ECHO_PRESET_EXACT) {
                free(dev1[i]); /* keep tp 4 exact for the echo comparison */
                dev1[i] = l;
            } else {
                free(l);
            }
        }
        if (!ok)
            fail_line(name, tp, what);
        else
            report(name, tp, what, worst, tol, runs[r].mode != ECHO_PRESET_ECHO);
        if (tp == 1 && ok && g_emu) {
            printf("%-16s tp 1 %-26s skipped (--emu: too large to emulate)\n", name, "greedy vs HF");
        } else if (tp == 1 && ok) { /* greedy agreement with HF, reported */
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
    test_graphs(dir, name, dev, ps, np, V, mc.max_position_embeddings < 1024 ? mc.max_position_embeddings : 1024,
                tol);
    if (!strcmp(dev, "cuda") && np > 0)
        test_graphs_tp(dir, name, &mc, ps, np, V, mc.max_position_embeddings < 256 ? mc.max_position_embeddings : 256);
    test_fused(dir, name, dev, ps, np, V, mc.max_position_embeddings < 256 ? mc.max_position_embeddings : 256,
               tol);
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
        } else if (!strcmp(argv[i], "--emu")) {
            g_emu = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--self-check] [--emu] [MODEL_DIR ...]\n", argv[0]);
            return 2;
        } else if (n < MAX_MODELS) {
            snprintf(dirs[n++], sizeof dirs[0], "%s", argv[i]);
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when the output is a pipe or a log */
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
            if (stat(cfg, &st) != 0) continue;
            /* a GGUF fixture is opened as its model.gguf */
            snprintf(cfg, sizeof cfg, "%s/%s/model.gguf", MODELS_DIR, de->d_name);
            int gguf = stat(cfg, &st) == 0;
            snprintf(dirs[n++], sizeof dirs[0], "%s/%s%s", MODELS_DIR, de->d_name, gguf ? "/model.gguf" : "");
        }
        if (d) closedir(d);
        qsort(dirs, (size_t)n, sizeof dirs[0], (int (*)(const void *, const void *))strcmp);
    }
    if (n == 0) {
        printf("no fixture models under %s (run from the repository root)\n", MODELS_DIR);
        return 1;
    }
    printf("device %s vs cpu, limit max(%.0e, the fixture's hf_bf16_max_rel_err), %d models\n", dev, TOL, n);
    for (int i = 0; i < n; i++) test_model(dirs[i], dev);
    test_graphs_random(dev);
    printf("%d of %d checks passed\n", g_checks - g_fail, g_checks);
    return g_fail ? 1 : 0;
}
