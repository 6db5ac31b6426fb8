/*
 * server/: lifetime (create, load, shutdown, destroy), model-name
 * resolution and generation defaults (the log line is util.c's).
 */
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/report.h"
#include "kernels/kernels.h"
#include "kernels/kv.h"
#include "server/internal.h"

/* ---- model name resolution ---- */

/* a/b into out; -1 when it does not fit (then the path is not used). */
static int pjoin(char *out, size_t n, const char *a, const char *b) {
    int k = snprintf(out, n, "%s/%s", a, b);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

static int is_model_dir(const char *d) {
    char p[4096];
    struct stat st;
    if (model_path_is_gguf(d)) return 1; /* a GGUF file is a whole model */
    if (snprintf(p, sizeof p, "%s/config.json", d) >= (int)sizeof p) return 0;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static void add_looked(char *err, size_t errlen, const char *where) {
    size_t l = strlen(err);
    if (l < errlen) snprintf(err + l, errlen - l, "\n  %s", where);
}

/* HF cache folder "models--Org--Repo" matches "repo" or "org/repo". */
static int hf_name_matches(const char *entry, const char *name) {
    if (strncmp(entry, "models--", 8) != 0) return 0;
    const char *org = entry + 8, *sep = strstr(org, "--");
    if (!sep) return 0;
    const char *repo = sep + 2;
    if (strcasecmp(repo, name) == 0) return 1;
    size_t ol = (size_t)(sep - org);
    return strncasecmp(name, org, ol) == 0 && name[ol] == '/' && strcasecmp(name + ol + 1, repo) == 0;
}

static int hf_snapshot(const char *repo_dir, char *dir, size_t dirlen) {
    char p[4096], ref[256] = "";
    FILE *f = pjoin(p, sizeof p, repo_dir, "refs/main") ? NULL : fopen(p, "r");
    if (f) {
        if (fgets(ref, sizeof ref, f)) ref[strcspn(ref, "\r\n")] = 0;
        fclose(f);
    }
    char snap[4096];
    if (pjoin(snap, sizeof snap, repo_dir, "snapshots")) return -1;
    if (ref[0] && !strchr(ref, '/') && !pjoin(p, sizeof p, snap, ref)) {
        if (is_model_dir(p)) return snprintf(dir, dirlen, "%s", p) < (int)dirlen ? 0 : -1;
    }
    DIR *d = opendir(snap);
    if (!d) return -1;
    struct dirent *de;
    int rc = -1;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char q[4096];
        if (!pjoin(q, sizeof q, snap, de->d_name) && is_model_dir(q) && snprintf(dir, dirlen, "%s", q) < (int)dirlen) {
            rc = 0;
            break;
        }
    }
    closedir(d);
    return rc;
}

int srv_resolve_model(const char *name, char *dir, size_t dirlen, char *err, size_t errlen) {
    char p[4096];
    snprintf(err, errlen, "model '%s' not found; looked for a GGUF file or a folder with config.json at:", name);
    if (model_is_random(name)) { /* no files: the shape's name is checked here, the weights made at load */
        model_config mc;
        if (model_random_parse(name, &mc, NULL, err, errlen)) return -1;
        return snprintf(dir, dirlen, "%s", name) < (int)dirlen ? 0 : -1;
    }
    if (is_model_dir(name)) return snprintf(dir, dirlen, "%s", name) < (int)dirlen ? 0 : -1;
    add_looked(err, errlen, name);
    const char *env = getenv("ECHO_MODEL_DIR");
    if (env && *env) {
        snprintf(p, sizeof p, "%s/%s", env, name);
        if (is_model_dir(p)) return snprintf(dir, dirlen, "%s", p) < (int)dirlen ? 0 : -1;
        add_looked(err, errlen, p);
    } else {
        add_looked(err, errlen, "$ECHO_MODEL_DIR/<name> ($ECHO_MODEL_DIR is not set)");
    }
    snprintf(p, sizeof p, "./models/%s", name);
    if (is_model_dir(p)) return snprintf(dir, dirlen, "%s", p) < (int)dirlen ? 0 : -1;
    add_looked(err, errlen, p);
    char hub[4096];
    const char *hc = getenv("HF_HUB_CACHE"), *hh = getenv("HF_HOME"), *home = getenv("HOME");
    if (hc && *hc)
        snprintf(hub, sizeof hub, "%s", hc);
    else if (hh && *hh)
        snprintf(hub, sizeof hub, "%s/hub", hh);
    else
        snprintf(hub, sizeof hub, "%s/.cache/huggingface/hub", home ? home : "");
    DIR *d = opendir(hub);
    if (d) {
        struct dirent *de;
        int found = 0;
        while (!found && (de = readdir(d))) {
            if (!hf_name_matches(de->d_name, name)) continue;
            found = !pjoin(p, sizeof p, hub, de->d_name) && hf_snapshot(p, dir, dirlen) == 0;
        }
        closedir(d);
        if (found) return 0;
    }
    add_looked(err, errlen, hub);
    size_t l = strlen(err);
    if (l < errlen)
        snprintf(err + l, errlen - l,
                 "/models--<Org>--<Name>/snapshots/<rev> (Hugging Face cache, '%s' matched "
                 "case-insensitively)",
                 name);
    return -1;
}

/* ---- generation_config.json defaults ---- */

static void load_gen_defaults(srv_server *s, const char *dir, srv_gen_defaults *gd) {
    *gd = (srv_gen_defaults){.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .top_k = 0};
    char p[4096];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    json_error_t je;
    json_t *g = json_load_file(p, 0, &je);
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    /* A value out of range is named and the neutral default used, never
     * replaced silently. */
    json_t *v;
    if ((v = json_object_get(g, "temperature")) && !json_is_null(v)) {
        if (json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 2)
            gd->temperature = (float)json_number_value(v);
        else
            srv_log(s, SRV_LOG_WARNING, "generation_config.json: temperature out of range [0, 2]; using %g",
                    (double)gd->temperature);
    }
    if ((v = json_object_get(g, "top_p")) && !json_is_null(v)) {
        if (json_is_number(v) && json_number_value(v) > 0 && json_number_value(v) <= 1)
            gd->top_p = (float)json_number_value(v);
        else
            srv_log(s, SRV_LOG_WARNING, "generation_config.json: top_p out of range (0, 1]; using %g",
                    (double)gd->top_p);
    }
    if ((v = json_object_get(g, "top_k")) && !json_is_null(v)) {
        if (json_is_integer(v) && json_integer_value(v) >= -1 && json_integer_value(v) < (1 << 30))
            gd->top_k = json_integer_value(v) < 0 ? 0 : (int)json_integer_value(v);
        else
            srv_log(s, SRV_LOG_WARNING, "generation_config.json: top_k is not an integer >= -1; using %d (off)",
                    gd->top_k);
    }
    if ((v = json_object_get(g, "repetition_penalty")) && !json_is_null(v)) {
        if (json_is_number(v) && json_number_value(v) > 0 && json_number_value(v) <= 10)
            gd->repetition_penalty = (float)json_number_value(v);
        else
            srv_log(s, SRV_LOG_WARNING, "generation_config.json: repetition_penalty out of range (0, 10]; using %g",
                    (double)gd->repetition_penalty);
    }
    json_decref(g);
}

/* ---- lifetime ---- */

int srv_create(const srv_options *opt, srv_server **out, char *err, size_t errlen) {
    *out = NULL;
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->opt = *opt;
    if (!s->opt.host) s->opt.host = "127.0.0.1";
    if (!s->opt.device) s->opt.device = "auto";
    if (s->opt.tp <= 0) s->opt.tp = 1;
    if (s->opt.max_num_seqs <= 0) s->opt.max_num_seqs = 8;
    if (s->opt.max_num_batched_tokens <= 0) s->opt.max_num_batched_tokens = 512;
    if (s->opt.max_waiting <= 0) s->opt.max_waiting = 256;
    if (s->opt.max_connections <= 0) s->opt.max_connections = 256;
    if (s->opt.timeout_s <= 0) s->opt.timeout_s = 30;
    if (s->opt.request_deadline_s <= 0) s->opt.request_deadline_s = 30;
    if (s->opt.max_conn_per_client <= 0) s->opt.max_conn_per_client = s->opt.max_connections > 1 ? s->opt.max_connections / 2 : 1;
    if (s->opt.max_body_bytes == 0) s->opt.max_body_bytes = 8u << 20;
    if (s->opt.drain_s < 0) s->opt.drain_s = 0;
    if (s->opt.grammar_compiles <= 0) s->opt.grammar_compiles = 2;
    if (s->opt.grammar_timeout_s <= 0) s->opt.grammar_timeout_s = 10;
    s->model_dir = strdup(opt->model_dir);
    if (opt->served_model_name) {
        s->name = strdup(opt->served_model_name);
    } else {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", opt->model_dir);
        size_t l = strlen(tmp);
        while (l > 1 && tmp[l - 1] == '/')
            tmp[--l] = 0;
        const char *b = strrchr(tmp, '/');
        s->name = strdup(b ? b + 1 : tmp);
    }
    atomic_init(&s->ready, 0);
    atomic_init(&s->unusable, 0);
    atomic_init(&s->unusable_claim, 0);
    atomic_init(&s->accepting, 1);
    atomic_init(&s->req_counter, 0);
    atomic_init(&s->http_active, 0);
    s->seed_base = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    pthread_mutex_init(&s->sch.mu, NULL);
    pthread_cond_init(&s->sch.cv, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_mutex_init(&s->gram_mu, NULL);
    atomic_init(&s->reaper_stop, 0);
    s->cpool = srv_cpool_new(s->opt.grammar_compiles);
    s->resp_store = srv_resp_store_new(SRV_RESP_STORE_MAX, SRV_RESP_STORE_BYTES);
    if (!s->model_dir || !s->name || !s->cpool || !s->resp_store || srv_metrics_init(&s->met)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (srv_http_start(s, err, errlen)) goto fail;
    *out = s;
    return 0;
fail:
    srv_destroy(s);
    return -1;
}

int srv_port(const srv_server *s) {
    return s->port;
}
const char *srv_model_name(const srv_server *s) {
    return s->name;
}

typedef struct load_ticker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    const srv_server *s;
    double t0;
    double weight_mb;
} load_ticker;

/* The engine has no progress callback: show elapsed time while it loads. */
static void *ticker_main(void *arg) {
    load_ticker *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 2;
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        if (!t->done)
            srv_log(t->s, SRV_LOG_INFO, "loading weights (%.0f MB)... %.0fs", t->weight_mb, srv_now() - t->t0);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static double dir_safetensors_mb(const char *dir) {
    struct stat gs;
    if (model_path_is_gguf(dir)) return stat(dir, &gs) == 0 ? (double)gs.st_size / 1e6 : 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    double total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0) continue;
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0) total += (double)st.st_size;
    }
    closedir(d);
    return total / 1e6;
}

/* The model's config, generation defaults, tokenizer, chat template,
 * tool-call format and reasoning parser. */
static int load_text_side(srv_server *s, char *err, size_t errlen) {
    const srv_options *o = &s->opt;
    if (model_config_load(s->model_dir, &s->mc, err, errlen) ||
        model_config_rope_override(&s->mc, o->rope_scaling, err, errlen))
        return -1;
    if (model_is_random(s->model_dir) && !o->tokenizer) {
        snprintf(err, errlen, "%s has no files to find a tokenizer in: pass --tokenizer DIR (a folder with "
                 "tokenizer.json + tokenizer_config.json, e.g. tests/fixtures/tokenizer/qwen3)", s->model_dir);
        return -1;
    }
    load_gen_defaults(s, s->model_dir, &s->gd); /* a random: model has none: the neutral defaults */
    const char *tdir = o->tokenizer ? o->tokenizer : s->model_dir;
    int trc = eng_tokenizer_load(tdir, &s->tok, &s->chat, err, errlen);
    if (trc) {
        if (trc == ENG_TOK_MISSING) {
            size_t l = strlen(err);
            snprintf(err + l, errlen - l, " (%s needs tokenizer.json + tokenizer_config.json)",
                     o->tokenizer ? "the --tokenizer folder" : "the model folder");
        }
        return -1;
    }
    if (s->chat.source) {
        /* a template the interpreter cannot run is refused now, not at the first chat request */
        if (!s->chat.compiled) {
            char terr[512];
            snprintf(terr, sizeof terr, "%s", s->chat.compile_err);
            snprintf(err, errlen, "%s: chat template: %s", s->model_dir, terr);
            return -1;
        }
        srv_log(s, SRV_LOG_INFO, "chat template: the model's own (%zu bytes of Jinja)", strlen(s->chat.source));
    } else {
        if (eng_chat_template_builtin(&s->chat_builtin, err, errlen)) return -1;
        srv_log(s, SRV_LOG_WARNING, "the model has no chat template: /v1/chat/completions uses Qwen3's");
    }
    if (s->opt.tool_call_parser && strcmp(s->opt.tool_call_parser, "auto")) {
        if (!(s->tool_fmt = srv_tool_format_named(s->opt.tool_call_parser))) {
            snprintf(err, errlen, "--tool-call-parser expects auto, hermes, qwen3_coder or mistral, got '%s'",
                     s->opt.tool_call_parser);
            return -1;
        }
    }
    if (srv_reason_setup(s, err, errlen)) return -1;
    srv_log(s, SRV_LOG_INFO, "reasoning parser: %s%s; tool-call format: %s%s",
            s->reason ? s->reason->name : "none",
            s->opt.reasoning_parser && strcmp(s->opt.reasoning_parser, "auto") ? "" : " (auto, from the chat template)",
            srv_tool_format_for(s)->name, s->tool_fmt ? "" : " (auto, from the chat template)");
    if ((long long)tok_vocab_size(s->tok) > s->mc.vocab_size)
        srv_log(s, SRV_LOG_WARNING,
                "the tokenizer's vocabulary (%zu ids) does not fit the model's (%d): prompts that tokenize to "
                "larger ids are refused (400)",
                tok_vocab_size(s->tok), s->mc.vocab_size);
    return 0;
}

/* The engine, made from the options (--device auto falls back to the host
 * backend), while a ticker logs the load's progress; *t0: when it began. */
static int load_engine(srv_server *s, double *t0, char *err, size_t errlen) {
    const srv_options *o = &s->opt;
    eng_config ec = {.model_dir = s->model_dir,
                     .device = o->device,
                     .tp = o->tp,
                     .allreduce = o->allreduce,
                     .allreduce_auto = o->allreduce_auto,
                     .transport = o->transport,
                     .echo_min_bytes = o->echo_min_bytes,
                     .echo_group = o->echo_group,
                     .echo_codec = o->echo_codec,
                     .quantize = o->quantize,
                     .act_quant = o->act_quant,
                     .overlap = o->overlap,
                     .oneshot = o->oneshot,
                     .threads = o->threads,
                     .max_model_len = o->max_model_len,
                     .max_num_seqs = o->max_num_seqs,
                     .max_batch_tokens = o->max_num_batched_tokens,
                     .kv_blocks = o->kv_blocks,
                     .kv_dtype = o->kv_dtype,
                     .kv_cache_memory = o->kv_cache_memory,
                     .gpu_memory_utilization = o->gpu_memory_utilization,
                     .cuda_graphs = o->cuda_graphs,
                     .no_prefix_cache = o->no_prefix_caching,
                     .rope_scaling = o->rope_scaling};
    if (kern_backend_find(o->device)) ec.device = kern_backend_find(o->device)->name; /* "auto" resolved */
    if (ec.max_batch_tokens < ec.max_num_seqs) {
        snprintf(err, errlen,
                 "--max-num-batched-tokens (%d) must be >= --max-num-seqs (%d): every running "
                 "sequence decodes one token per step",
                 ec.max_batch_tokens, ec.max_num_seqs);
        return -1;
    }
    if (o->load_delay_s > 0) {
        struct timespec d = {(time_t)o->load_delay_s,
                             (long)((o->load_delay_s - (double)(time_t)o->load_delay_s) * 1e9)};
        nanosleep(&d, NULL);
    }
    load_ticker tk = {.s = s, .t0 = srv_now(), .weight_mb = dir_safetensors_mb(s->model_dir)};
    pthread_mutex_init(&tk.mu, NULL);
    pthread_cond_init(&tk.cv, NULL);
    pthread_t th;
    int have_ticker = pthread_create(&th, NULL, ticker_main, &tk) == 0;
    if (model_is_random(s->model_dir))
        srv_log(s, SRV_LOG_INFO, "loading %s (random weights generated in memory: logits are noise) on %s, tp %d",
                s->model_dir, ec.device, ec.tp);
    else
        srv_log(s, SRV_LOG_INFO, "loading %s (%.0f MB of %s) on %s, tp %d", s->model_dir, tk.weight_mb,
                model_path_is_gguf(s->model_dir) ? "GGUF" : "safetensors", ec.device, ec.tp);
    int rc = eng_create(&ec, &s->eng, err, errlen);
    const kern_backend_info *host = kern_backend_at(0); /* the host backend, auto's fallback (kernels/kernels.h) */
    if (rc && strcmp(o->device, "auto") == 0 && kern_backend_find(ec.device) && !kern_backend_find(ec.device)->host) {
        srv_log(s, SRV_LOG_WARNING, "--device auto: %s unavailable (%s); using %s", ec.device, err, host->name);
        ec.device = host->name;
        rc = eng_create(&ec, &s->eng, err, errlen);
    }
    pthread_mutex_lock(&tk.mu);
    tk.done = 1;
    pthread_cond_signal(&tk.cv);
    pthread_mutex_unlock(&tk.mu);
    if (have_ticker) pthread_join(th, NULL);
    pthread_mutex_destroy(&tk.mu);
    pthread_cond_destroy(&tk.cv);
    *t0 = tk.t0;
    return rc ? -1 : 0;
}

/* The loaded engine's limits into s and its plan logged; *wc_out: the
 * all-reduce's configuration. */
static void log_plan(srv_server *s, double t0, echo_config *wc_out) {
    const eng_config *c = eng_get_config(s->eng);
    eng_kv_usage u;
    eng_kv_get_usage(s->eng, &u);
    s->max_model_len = c->max_model_len;
    s->block_size = u.block_size;
    s->total_blocks = u.total_blocks;
    eng_rank_info ri;
    eng_get_rank_info(s->eng, 0, &ri);
    double slot_mb = (double)ri.slot_bytes / 1e6, kv_mb = (double)ri.kv_bytes / 1e6;
    srv_log(s, SRV_LOG_INFO, "rank 0 of %d holds %.1f MB of weights (each rank reads only its slices)", c->tp,
            (double)ri.weight_bytes / 1e6);
    char ar[256] = "none (tp 1)";
    echo_config wc = {0};
    if (c->tp > 1 && !eng_allreduce_config(s->eng, &wc)) echo_config_describe(c->allreduce, &wc, ar, sizeof ar);
    char autod[1024] = "";
    {
        echo_auto_figures af;
        echo_auto_choice ac;
        if (eng_allreduce_auto(s->eng, &af, &ac)) {
            echo_auto_describe(&af, &ac, autod, sizeof autod);
            size_t n = strlen(ar);
            if (n + 8 < sizeof ar) {
                memmove(ar + 7, ar, n + 1);
                memcpy(ar, "(auto) ", 7);
            }
        }
    }
    /* the prefix cache may hold every block no running request needs */
    char pc[96] = "prefix caching off";
    if (u.prefix_cache) snprintf(pc, sizeof pc, "prefix caching on (may hold all %d blocks, LRU)", u.total_blocks);
    char ov[160] = "";
    if (c->tp > 1) {
        int k = eng_overlap_k(s->eng);
        if (k > 1)
            snprintf(ov, sizeof ov, ", prefill overlap %d micro-batches (of >= 64 tokens)", k);
        else
            snprintf(ov, sizeof ov, ", prefill overlap off");
        size_t os = eng_oneshot_bytes(s->eng);
        size_t len = strlen(ov);
        if (os)
            snprintf(ov + len, sizeof ov - len, ", one-shot all-reduce for calls <= %zu B", os);
        else
            snprintf(ov + len, sizeof ov - len, ", one-shot all-reduce off");
    }
    srv_log(s, SRV_LOG_INFO,
            "plan: tp %d, device %s%s%s, allreduce %s (%s transport)%s, residual slots %.1f MB/rank, KV %d blocks x %d "
            "tokens %s "
            "(%zu B/token/rank, %.1f MB/rank, touched as used), %s, max_model_len %d, max_num_seqs %d, %d tokens/step; "
            "loaded in %.1fs",
            c->tp, c->device, c->quantize == ENG_QUANT_Q8_0 ? ", matrices quantized to q8_0" : "",
            ri.act_q8_matrices ? ", 8-bit activations on the quantized matrices (integer kernels; --act-quant none: exact)"
                               : "", ar,
            c->tp > 1 ? c->transport : "no", ov, slot_mb, u.total_blocks, u.block_size, kern_kv_dtype_name(c->kv_dtype),
            u.block_size ? u.block_bytes / (size_t)u.block_size : 0, kv_mb, pc, c->max_model_len,
            c->max_num_seqs, c->max_batch_tokens, srv_now() - t0);
    if (autod[0]) srv_log(s, SRV_LOG_INFO, "allreduce %s", autod);
    if (c->kv_mem_available)
        srv_log(s, SRV_LOG_INFO,
                "KV budget (--kv-cache-memory auto): %d%% of MemAvailable %.1f MB / %d rank(s) = %.1f MB per rank; the "
                "pool is %s (%d blocks)",
                ENG_KV_AUTO_PERCENT, (double)c->kv_mem_available / 1e6, c->tp, (double)c->kv_cache_memory / 1e6,
                (size_t)u.total_blocks * u.block_bytes >= c->kv_cache_memory - u.block_bytes
                    ? "what fits in it"
                    : "max_num_seqs full sequences (fewer than fit)",
                u.total_blocks);
    else if (c->kv_gpu.total)
        srv_log(s, SRV_LOG_INFO,
                "KV budget (--kv-cache-memory auto): --gpu-memory-utilization %.2f of %.1f GB, less %.1f GB in use at "
                "start and %d rank(s) x (%.2f GB of weights + %.2f GB of activations, estimated) = %.1f MB per rank "
                "(%d blocks)",
                c->gpu_memory_utilization > 0 ? c->gpu_memory_utilization : ENG_GPU_UTIL_DEFAULT,
                (double)c->kv_gpu.total / 1e9, (double)(c->kv_gpu.total - c->kv_gpu.free) / 1e9,
                c->kv_gpu.ranks_per_gpu, (double)c->kv_gpu.weights / 1e9, (double)c->kv_gpu.activations / 1e9,
                (double)c->kv_cache_memory / 1e6, u.total_blocks);
    else if (c->kv_cache_memory)
        srv_log(s, SRV_LOG_INFO, "KV budget (--kv-cache-memory): %.1f MB per rank, %d blocks", (double)c->kv_cache_memory / 1e6,
                u.total_blocks);
    if (eng_graphs_note(s->eng)) srv_log(s, SRV_LOG_WARNING, "%s", eng_graphs_note(s->eng));
    else if (c->cuda_graphs) srv_log(s, SRV_LOG_INFO, "decode steps through CUDA graphs (--cuda-graphs)");
    if (s->opt.spec.draft_max > 0)
        srv_log(s, SRV_LOG_INFO,
                "speculative decoding: ngram drafts of %d..%d-grams, up to %d tokens per step, while at most %d "
                "requests decode (--spec-max-batch; 0: always)",
                s->opt.spec.ngram_min, s->opt.spec.ngram_max, s->opt.spec.draft_max, s->opt.spec_max_batch);
    pthread_mutex_lock(&s->met.mu);
    s->met.spec_on = s->opt.spec.draft_max > 0;
    s->met.spec_draft_max = s->opt.spec.draft_max;
    pthread_mutex_unlock(&s->met.mu);
    srv_log(s, SRV_LOG_INFO, "defaults from generation_config.json: temperature %g, top_p %g, top_k %d",
            (double)s->gd.temperature, (double)s->gd.top_p, s->gd.top_k);
    if (s->total_blocks < (s->max_model_len + s->block_size - 1) / s->block_size)
        srv_log(s, SRV_LOG_WARNING, "KV cache holds fewer tokens (%d) than max_model_len (%d)",
                s->total_blocks * s->block_size, s->max_model_len);
    *wc_out = wc;
}

/* /metrics' configuration families (cache, all-reduce, speculation). */
static int init_metrics(srv_server *s, const echo_config *wc_in, char *err, size_t errlen) {
    const eng_config *c = eng_get_config(s->eng);
    const echo_config wc = *wc_in;
    eng_kv_usage u;
    eng_kv_get_usage(s->eng, &u);
    if (srv_metrics_set_len(&s->met, s->max_model_len)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_lock(&s->met.mu);
    s->met.block_size = s->block_size;
    s->met.num_blocks = s->total_blocks;
    s->met.kv_dtype = kern_kv_dtype_name(c->kv_dtype);
    s->met.kv = u;
    {
        const echo_codec_info *ci = echo_codec_get(wc.codec);
        snprintf(s->met.ar_preset, sizeof s->met.ar_preset, "%s", c->tp > 1 ? echo_preset_name(c->allreduce) : "none");
        snprintf(s->met.ar_codec, sizeof s->met.ar_codec, "%s", c->tp > 1 && ci ? ci->name : "none");
        s->met.ar_group = c->tp > 1 ? wc.group_size : 0;
        s->met.ar_bits = c->tp > 1 && ci ? echo_config_bits(&wc) : 0; /* averaged over a pass (the tail policy) */
        s->met.ar_feedback = c->tp > 1 && wc.feedback;
        echo_auto_figures af;
        echo_auto_choice ac;
        s->met.ar_auto = eng_allreduce_auto(s->eng, &af, &ac);
        if (s->met.ar_auto) {
            snprintf(s->met.ar_auto_small, sizeof s->met.ar_auto_small, "%s", echo_preset_name(ac.preset[ECHO_AUTO_SMALL]));
            snprintf(s->met.ar_auto_large, sizeof s->met.ar_auto_large, "%s", echo_preset_name(ac.preset[ECHO_AUTO_LARGE]));
            s->met.ar_auto_oneshot = ac.oneshot[ECHO_AUTO_SMALL];
            s->met.ar_auto_overlap = ac.overlap_k;
            s->met.ar_auto_shared = af.shared_memory;
            for (int k = 0; k < 2; k++) s->met.ar_auto_lat_s[k] = af.link[k].latency_s, s->met.ar_auto_bps[k] = af.link[k].bytes_per_s;
            for (int i = 0; i < 4; i++) s->met.ar_auto_enc[i] = af.encode_vps[i], s->met.ar_auto_dec[i] = af.decode_vps[i];
        }
        s->met.ar_tail_calls = c->tp > 1 ? wc.tail_sites : 0;
        s->met.ar_calls = c->tp > 1 ? wc.n_sites : 0;
        snprintf(s->met.ar_tail_codec, sizeof s->met.ar_tail_codec, "%s",
                 s->met.ar_tail_calls ? echo_codec_get(wc.tail_codec)->name : "none");
        s->met.ar_tp = c->tp;
    }
    pthread_mutex_unlock(&s->met.mu);
    return 0;
}

int srv_load(srv_server *s, char *err, size_t errlen) {
    double t0;
    echo_config wc;
    if (load_text_side(s, err, errlen) || load_engine(s, &t0, err, errlen)) return -1;
    log_plan(s, t0, &wc);
    if (init_metrics(s, &wc, err, errlen) || srv_sched_start(s, err, errlen)) return -1;
    atomic_store(&s->ready, 1);
    return 0;
}

void srv_shutdown(srv_server *s) {
    if (!s || s->shut_down) return;
    s->shut_down = 1;
    atomic_store(&s->accepting, 0);
    srv_http_quiesce(s);
    srv_sched_stop(s);
}

void srv_destroy(srv_server *s) {
    if (!s) return;
    srv_shutdown(s);
    srv_http_stop(s);
    eng_destroy(s->eng);
    tok_free(s->tok);
    eng_chat_template_free(&s->chat);
    eng_chat_template_free(&s->chat_builtin);
    srv_sched *q = &s->sch;
    free(q->running);
    free(q->items);
    free(q->item_req);
    free(q->fins);
    free(q->logits);
    free(q->cands);
    free(q->full);
    srv_logits_scratch_free(&q->lx);
    free(q->piece);
    /* Compiles abandoned at shutdown may still run (xgrammar cannot be
     * interrupted): their vocabulary and pool stay for the process's exit. */
    int live = srv_cpool_free(s->cpool);
    if (live)
        srv_log(s, SRV_LOG_WARNING, "%d abandoned grammar compile(s) still running at exit", live);
    else
        gram_vocab_free(s->gvocab);
    srv_resp_store_free(s->resp_store);
    pthread_mutex_destroy(&s->gram_mu);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    srv_metrics_free(&s->met);
    pthread_mutex_destroy(&s->conn_mu);
    free(s->model_dir);
    free(s->name);
    free(s);
}

int srv_grammar_compiles_running(srv_server *s) {
    return s ? srv_cpool_running(s->cpool) : 0;
}

