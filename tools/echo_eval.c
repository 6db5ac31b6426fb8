/*
 * echo-eval: how much accuracy the quantized all-reduces cost. Runs the same
 * prompts through the same tensor-parallel model with the exact, int4 and
 * echo all-reduce and compares each with exact: KL of next-token
 * distributions, top-1 agreement, greedy-continuation agreement, and the
 * relative residual-stream error after every layer (the error-vs-depth
 * curve that Echo's error feedback is meant to keep flat).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"

#define PROG "echo-eval"

static const char *USAGE =
    "usage: echo-eval --model DIR --tp N (--prompts FILE | --random-prompts K) [options]\n"
    "\n"
    "Compare the int4 and echo all-reduce against exact on the same prompts.\n"
    "\n"
    "  --model DIR          Hugging Face Qwen3 folder\n"
    "  --tp N               tensor-parallel ranks (>= 2; the all-reduce only exists then)\n"
    "  --prompts FILE       JSONL: each line a JSON array of token ids, or a JSON string\n"
    "                       (encoded with the model folder's tokenizer)\n"
    "  --random-prompts K   K random prompts instead (ids uniform over the vocabulary)\n"
    "  --prompt-len L       length of random prompts (default 64)\n"
    "  --seed S             seed of random prompts (default 1)\n"
    "  --gen-tokens G       greedy continuation length compared (default 32)\n"
    "  --modes LIST         comma-separated subset of int4,echo (default int4,echo)\n"
    "  --echo-min-bytes N   size policy of the quantized modes (default 0)\n"
    "  --echo-group G       values per scale group (default: comm/ default)\n"
    "  --threads N          cpu threads in total (default: all)\n"
    "  --json               print one JSON object instead of tables\n"
    "  -h, --help           this help\n";

typedef struct prompt {
    int32_t *ids;
    int n;
} prompt;

static int load_prompts(const char *path, const char *model_dir, int vocab, prompt **out, int *count, char *err,
                        size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    tok_tokenizer *tok = NULL;
    prompt *ps = NULL;
    int n = 0, rc = -1, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == 0) continue;
        json_error_t je;
        json_t *j = json_loads(line, JSON_DECODE_ANY, &je);
        prompt p = {NULL, 0};
        if (json_is_array(j) && json_array_size(j) > 0) {
            p.n = (int)json_array_size(j);
            p.ids = malloc((size_t)p.n * sizeof *p.ids);
            for (int i = 0; p.ids && i < p.n; i++) {
                json_t *v = json_array_get(j, (size_t)i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
                    snprintf(err, errlen, "%s:%d: token %d is not an id in [0, %d)", path, lineno, i, vocab);
                    json_decref(j);
                    free(p.ids);
                    goto out;
                }
                p.ids[i] = (int32_t)json_integer_value(v);
            }
        } else if (json_is_string(j)) {
            if (!tok && tok_load_dir(model_dir, &tok, err, errlen)) {
                json_decref(j);
                goto out;
            }
            size_t nn;
            if (tok_encode(tok, json_string_value(j), json_string_length(j), 0, &p.ids, &nn, err, errlen)) {
                json_decref(j);
                goto out;
            }
            p.n = (int)nn;
        } else {
            snprintf(err, errlen, "%s:%d: expected a JSON array of ids or a string", path, lineno);
            json_decref(j);
            goto out;
        }
        json_decref(j);
        if (p.n == 0) {
            free(p.ids);
            continue;
        }
        prompt *np = realloc(ps, (size_t)(n + 1) * sizeof *ps);
        if (!np) {
            free(p.ids);
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        ps = np;
        ps[n++] = p;
    }
    if (n == 0) {
        snprintf(err, errlen, "%s: no prompts", path);
        goto out;
    }
    rc = 0;
out:
    free(line);
    fclose(f);
    tok_free(tok);
    if (rc) {
        for (int i = 0; i < n; i++) free(ps[i].ids);
        free(ps);
        ps = NULL;
        n = 0;
    }
    *out = ps;
    *count = n;
    return rc;
}

/* What one mode produced for one prompt. */
typedef struct run {
    float *logits; /* (n, vocab): next-token logits at every prompt position */
    float *states; /* (layers, n, hidden) */
    int32_t *greedy;
} run;

static int run_prompt(eng *e, const prompt *p, int gen, run *r, char *err, size_t errlen) {
    const model_config *c = eng_model_config(e);
    int seq;
    if (eng_seq_new(e, &seq, err, errlen)) return -1;
    eng_item it = {seq, p->ids, p->n, ENG_LOGITS_ALL};
    int rc = eng_step_states(e, &it, 1, r->logits, r->states, err, errlen);
    float *last = malloc((size_t)c->vocab_size * sizeof *last);
    if (!last) rc = -1;
    if (!rc) memcpy(last, r->logits + (size_t)(p->n - 1) * c->vocab_size, (size_t)c->vocab_size * sizeof *last);
    eng_sampling greedy = {.temperature = 0, .top_p = 1};
    for (int t = 0; !rc && t < gen; t++) {
        r->greedy[t] = eng_sample(last, c->vocab_size, &greedy, NULL);
        if (t + 1 == gen) break;
        it = (eng_item){seq, &r->greedy[t], 1, ENG_LOGITS_LAST};
        rc = eng_step(e, &it, 1, last, err, errlen);
    }
    free(last);
    eng_seq_free(e, seq);
    return rc;
}

typedef struct mode_acc {
    echo_mode mode;
    double kl_sum, kl_max;
    long positions, top1_agree;
    double agree_len_sum;
    long full_agree;
    double *layer_num, *layer_den; /* per layer: sum ||h_mode - h_exact||^2, ||h_exact||^2 */
} mode_acc;

int main(int argc, char **argv) {
    enum { O_MODEL = 256, O_TP, O_PROMPTS, O_RAND, O_PLEN, O_SEED, O_GEN, O_MODES, O_MINB, O_GROUP, O_THREADS, O_JSON };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},   {"tp", required_argument, 0, O_TP},
        {"prompts", required_argument, 0, O_PROMPTS}, {"random-prompts", required_argument, 0, O_RAND},
        {"prompt-len", required_argument, 0, O_PLEN}, {"seed", required_argument, 0, O_SEED},
        {"gen-tokens", required_argument, 0, O_GEN}, {"modes", required_argument, 0, O_MODES},
        {"echo-min-bytes", required_argument, 0, O_MINB}, {"echo-group", required_argument, 0, O_GROUP},
        {"threads", required_argument, 0, O_THREADS}, {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *prompts_path = NULL, *modes_arg = "int4,echo";
    int tp = 0, n_random = 0, plen = 64, gen = 32, json = 0, c;
    long seed = 1;
    eng_config base = {.max_num_seqs = 1};
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model_dir = optarg; break;
        case O_TP: tp = (int)cli_long(PROG, optarg, "--tp", 2, 64); break;
        case O_PROMPTS: prompts_path = optarg; break;
        case O_RAND: n_random = (int)cli_long(PROG, optarg, "--random-prompts", 1, 100000); break;
        case O_PLEN: plen = (int)cli_long(PROG, optarg, "--prompt-len", 1, 1 << 20); break;
        case O_SEED: seed = cli_long(PROG, optarg, "--seed", 0, 1L << 40); break;
        case O_GEN: gen = (int)cli_long(PROG, optarg, "--gen-tokens", 1, 1 << 16); break;
        case O_MODES: modes_arg = optarg; break;
        case O_MINB: base.echo_min_bytes = (size_t)cli_long(PROG, optarg, "--echo-min-bytes", 0, 1L << 40); break;
        case O_GROUP: base.echo_group = (int)cli_long(PROG, optarg, "--echo-group", 16, 256); break;
        case O_THREADS: base.threads = (int)cli_long(PROG, optarg, "--threads", 1, 1024); break;
        case O_JSON: json = 1; break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: cli_usage_error(PROG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) cli_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
    if (!model_dir) cli_usage_error(PROG, "%s", "--model DIR is required");
    if (!tp) cli_usage_error(PROG, "%s", "--tp N (>= 2) is required");
    if (!prompts_path == !n_random) cli_usage_error(PROG, "%s", "give exactly one of --prompts FILE and --random-prompts K");

    mode_acc acc[2];
    int n_modes = 0;
    {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", modes_arg);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            echo_mode m;
            if (echo_mode_parse(tok, &m) || m == ECHO_MODE_EXACT || n_modes == 2)
                cli_usage_error(PROG, "--modes expects a subset of int4,echo, got '%s'", modes_arg);
            memset(&acc[n_modes], 0, sizeof acc[n_modes]);
            acc[n_modes++].mode = m;
        }
    }

    char err[1024];
    model_config mc;
    prompt *ps = NULL;
    int np = 0, rc = 1, maxlen = 0;
    eng *eng_exact = NULL, *eng_mode[2] = {NULL, NULL};
    run rx = {0}, rm = {0};
    if (model_config_load(model_dir, &mc, err, sizeof err)) goto fail;
    if (prompts_path) {
        if (load_prompts(prompts_path, model_dir, mc.vocab_size, &ps, &np, err, sizeof err)) goto fail;
    } else {
        np = n_random;
        ps = calloc((size_t)np, sizeof *ps);
        uint64_t s = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
        for (int i = 0; ps && i < np; i++) {
            ps[i].n = plen;
            ps[i].ids = malloc((size_t)plen * sizeof(int32_t));
            for (int k = 0; ps[i].ids && k < plen; k++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                ps[i].ids[k] = (int32_t)(s % (uint64_t)mc.vocab_size);
            }
        }
    }
    for (int i = 0; i < np; i++) maxlen = ps[i].n > maxlen ? ps[i].n : maxlen;
    base.model_dir = model_dir;
    base.tp = tp;
    base.max_model_len = maxlen + gen;
    base.max_batch_tokens = maxlen;
    eng_config cx = base;
    cx.allreduce = ECHO_MODE_EXACT;
    if (eng_create(&cx, &eng_exact, err, sizeof err)) goto fail;
    for (int k = 0; k < n_modes; k++) {
        eng_config cm = base;
        cm.allreduce = acc[k].mode;
        if (eng_create(&cm, &eng_mode[k], err, sizeof err)) goto fail;
        acc[k].layer_num = calloc((size_t)mc.num_layers, sizeof(double));
        acc[k].layer_den = calloc((size_t)mc.num_layers, sizeof(double));
    }
    size_t V = (size_t)mc.vocab_size, H = (size_t)mc.hidden_size, L = (size_t)mc.num_layers;
    rx.logits = malloc((size_t)maxlen * V * sizeof(float));
    rm.logits = malloc((size_t)maxlen * V * sizeof(float));
    rx.states = malloc(L * maxlen * H * sizeof(float));
    rm.states = malloc(L * maxlen * H * sizeof(float));
    rx.greedy = malloc((size_t)gen * sizeof(int32_t));
    rm.greedy = malloc((size_t)gen * sizeof(int32_t));
    double *lpx = malloc(V * sizeof(double)), *lpm = malloc(V * sizeof(double));
    if (!rx.logits || !rm.logits || !rx.states || !rm.states || !rx.greedy || !rm.greedy || !lpx || !lpm) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < np; i++) {
        if (run_prompt(eng_exact, &ps[i], gen, &rx, err, sizeof err)) goto fail;
        for (int k = 0; k < n_modes; k++) {
            mode_acc *a = &acc[k];
            if (run_prompt(eng_mode[k], &ps[i], gen, &rm, err, sizeof err)) goto fail;
            for (int t = 0; t < ps[i].n; t++) {
                const float *lx = rx.logits + (size_t)t * V, *lm = rm.logits + (size_t)t * V;
                eng_log_softmax(lx, (int)V, lpx);
                eng_log_softmax(lm, (int)V, lpm);
                double kl = 0;
                size_t bx = 0, bm = 0;
                for (size_t v = 0; v < V; v++) {
                    kl += exp(lpx[v]) * (lpx[v] - lpm[v]);
                    if (lx[v] > lx[bx]) bx = v;
                    if (lm[v] > lm[bm]) bm = v;
                }
                a->kl_sum += kl;
                if (kl > a->kl_max) a->kl_max = kl;
                a->positions++;
                a->top1_agree += bx == bm;
            }
            int agree = 0;
            while (agree < gen && rx.greedy[agree] == rm.greedy[agree]) agree++;
            a->agree_len_sum += agree;
            a->full_agree += agree == gen;
            for (size_t l = 0; l < L; l++) {
                const float *hx = rx.states + l * ps[i].n * H, *hm = rm.states + l * ps[i].n * H;
                for (size_t q = 0; q < (size_t)ps[i].n * H; q++) {
                    double d = (double)hm[q] - hx[q];
                    a->layer_num[l] += d * d;
                    a->layer_den[l] += (double)hx[q] * hx[q];
                }
            }
        }
    }
    if (json) {
        json_t *root = json_pack("{s:s,s:i,s:i,s:i,s:i}", "model", model_dir, "tp", tp, "prompts", np, "gen_tokens",
                                 gen, "layers", (int)L);
        json_t *modes = json_array();
        for (int k = 0; k < n_modes; k++) {
            mode_acc *a = &acc[k];
            json_t *layers = json_array();
            for (size_t l = 0; l < L; l++)
                json_array_append_new(layers, json_real(sqrt(a->layer_num[l] / (a->layer_den[l] + 1e-300))));
            json_array_append_new(
                modes, json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:o}", "mode", echo_mode_name(a->mode), "kl_mean",
                                 a->kl_sum / (double)a->positions, "kl_max", a->kl_max, "top1_agreement",
                                 (double)a->top1_agree / (double)a->positions, "greedy_agree_len_mean",
                                 a->agree_len_sum / np, "greedy_full_agree_frac", (double)a->full_agree / np,
                                 "layer_rel_err", layers));
        }
        json_object_set_new(root, "modes", modes);
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
        puts(s ? s : "{}");
        free(s);
        json_decref(root);
    } else {
        printf("echo-eval: %s, tp %d, %d prompts (%d..%d tokens), %d greedy tokens, %d layers\n\n", model_dir, tp, np,
               ps[0].n, maxlen, gen, (int)L);
        printf("%-6s %12s %12s %10s %18s %12s\n", "mode", "KL mean", "KL max", "top-1", "greedy agree len",
               "full agree");
        for (int k = 0; k < n_modes; k++) {
            mode_acc *a = &acc[k];
            printf("%-6s %12.3e %12.3e %9.2f%% %12.1f / %-4d %11.0f%%\n", echo_mode_name(a->mode),
                   a->kl_sum / (double)a->positions, a->kl_max, 100.0 * (double)a->top1_agree / (double)a->positions,
                   a->agree_len_sum / np, gen, 100.0 * (double)a->full_agree / np);
        }
        printf("\nresidual-stream error after each layer, ||h_mode - h_exact|| / ||h_exact||\n%-6s", "layer");
        for (int k = 0; k < n_modes; k++) printf(" %12s", echo_mode_name(acc[k].mode));
        printf("\n");
        for (size_t l = 0; l < L; l++) {
            printf("%-6zu", l);
            for (int k = 0; k < n_modes; k++)
                printf(" %12.3e", sqrt(acc[k].layer_num[l] / (acc[k].layer_den[l] + 1e-300)));
            printf("\n");
        }
    }
    rc = 0;
    free(lpx);
    free(lpm);
fail:
    if (rc) fprintf(stderr, "echo-eval: error: %s\n", err);
    free(rx.logits);
    free(rm.logits);
    free(rx.states);
    free(rm.states);
    free(rx.greedy);
    free(rm.greedy);
    for (int k = 0; k < n_modes; k++) {
        free(acc[k].layer_num);
        free(acc[k].layer_den);
        eng_destroy(eng_mode[k]);
    }
    eng_destroy(eng_exact);
    for (int i = 0; i < np; i++) free(ps[i].ids);
    free(ps);
    return rc;
}
