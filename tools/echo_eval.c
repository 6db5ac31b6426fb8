/*
 * echo-eval: how much accuracy the quantized all-reduces cost. Runs the same
 * prompts through the same tensor-parallel model with the exact all-reduce
 * and with each variant (echo / echo-nofb / int4 / bf16 x codec x group size
 * x size policy) and
 * reports, teacher-forced on the prompts' own next tokens, perplexity and
 * next-token top-1 accuracy (the paper's unit: points), and against exact:
 * KL of next-token distributions, top-1 agreement, greedy-continuation
 * agreement (all prompts decoded as one batch), and the relative
 * residual-stream error after every layer (the error-vs-depth curve that
 * Echo's error feedback is meant to keep flat).
 *
 * --prefix-cache P: each prompt's first P tokens are computed in an earlier
 * pass of their own and the rest on top of their cached KV blocks (the
 * engine's prefix cache, as a server reuses a shared system prompt), in
 * every mode: exact gives the bits of one pass (the cache is exact), a
 * lossy all-reduce gives what its cache hits would.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/report.h"
#include "engine/sample.h"
#include "engine/seq.h"
#include "kernels/kv.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"

#define PROG "echo-eval"

static const char *USAGE =
    "usage: echo-eval --model PATH --tp N (--text FILE | --prompts FILE | --random-prompts K) [options]\n"
    "\n"
    "Compare the quantized all-reduce presets against exact on the same prompts.\n"
    "\n"
    "  --model PATH         model folder or GGUF file\n"
    "  --tp N               tensor-parallel ranks (1: exact only, the reference perplexity)\n"
    "  --text FILE          UTF-8 text, tokenized with the model's tokenizer and cut into\n"
    "                       prompts of --prompt-len tokens (at most --max-prompts)\n"
    "  --prompts FILE       JSONL: each line a JSON array of token ids, or a JSON string\n"
    "                       (encoded with the model's tokenizer)\n"
    "  --random-prompts K   K random prompts instead (ids uniform over the vocabulary)\n"
    "  --prompt-len L       length of random / --text prompts (default 64)\n"
    "  --max-prompts K      --text: at most K prompts (default 50)\n"
    "  --seed S             seed of random prompts (default 1)\n"
    "  --gen-tokens G       greedy continuation length compared (default 32)\n"
    "  --modes LIST         comma-separated subset of echo,echo-nofb,int4,bf16,echo3 (default echo,echo-nofb):\n"
    "                       echo-nofb is echo's codec without error feedback; int4 the paper's codec;\n"
    "                       echo3 hnf3-g256 with feedback and the last call in bf16 (3.46 bits/value)\n"
    "                       (at the groups of --codecs' int4 entries, else G 64)\n"
    "  --echo-min-bytes LIST  size policies of the quantized modes, e.g. 0,65536 (default 0)\n"
    "  --echo-group LIST    values per scale group, e.g. 32,64,128 (default: comm/ default)\n"
    "  --codecs LIST        codecs of the quantized modes, NAME or NAME-gG, e.g.\n"
    "                       int4-g64,hadamard-g32 (a NAME without -gG takes each --echo-group;\n"
    "                       default: comm/ default codec)\n"
    "  --prefix-cache P     compute each prompt's first P tokens in an earlier pass and the rest\n"
    "                       on their cached KV blocks (the prefix cache's reuse; default 0: one pass)\n"
    "  --threads N          cpu threads in total (default: all)\n"
    "  --act-quant auto|none|q8_0  8-bit activations on the quantized matrices (cpu; echo-serve's\n"
    "                       flag, same default auto: a GGUF's quantized matrices take them)\n"
    "  --kv-cache-dtype auto|fp32|bf16|fp16|q8_0  the KV cache of every run (default auto: bf16)\n"
    "  --ref-kv-cache-dtype T  the exact reference's KV cache instead (default: --kv-cache-dtype);\n"
    "                       then 'exact' may be a mode (at --tp 1 too): the KV type's own cost\n"
    "  --overlap auto|off|N prefill overlap of every run (engine.h eng_config.overlap; prompts of\n"
    "                       >= 128 tokens as N micro-batches; auto: 2 under mpirun, else off)\n"
    "  --rope-scaling SPEC  replace the config's rope scaling: none, yarn:FACTOR[:ORIG_CONTEXT]\n"
    "                       (e.g. yarn:4: Qwen3 to 131,072 tokens; ORIG_CONTEXT default: the\n"
    "                       config's max_position_embeddings) or a JSON rope_scaling object.\n"
    "                       Default: the config's own (Qwen: turn YaRN on only for long inputs)\n"
    "  --json               print one JSON object instead of tables\n"
    "  --logprobs-out FILE  also write JSONL, one line per all-reduce and prompt:\n"
    "                       {\"mode\",\"codec\",\"group\",\"prompt\",\"token_logprobs\":[log p of token t+1\n"
    "                       at t, as fp32],\"last_top\":[[id, log p] x 5 after the last token]}\n"
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
            if (!tok && eng_tokenizer_load(model_dir, &tok, NULL, err, errlen)) {
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
        for (int i = 0; i < n; i++)
            free(ps[i].ids);
        free(ps);
        ps = NULL;
        n = 0;
    }
    *out = ps;
    *count = n;
    return rc;
}

/* --text: the whole file tokenized once, cut into prompts of `len` tokens. */
static int load_text(const char *path, const char *model_dir, int len, int max_prompts, prompt **out, int *count,
                     char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 > cap) {
            char *t = realloc(text, cap = 2 * cap + 65536);
            if (!t) break;
            text = t;
        }
        size_t r = fread(text + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    tok_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t nid = 0;
    int rc = -1;
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    if (eng_tokenizer_load(model_dir, &tok, NULL, err, errlen)) goto out;
    if (tok_encode(tok, text, n, 0, &ids, &nid, err, errlen)) goto out;
    int k = (int)(nid / (size_t)len);
    if (k > max_prompts) k = max_prompts;
    if (k < 1) {
        snprintf(err, errlen, "%s: %zu tokens, fewer than one prompt of %d", path, nid, len);
        goto out;
    }
    prompt *ps = calloc((size_t)k, sizeof *ps);
    for (int i = 0; ps && i < k; i++) {
        ps[i].n = len;
        if ((ps[i].ids = malloc((size_t)len * sizeof(int32_t))))
            memcpy(ps[i].ids, ids + (size_t)i * len, (size_t)len * sizeof(int32_t));
        else
            ps = NULL; /* leaks on OOM only at exit */
    }
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    *out = ps;
    *count = k;
    rc = 0;
out:
    free(ids);
    free(text);
    tok_free(tok);
    return rc;
}

/* What one engine produced for all prompts. */
typedef struct run {
    float **logits;  /* [np] (n_i, vocab): next-token logits at every prompt position */
    float **states;  /* [np] (layers, n_i, hidden) */
    int32_t *greedy; /* (np, gen) */
} run;

static void run_free(run *r, int np) {
    for (int i = 0; i < np; i++) {
        if (r->logits) free(r->logits[i]);
        if (r->states) free(r->states[i]);
    }
    free(r->logits);
    free(r->states);
    free(r->greedy);
    memset(r, 0, sizeof *r);
}

/* Prefill ids[0..n) of a fresh sequence on top of what the prefix cache
 * supplies (at most max_reuse tokens), all positions' logits (n, V) and
 * states (L, n, H) for positions >= the reused ones written in place.
 * *seq: the sequence. */
static int prefill(eng *e, const int32_t *ids, int n, int max_reuse, float *logits, float *states, float *tmp, int *seq,
                   char *err, size_t errlen) {
    const model_config *c = eng_model_config(e);
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size, L = (size_t)c->num_layers;
    int reused;
    if (eng_seq_new_prefix(e, ids, n, max_reuse, seq, &reused, err, errlen)) return -1;
    size_t m = (size_t)(n - reused);
    eng_item it = {*seq, ids + reused, (int)m, ENG_LOGITS_ALL};
    if (eng_step_states(e, &it, 1, logits + (size_t)reused * V, tmp, err, errlen)) return -1;
    for (size_t l = 0; l < L; l++)
        memcpy(states + (l * (size_t)n + (size_t)reused) * H, tmp + l * m * H, m * H * sizeof(float));
    return 0;
}

/* Every prompt prefilled on its own (all positions' logits, layer states),
 * with --prefix-cache its first pfx tokens in a pass before, then all greedy
 * continuations decoded together, one batch per step. */
static int run_all(eng *e, const prompt *ps, int np, int gen, int pfx, run *r, char *err, size_t errlen) {
    const model_config *c = eng_model_config(e);
    size_t V = (size_t)c->vocab_size, H = (size_t)c->hidden_size, L = (size_t)c->num_layers;
    int rc = -1, *seqs = calloc((size_t)np, sizeof *seqs), nseq = 0;
    eng_item *items = calloc((size_t)np, sizeof *items);
    float *rows = malloc((size_t)np * V * sizeof *rows), *tmp = NULL;
    r->logits = calloc((size_t)np, sizeof *r->logits);
    r->states = calloc((size_t)np, sizeof *r->states);
    r->greedy = malloc((size_t)np * gen * sizeof *r->greedy);
    eng_sampling greedy = {.temperature = 0, .top_p = 1};
    if (!seqs || !items || !rows || !r->logits || !r->states || !r->greedy) goto oom;
    for (int i = 0; i < np; i++) {
        r->logits[i] = malloc((size_t)ps[i].n * V * sizeof(float));
        r->states[i] = malloc(L * ps[i].n * H * sizeof(float));
        float *nt = realloc(tmp, L * ps[i].n * H * sizeof(float));
        if (!r->logits[i] || !r->states[i] || !nt) goto oom;
        tmp = nt;
        if (pfx > 0 && pfx < ps[i].n) { /* the earlier pass: its blocks stay cached when it ends */
            int s;
            int rc2 = prefill(e, ps[i].ids, pfx, 0, r->logits[i], r->states[i], tmp, &s, err, errlen);
            eng_seq_free(e, s);
            if (rc2) goto out;
            /* states of the earlier pass are laid out for pfx positions: spread them to n */
            for (size_t l = L; l-- > 1;)
                memmove(r->states[i] + l * ps[i].n * H, r->states[i] + l * (size_t)pfx * H,
                        (size_t)pfx * H * sizeof(float));
        }
        /* without --prefix-cache nothing is reused (a prompt repeated in the set is computed again) */
        if (prefill(e, ps[i].ids, ps[i].n, pfx, r->logits[i], r->states[i], tmp, &seqs[i], err, errlen)) goto out;
        nseq++;
        r->greedy[(size_t)i * gen] = eng_sample(r->logits[i] + (size_t)(ps[i].n - 1) * V, (int)V, &greedy, NULL);
    }
    for (int t = 1; t < gen; t++) {
        for (int i = 0; i < np; i++)
            items[i] = (eng_item){seqs[i], &r->greedy[(size_t)i * gen + t - 1], 1, ENG_LOGITS_LAST};
        if (eng_step(e, items, np, rows, err, errlen)) goto out;
        for (int i = 0; i < np; i++)
            r->greedy[(size_t)i * gen + t] = eng_sample(rows + (size_t)i * V, (int)V, &greedy, NULL);
    }
    rc = 0;
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
out:
    for (int i = 0; i < nseq; i++)
        eng_seq_free(e, seqs[i]);
    free(seqs);
    free(items);
    free(rows);
    free(tmp);
    return rc;
}

/* Teacher-forced: -log p and top-1 hits of each prompt's own next token. */
typedef struct lm_acc {
    double nll;
    long scored, hits;
} lm_acc;

static void lm_score(lm_acc *a, const float *logits, const prompt *p, size_t V, double *lp) {
    for (int t = 0; t + 1 < p->n; t++) {
        const float *l = logits + (size_t)t * V;
        eng_log_softmax(l, (int)V, lp);
        size_t b = 0;
        for (size_t v = 1; v < V; v++)
            if (l[v] > l[b]) b = v;
        a->nll -= lp[p->ids[t + 1]];
        a->hits += (int32_t)b == p->ids[t + 1];
        a->scored++;
    }
}

/* --logprobs-out: one JSONL line per prompt of a run (the logprobs the
 * server's echo + logprobs returns, and echo-generate's first step). */
static int dump_logprobs(FILE *f, const char *mode, const char *codec, int group, const run *r, const prompt *ps,
                         int np, size_t V, double *lp) {
    for (int i = 0; i < np; i++) {
        json_t *o = json_pack("{s:s,s:s,s:i,s:i}", "mode", mode, "codec", codec, "group", group, "prompt", i);
        json_t *a = json_array(), *top = json_array();
        for (int t = 0; t < ps[i].n; t++) {
            eng_log_softmax(r->logits[i] + (size_t)t * V, (int)V, lp);
            if (t + 1 < ps[i].n) json_array_append_new(a, json_real((float)lp[ps[i].ids[t + 1]]));
        }
        int32_t ids[5];
        int k = eng_top_k(lp, (int)V, 5, ids);
        for (int j = 0; j < k; j++) json_array_append_new(top, json_pack("[i,f]", (json_int_t)ids[j], (double)(float)lp[ids[j]]));
        json_object_set_new(o, "token_logprobs", a);
        json_object_set_new(o, "last_top", top);
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
        json_decref(o);
        if (!s || fprintf(f, "%s\n", s) < 0) {
            free(s);
            return -1;
        }
        free(s);
    }
    return 0;
}

typedef struct variant {
    echo_preset mode;
    echo_codec_id codec;
    int group;
    size_t min_bytes;
    lm_acc lm;
    double kl_sum, kl_max;
    long positions, top1_agree;
    long gained, lost; /* next tokens right only with this all-reduce / only with exact */
    double agree_len_sum;
    long full_agree;
    double *layer_num, *layer_den; /* per layer: sum ||h_mode - h_exact||^2, ||h_exact||^2 */
    echo_config wc;                /* what the all-reduce ran (the engine's world) */
} variant;

#define MAX_LIST 8
static int parse_list(const char *s, long lo, long hi, long *out) {
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == MAX_LIST || cli_parse_long(t, lo, hi, &out[n])) return -1;
        n++;
    }
    return n;
}

/* What the command line asks for (echo_eval's options, parsed). */
typedef struct ev_opts {
    const char *model_dir, *prompts_path, *text_path, *modes_arg, *codecs_arg, *lp_path;
    int tp, n_random, plen, gen, json, max_prompts, pfx;
    long seed, groups[MAX_LIST], minbs[MAX_LIST];
    int n_groups, n_minb;
    eng_config base;
    kern_kv_dtype ref_kv; /* NATIVE: as --kv-cache-dtype */
} ev_opts;

/* The options into *o; exits on a usage error, returns 1 after --help. */
static int ev_parse(int argc, char **argv, ev_opts *o) {
    enum {
        O_MODEL = 256,
        O_TP,
        O_PROMPTS,
        O_TEXT,
        O_RAND,
        O_PLEN,
        O_MAXP,
        O_SEED,
        O_GEN,
        O_MODES,
        O_MINB,
        O_GROUP,
        O_THREADS,
        O_JSON,
        O_CODECS,
        O_PREFIX,
        O_LPOUT,
        O_ACTQ,
        O_OVERLAP,
        O_KVDT,
        O_REFKV,
        O_ROPE
    };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},
        {"tp", required_argument, 0, O_TP},
        {"prompts", required_argument, 0, O_PROMPTS},
        {"text", required_argument, 0, O_TEXT},
        {"random-prompts", required_argument, 0, O_RAND},
        {"prompt-len", required_argument, 0, O_PLEN},
        {"max-prompts", required_argument, 0, O_MAXP},
        {"seed", required_argument, 0, O_SEED},
        {"gen-tokens", required_argument, 0, O_GEN},
        {"modes", required_argument, 0, O_MODES},
        {"echo-min-bytes", required_argument, 0, O_MINB},
        {"echo-group", required_argument, 0, O_GROUP},
        {"threads", required_argument, 0, O_THREADS},
        {"json", no_argument, 0, O_JSON},
        {"codecs", required_argument, 0, O_CODECS},
        {"prefix-cache", required_argument, 0, O_PREFIX},
        {"logprobs-out", required_argument, 0, O_LPOUT},
        {"act-quant", required_argument, 0, O_ACTQ},
        {"overlap", required_argument, 0, O_OVERLAP},
        {"kv-cache-dtype", required_argument, 0, O_KVDT},
        {"ref-kv-cache-dtype", required_argument, 0, O_REFKV},
        {"rope-scaling", required_argument, 0, O_ROPE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (ev_opts){.plen = 64, .gen = 32, .max_prompts = 50, .seed = 1, .n_groups = 1, .n_minb = 1,
                   .base = {.max_num_seqs = 1, .act_quant = ENG_ACT_AUTO, .kv_dtype = KERN_KV_BF16},
                   .ref_kv = KERN_KV_NATIVE};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model_dir = optarg; break;
        case O_TP: o->tp = (int)cli_long(PROG, optarg, "--tp", 1, 64); break;
        case O_PROMPTS: o->prompts_path = optarg; break;
        case O_TEXT: o->text_path = optarg; break;
        case O_RAND: o->n_random = (int)cli_long(PROG, optarg, "--random-prompts", 1, 100000); break;
        case O_PLEN: o->plen = (int)cli_long(PROG, optarg, "--prompt-len", 2, 1 << 20); break;
        case O_MAXP: o->max_prompts = (int)cli_long(PROG, optarg, "--max-prompts", 1, 4096); break;
        case O_SEED: o->seed = cli_long(PROG, optarg, "--seed", 0, 1L << 40); break;
        case O_GEN: o->gen = (int)cli_long(PROG, optarg, "--gen-tokens", 1, 1 << 16); break;
        case O_MODES: o->modes_arg = optarg; break;
        case O_MINB:
            if ((o->n_minb = parse_list(optarg, 0, 1L << 40, o->minbs)) < 1)
                cli_usage_error(PROG, "--echo-min-bytes expects up to 8 comma-separated byte counts, got '%s'", optarg);
            break;
        case O_GROUP:
            if ((o->n_groups = parse_list(optarg, 16, 256, o->groups)) < 1)
                cli_usage_error(PROG, "--echo-group expects up to 8 comma-separated sizes in [16, 256], got '%s'",
                                optarg);
            break;
        case O_THREADS: o->base.threads = (int)cli_long(PROG, optarg, "--threads", 1, 1024); break;
        case O_JSON: o->json = 1; break;
        case O_CODECS: o->codecs_arg = optarg; break;
        case O_PREFIX: o->pfx = (int)cli_long(PROG, optarg, "--prefix-cache", 0, 1 << 20); break;
        case O_LPOUT: o->lp_path = optarg; break;
        case O_ACTQ: o->base.act_quant = cli_act_quant(PROG, optarg); break;
        case O_OVERLAP: o->base.overlap = cli_overlap(PROG, optarg); break;
        case O_KVDT: o->base.kv_dtype = cli_kv_dtype(PROG, optarg); break;
        case O_REFKV: o->ref_kv = cli_kv_dtype(PROG, optarg); break;
        case O_ROPE: o->base.rope_scaling = cli_rope_scaling(PROG, optarg); break;
        case 'h': cli_help(USAGE); return 1;
        default: cli_usage_error(PROG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) cli_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
    if (!o->model_dir) cli_usage_error(PROG, "%s", "--model PATH is required");
    if (!o->tp) cli_usage_error(PROG, "%s", "--tp N is required");
    if ((o->prompts_path != NULL) + (o->text_path != NULL) + (o->n_random != 0) != 1)
        cli_usage_error(PROG, "%s", "give exactly one of --text FILE, --prompts FILE and --random-prompts K");
    if (o->ref_kv == KERN_KV_NATIVE) o->ref_kv = o->base.kv_dtype;
    /* "exact" as a variant: the reference's all-reduce on the other KV type */
    const int kv_differs = o->ref_kv != o->base.kv_dtype;
    if (o->tp == 1 && o->modes_arg && (!kv_differs || strcmp(o->modes_arg, "exact")))
        cli_usage_error(PROG, "%s", "--modes needs --tp >= 2: with one rank there is no all-reduce (only 'exact', "
                                    "with a --ref-kv-cache-dtype other than --kv-cache-dtype)");
    if (!o->modes_arg) o->modes_arg = o->tp > 1 ? "echo,echo-nofb" : "";
    return 0;
}


/* --modes: the quantized presets, each compared with exact once. */
static int ev_modes(const ev_opts *o, echo_preset modes[ECHO_PRESET_COUNT]) {
    const int kv_differs = o->ref_kv != o->base.kv_dtype;
    int n_modes = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", o->modes_arg);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        echo_preset m = ECHO_PRESET_EXACT;
        int bad = echo_preset_parse(t, &m) || (m == ECHO_PRESET_EXACT && !kv_differs);
        for (int i = 0; i < n_modes; i++) bad |= modes[i] == m;
        if (bad) {
            char names[256], msg[512];
            snprintf(msg, sizeof msg, "--modes expects a subset of %s (exact only with a --ref-kv-cache-dtype "
                     "other than --kv-cache-dtype), got '%s'",
                     echo_preset_names(names, sizeof names, ","), o->modes_arg);
            cli_usage_error(PROG, "%s", msg);
        }
        modes[n_modes++] = m;
    }
    return n_modes;
}

/* --codecs x --echo-group: each named codec with its own -gG, or with
 * each --echo-group. */
static int ev_codec_groups(const ev_opts *o, echo_codec_id cods[64], int cgroups[64]) {
    int n_cg = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", o->codecs_arg ? o->codecs_arg : "default");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        echo_codec_id cd = ECHO_CODEC_DEFAULT;
        int g = 0;
        if (strcmp(t, "default") && echo_codec_parse(t, &cd, &g))
            cli_usage_error(PROG, "--codecs: unknown codec '%s' (NAME or NAME-gG, e.g. hadamard-g32)", t);
        for (int k = 0; k < (g ? 1 : o->n_groups); k++) {
            if (n_cg == 64) cli_usage_error(PROG, "%s", "--codecs: too many codec x group variants (64 at most)");
            cods[n_cg] = cd;
            cgroups[n_cg++] = g ? g : (int)o->groups[k];
        }
    }
    return n_cg;
}

/* Variants: echo and echo-nofb run each codec x group; a preset that
 * fixes its codec runs that codec once per group: int4 at the groups of
 * the int4 entries of --codecs (else its default G), bf16 at the default
 * codec's G (only its shard size), as the server does. NULL when out of
 * memory. */
static variant *ev_variants(const ev_opts *o, int *count) {
    echo_preset modes[ECHO_PRESET_COUNT];
    echo_codec_id cods[64];
    int cgroups[64];
    int n_modes = ev_modes(o, modes), n_cg = ev_codec_groups(o, cods, cgroups);
    int nv = 0;
    variant *vs = calloc((size_t)n_modes * n_cg * o->n_minb + 1, sizeof *vs);
    for (int k = 0; vs && k < n_modes; k++) {
        echo_codec_id fixed = echo_preset_codec(modes[k]);
        int any = 0;
        for (int g = 0; g < n_cg; g++) {
            echo_codec_id cd = cods[g] ? cods[g] : ECHO_DEFAULT_CODEC;
            int grp = cgroups[g] ? cgroups[g] : echo_codec_default_group(cd);
            if (fixed != ECHO_CODEC_DEFAULT) {
                if (echo_codec_get(fixed)->lossless) {
                    grp = echo_codec_default_group(ECHO_CODEC_DEFAULT);
                } else if (cd != fixed) {
                    if (g + 1 < n_cg || any) continue;
                    grp = echo_codec_default_group(fixed); /* no int4 entry: its default G */
                }
                cd = fixed;
            }
            any = 1;
            for (int b = 0; b < o->n_minb; b++) {
                int dup = 0;
                for (int q = 0; q < nv; q++)
                    dup |= vs[q].mode == modes[k] && vs[q].codec == cd && vs[q].group == grp &&
                           vs[q].min_bytes == (size_t)o->minbs[b];
                if (!dup) vs[nv++] = (variant){.mode = modes[k], .codec = cd, .group = grp, .min_bytes = (size_t)o->minbs[b]};
            }
        }
    }
    *count = nv;
    return vs;
}

/* The prompts of --text, --prompts or --random-prompts. */
static int ev_prompts(const ev_opts *o, const model_config *mc, prompt **ps, int *np, char *err, size_t errlen) {
    if (o->text_path) return load_text(o->text_path, o->model_dir, o->plen, o->max_prompts, ps, np, err, errlen);
    if (o->prompts_path) return load_prompts(o->prompts_path, o->model_dir, mc->vocab_size, ps, np, err, errlen);
    *np = o->n_random;
    *ps = calloc((size_t)*np, sizeof **ps);
    uint64_t s = (uint64_t)o->seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; *ps && i < *np; i++) {
        prompt *p = &(*ps)[i];
        p->n = o->plen;
        p->ids = malloc((size_t)o->plen * sizeof(int32_t));
        for (int k = 0; p->ids && k < o->plen; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            p->ids[k] = (int32_t)(s % (uint64_t)mc->vocab_size);
        }
    }
    return 0;
}

/* Variant a's run rm against the exact run rx: LM scores, KL, top-1 and
 * greedy agreement, the residual stream's error per layer. lpx and lpm
 * are V doubles of scratch. */
static void ev_compare(variant *a, const run *rx, const run *rm, const prompt *ps, int np, int gen, size_t V, size_t H,
                       size_t L, double *lpx, double *lpm) {
    for (int i = 0; i < np; i++) {
        lm_score(&a->lm, rm->logits[i], &ps[i], V, lpm);
        for (int t = 0; t < ps[i].n; t++) {
            const float *lx = rx->logits[i] + (size_t)t * V, *lm = rm->logits[i] + (size_t)t * V;
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
            if (t + 1 < ps[i].n) {
                int32_t want = ps[i].ids[t + 1];
                a->gained += (int32_t)bm == want && (int32_t)bx != want;
                a->lost += (int32_t)bx == want && (int32_t)bm != want;
            }
        }
        int agree = 0;
        while (agree < gen && rx->greedy[(size_t)i * gen + agree] == rm->greedy[(size_t)i * gen + agree])
            agree++;
        a->agree_len_sum += agree;
        a->full_agree += agree == gen;
        for (size_t l = 0; l < L; l++) {
            const float *hx = rx->states[i] + l * ps[i].n * H, *hm = rm->states[i] + l * ps[i].n * H;
            for (size_t q = 0; q < (size_t)ps[i].n * H; q++) {
                double d = (double)hm[q] - hx[q];
                a->layer_num[l] += d * d;
                a->layer_den[l] += (double)hx[q] * hx[q];
            }
        }
    }
}

static void ev_report_json(const ev_opts *o, variant *vs, int nv, int np, const lm_acc *lmx, size_t L) {
    double ppl_x = exp(lmx->nll / (double)lmx->scored), acc_x = (double)lmx->hits / (double)lmx->scored;
    json_t *root = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:{s:f,s:f}}", "model", o->model_dir, "tp", o->tp, "prompts", np,
                             "tokens_scored", (int)lmx->scored, "gen_tokens", o->gen, "layers", (int)L, "exact", "ppl",
                             ppl_x, "next_token_acc", acc_x);
    json_object_set_new(root, "prefix_cache", json_integer(o->pfx));
    json_object_set_new(root, "kv_cache_dtype", json_string(kern_kv_dtype_name(o->base.kv_dtype)));
    json_object_set_new(root, "ref_kv_cache_dtype", json_string(kern_kv_dtype_name(o->ref_kv)));
    json_t *jm = json_array();
    for (int k = 0; k < nv; k++) {
        variant *a = &vs[k];
        json_t *layers = json_array();
        for (size_t l = 0; l < L; l++)
            json_array_append_new(layers, json_real(sqrt(a->layer_num[l] / (a->layer_den[l] + 1e-300))));
        double acc = (double)a->lm.hits / (double)a->lm.scored;
        json_t *o = json_pack("{s:s,s:i,s:I,s:f,s:f,s:f}", "mode", echo_preset_name(a->mode), "group", a->group,
                              "min_bytes", (json_int_t)a->min_bytes, "ppl", exp(a->lm.nll / (double)a->lm.scored),
                              "next_token_acc", acc, "next_token_acc_delta_pt", 100.0 * (acc - acc_x));
        json_object_set_new(o, "codec", json_string(echo_codec_get(a->codec)->name));
        {
            char desc[256];
            echo_config_describe(a->mode, &a->wc, desc, sizeof desc);
            json_object_set_new(o, "feedback", json_boolean(a->wc.feedback));
            json_object_set_new(o, "allreduce", json_string(desc));
            json_object_set_new(o, "tail_sites", json_integer(a->wc.tail_sites));
            json_object_set_new(o, "tail_codec",
                                json_string(a->wc.tail_sites ? echo_codec_get(a->wc.tail_codec)->name : "none"));
        }
        /* averaged over a pass: the tail policy's calls at their own bits */
        json_object_set_new(o, "bits_per_value", json_real(echo_config_bits(&a->wc)));
        {
            /* standard error of the paired accuracy difference (points) */
            double n = (double)a->lm.scored, d = (double)(a->gained - a->lost);
            double var = ((double)(a->gained + a->lost) - d * d / n) / (n * n);
            json_object_set_new(o, "next_token_acc_delta_se_pt", json_real(100.0 * sqrt(var > 0 ? var : 0)));
        }
        json_object_set_new(o, "kl_mean", json_real(a->kl_sum / (double)a->positions));
        json_object_set_new(o, "kl_max", json_real(a->kl_max));
        json_object_set_new(o, "top1_agreement", json_real((double)a->top1_agree / (double)a->positions));
        json_object_set_new(o, "greedy_agree_len_mean", json_real(a->agree_len_sum / np));
        json_object_set_new(o, "greedy_full_agree_frac", json_real((double)a->full_agree / np));
        json_object_set_new(o, "layer_rel_err", layers);
        json_array_append_new(jm, o);
    }
    json_object_set_new(root, "modes", jm);
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    puts(s ? s : "{}");
    free(s);
    json_decref(root);
}

static void ev_report_text(const ev_opts *o, const variant *vs, int nv, const prompt *ps, int np, int maxlen,
                           const lm_acc *lmx, size_t L) {
    double ppl_x = exp(lmx->nll / (double)lmx->scored), acc_x = (double)lmx->hits / (double)lmx->scored;
    printf("echo-eval: %s, tp %d, %d prompts (%d..%d tokens), %d greedy tokens, %d layers; KV cache %s "
           "(reference: exact all-reduce, KV %s)\n\n",
           o->model_dir, o->tp, np, ps[0].n, maxlen, o->gen, (int)L, kern_kv_dtype_name(o->base.kv_dtype),
           kern_kv_dtype_name(o->ref_kv));
    printf("%-9s %-9s %5s %5s %9s %9s %9s %9s %11s %11s %9s %17s %10s\n", "mode", "codec", "G", "bits", "min_B",
           "ppl", "acc", "d acc", "KL mean", "KL max", "top-1=", "greedy agree len", "full agree");
    printf("%-9s %-9s %5s %5s %9s %9.3f %8.2f%% %9s\n", "exact", "-", "-", "32", "-", ppl_x, 100 * acc_x, "-");
    for (int k = 0; k < nv; k++) {
        const variant *a = &vs[k];
        double acc = (double)a->lm.hits / (double)a->lm.scored;
        printf("%-9s %-9s %5d %5.3g %9zu %9.3f %8.2f%% %+8.2fpt %11.3e %11.3e %8.2f%% %11.1f / %-4d %9.0f%%\n",
               echo_preset_name(a->mode), echo_codec_get(a->codec)->name, a->group,
               echo_config_bits(&a->wc), a->min_bytes, exp(a->lm.nll / (double)a->lm.scored), 100 * acc,
               100 * (acc - acc_x), a->kl_sum / (double)a->positions, a->kl_max,
               100.0 * (double)a->top1_agree / (double)a->positions, a->agree_len_sum / np, o->gen,
               100.0 * (double)a->full_agree / np);
    }
    if (nv) {
        printf("\nresidual-stream error after each layer, ||h_mode - h_exact|| / ||h_exact||\n%-6s", "layer");
        for (int k = 0; k < nv; k++)
            printf(" %4s/%c/G%-3d", echo_preset_name(vs[k].mode), echo_codec_get(vs[k].codec)->name[0],
                   vs[k].group);
        printf("\n");
        for (size_t l = 0; l < L; l++) {
            printf("%-6zu", l);
            for (int k = 0; k < nv; k++)
                printf(" %11.3e", sqrt(vs[k].layer_num[l] / (vs[k].layer_den[l] + 1e-300)));
            printf("\n");
        }
    }
}

int main(int argc, char **argv) {
    cli_procs_start(PROG); /* under mpirun: ranks > 0 follow rank 0 and exit there */
    ev_opts o;
    if (ev_parse(argc, argv, &o)) return 0;
    int nv = 0;
    variant *vs = ev_variants(&o, &nv);
    eng_config base = o.base;
    const char *lp_path = o.lp_path;
    int gen = o.gen, pfx = o.pfx;

    char err[1024];
    model_config mc;
    prompt *ps = NULL;
    int np = 0, rc = 1, maxlen = 0;
    eng *ex = NULL;
    run rx = {0}, rm = {0};
    lm_acc lmx = {0};
    double *lpx = NULL, *lpm = NULL;
    FILE *lpf = NULL;
    if (!vs) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (model_config_load(o.model_dir, &mc, err, sizeof err) ||
        model_config_rope_override(&mc, base.rope_scaling, err, sizeof err))
        goto fail;
    if (ev_prompts(&o, &mc, &ps, &np, err, sizeof err)) goto fail;
    for (int i = 0; i < np; i++)
        maxlen = ps[i].n > maxlen ? ps[i].n : maxlen;
    base.model_dir = o.model_dir;
    base.tp = o.tp;
    base.max_model_len = maxlen + gen;
    base.max_num_seqs = np;
    base.max_batch_tokens = maxlen > np ? maxlen : np;
    size_t V = (size_t)mc.vocab_size, H = (size_t)mc.hidden_size, L = (size_t)mc.num_layers;
    lpx = malloc(V * sizeof(double));
    lpm = malloc(V * sizeof(double));
    if (!lpx || !lpm) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    eng_config cx = base;
    cx.allreduce = ECHO_PRESET_EXACT;
    cx.kv_dtype = o.ref_kv;
    if (eng_create(&cx, &ex, err, sizeof err) || run_all(ex, ps, np, gen, pfx, &rx, err, sizeof err)) goto fail;
    eng_destroy(ex);
    ex = NULL;
    for (int i = 0; i < np; i++)
        lm_score(&lmx, rx.logits[i], &ps[i], V, lpx);
    if (lp_path && !(lpf = fopen(lp_path, "w"))) {
        snprintf(err, sizeof err, "%s: cannot open: %s", lp_path, strerror(errno));
        goto fail;
    }
    if (lpf && dump_logprobs(lpf, "exact", "none", 0, &rx, ps, np, V, lpx)) {
        snprintf(err, sizeof err, "%s: write failed", lp_path);
        goto fail;
    }
    if (!o.json) fprintf(stderr, "echo-eval: exact done (%d prompts)\n", np);
    for (int k = 0; k < nv; k++) {
        variant *a = &vs[k];
        eng_config cm = base;
        cm.allreduce = a->mode;
        cm.echo_group = a->group;
        cm.echo_codec = a->codec;
        cm.echo_min_bytes = a->min_bytes;
        a->layer_num = calloc(L, sizeof(double));
        a->layer_den = calloc(L, sizeof(double));
        eng *em = NULL;
        if (!a->layer_num || !a->layer_den) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
        if (eng_create(&cm, &em, err, sizeof err)) goto fail;
        if (eng_allreduce_config(em, &a->wc)) echo_preset_config(a->mode, a->codec, a->group, &a->wc); /* tp 1 */
        int r = run_all(em, ps, np, gen, pfx, &rm, err, sizeof err);
        eng_destroy(em);
        if (r) goto fail;
        if (lpf && dump_logprobs(lpf, echo_preset_name(a->mode), echo_codec_get(a->codec)->name, a->group, &rm, ps, np,
                                 V, lpm)) {
            snprintf(err, sizeof err, "%s: write failed", lp_path);
            goto fail;
        }
        ev_compare(a, &rx, &rm, ps, np, gen, V, H, L, lpx, lpm);
        run_free(&rm, np);
        if (!o.json)
            fprintf(stderr, "echo-eval: %s %s G=%d min_bytes=%zu done (%d of %d)\n", echo_preset_name(a->mode),
                    echo_codec_get(a->codec)->name, a->group, a->min_bytes, k + 1, nv);
    }
    if (o.json)
        ev_report_json(&o, vs, nv, np, &lmx, L);
    else
        ev_report_text(&o, vs, nv, ps, np, maxlen, &lmx, L);
    rc = 0;
fail:
    if (lpf && fclose(lpf) && !rc) {
        fprintf(stderr, "echo-eval: error: %s: write failed\n", lp_path);
        rc = 1;
    }
    if (rc) fprintf(stderr, "echo-eval: error: %s\n", err);
    free(lpx);
    free(lpm);
    run_free(&rx, np);
    run_free(&rm, np);
    for (int k = 0; vs && k < nv; k++) {
        free(vs[k].layer_num);
        free(vs[k].layer_den);
    }
    free(vs);
    eng_destroy(ex);
    for (int i = 0; i < np; i++)
        free(ps[i].ids);
    free(ps);
    return rc;
}
