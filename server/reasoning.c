/*
 * server/: reasoning output — a thinking model's <think>…</think> block
 * split from its answer.
 *
 * Two layers, one state machine (srv_reasoner):
 *   - text: srv_reasoner_feed takes generated text in pieces of any size
 *     and hands back reasoning bytes and answer bytes; the result does not
 *     depend on where the pieces were cut (bytes are resolved one at a time,
 *     a possible marker prefix is held back until it is decided). The chat
 *     answers (render.c), the streams (sse.c) and the Responses API reuse it.
 *   - tokens (the scheduler): the same machine fed each token's text decides
 *     whether the grammar masks the next token (structured outputs and tool
 *     grammars apply to the answer, after the block), counts the thinking
 *     tokens (usage.completion_tokens_details.reasoning_tokens) and closes
 *     the block at the thinking budget by emitting the end marker's tokens.
 *
 * A parser is one row of REASON_FORMATS: its markers, and whether the block
 * is already open when the output starts (the chat template wrote the start
 * marker into the prompt, as DeepSeek-R1's does: only the end marker shows
 * in the output). The per-request start state also comes from the rendered
 * prompt: a prompt that leaves a block open starts inside it; one that ends
 * with a closed block (Qwen3's template under enable_thinking: false) has
 * no reasoning.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"

/* clang-format off */
static const srv_reason_format REASON_FORMATS[] = {
    /* name          start       end          open at output start */
    {"qwen3",       "<think>",  "</think>",  0},
    {"deepseek_r1", "<think>",  "</think>",  1},
};
/* clang-format on */

const srv_reason_format *srv_reason_format_named(const char *name) {
    for (size_t i = 0; i < sizeof REASON_FORMATS / sizeof *REASON_FORMATS; i++)
        if (!strcmp(REASON_FORMATS[i].name, name)) return &REASON_FORMATS[i];
    return NULL;
}

int srv_text_put(srv_text *t, const char *p, size_t n) {
    if (!t || !n) return 0;
    if (t->len + n + 1 > t->cap) {
        size_t nc = t->cap ? t->cap : 64;
        while (nc < t->len + n + 1)
            nc *= 2;
        char *np = realloc(t->p, nc);
        if (!np) return -1;
        t->p = np;
        t->cap = nc;
    }
    memcpy(t->p + t->len, p, n);
    t->len += n;
    t->p[t->len] = 0;
    return 0;
}

void srv_text_free(srv_text *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

void srv_reasoner_init(srv_reasoner *z, const srv_reason_format *f, srv_rz_state state, const char *stop_tag) {
    memset(z, 0, sizeof *z);
    z->f = f;
    z->stop = stop_tag && *stop_tag ? stop_tag : NULL;
    z->state = f ? state : SRV_RZ_CONTENT;
    /* a block open from the prompt: a start marker the model repeats is dropped */
    z->lead = f && state == SRV_RZ_THINK;
    z->opened = f && state == SRV_RZ_THINK;
    if (z->stop && strlen(z->stop) >= sizeof z->pend) z->stop = NULL;
}

static int is_prefix(const char *pend, size_t n, const char *m) {
    size_t ml = m ? strlen(m) : 0;
    return m && n <= ml && !memcmp(pend, m, n);
}

/* Resolve the pending bytes as far as they can be; -1 out of memory. */
static int rz_resolve(srv_reasoner *z, srv_text *reason, srv_text *content) {
    for (;;) {
        if (z->np == 0) return 0;
        if (z->state == SRV_RZ_CONTENT) {
            int rc = srv_text_put(content, z->pend, z->np);
            z->np = 0;
            return rc;
        }
        const char *st = z->f->start;
        if (z->state == SRV_RZ_START || z->lead) {
            if (is_prefix(z->pend, z->np, st)) {
                if (z->np < strlen(st)) return 0; /* undecided */
                z->np = 0;
                z->marks++;
                if (z->state == SRV_RZ_START) z->opened = 1;
                z->state = SRV_RZ_THINK;
                z->lead = 0;
                return 0;
            }
            z->lead = 0;
            if (z->state == SRV_RZ_START) {
                z->state = SRV_RZ_CONTENT; /* the output does not open a block: all answer */
                continue;
            }
        }
        /* in the block: the end marker closes it; the tool-call marker ends
         * it too and stays in the answer */
        const char *en = z->f->end;
        if (z->np == strlen(en) && !memcmp(z->pend, en, z->np)) {
            z->np = 0;
            z->marks++;
            z->state = SRV_RZ_CONTENT;
            return 0;
        }
        if (z->stop && z->np == strlen(z->stop) && !memcmp(z->pend, z->stop, z->np)) {
            z->marks++;
            z->state = SRV_RZ_CONTENT;
            continue;
        }
        if (is_prefix(z->pend, z->np, en) || is_prefix(z->pend, z->np, z->stop)) return 0;
        if (srv_text_put(reason, z->pend, 1)) return -1;
        memmove(z->pend, z->pend + 1, --z->np);
    }
}

int srv_reasoner_feed(srv_reasoner *z, const char *p, size_t n, srv_text *reason, srv_text *content) {
    if (z->state == SRV_RZ_CONTENT && z->np == 0) return srv_text_put(content, p, n); /* the common case */
    for (size_t i = 0; i < n; i++) {
        z->pend[z->np++] = p[i];
        if (rz_resolve(z, reason, content)) return -1;
        if (z->np >= sizeof z->pend) return -1; /* cannot happen: markers are shorter */
    }
    return 0;
}

int srv_reasoner_flush(srv_reasoner *z, srv_text *reason, srv_text *content) {
    int rc = 0;
    if (z->np) rc = srv_text_put(z->state == SRV_RZ_START ? content : reason, z->pend, z->np);
    z->np = 0;
    return rc;
}

/* ---- per request ---- */

/* The last `n` ids decoded with special tokens kept: the prompt's tail. */
static char *prompt_tail(const srv_server *s, const int32_t *ids, int n, size_t *len) {
    int k = n < 64 ? n : 64;
    char *t = NULL, err[64];
    if (tok_decode(s->tok, ids + n - k, (size_t)k, 0, &t, len, err, sizeof err) != TOK_OK) return NULL;
    return t;
}

static const char *mem_last(const char *h, size_t hl, const char *n) {
    size_t nl = strlen(n);
    for (size_t i = hl >= nl ? hl - nl + 1 : 0; i-- > 0;)
        if (!memcmp(h + i, n, nl)) return h + i;
    return NULL;
}

int srv_reason_start_state(const srv_server *s, const int32_t *prompt, int n_prompt, int enable_thinking) {
    const srv_reason_format *f = s->reason;
    if (!f || !enable_thinking || n_prompt <= 0) return -1;
    size_t len = 0;
    char *t = prompt_tail(s, prompt, n_prompt, &len);
    if (!t) return f->open ? SRV_RZ_THINK : SRV_RZ_START;
    const char *so = mem_last(t, len, f->start), *eo = mem_last(t, len, f->end);
    int st;
    if (so && (!eo || so > eo)) {
        st = SRV_RZ_THINK; /* the prompt opened the block */
    } else if (eo) {
        const char *a = eo + strlen(f->end);
        while (a < t + len && (*a == '\n' || *a == ' ' || *a == '\r' || *a == '\t'))
            a++;
        /* a block the template closed right before the answer: thinking off */
        st = a == t + len ? -1 : f->open ? SRV_RZ_THINK : SRV_RZ_START;
    } else {
        st = f->open ? SRV_RZ_THINK : SRV_RZ_START;
    }
    free(t);
    return st;
}

static int reason_pick(srv_server *s, const char *want, char *err, size_t errlen);

int srv_reason_setup(srv_server *s, char *err, size_t errlen) {
    const char *want = s->opt.reasoning_parser ? s->opt.reasoning_parser : "auto";
    s->reason = NULL;
    s->think_start_id = -1;
    int rc = reason_pick(s, want, err, errlen);
    if (!rc && !s->reason && s->opt.has_reasoning_budget) {
        snprintf(err, errlen,
                 "--reasoning-budget %d needs a reasoning parser, and this server has none (--reasoning-parser %s%s)",
                 s->opt.reasoning_budget, want, strcmp(want, "auto") ? "" : ": the chat template has no <think> block");
        return -1;
    }
    return rc;
}

static int reason_pick(srv_server *s, const char *want, char *err, size_t errlen) {
    if (!strcmp(want, "none")) return 0;
    const char *src = s->chat.source;
    if (!strcmp(want, "auto")) {
        /* Qwen3's built-in template writes <think> blocks; a model's own
         * template does when it names the marker. */
        if (src && !strstr(src, "<think>")) return 0;
        const srv_reason_format *f = srv_reason_format_named("qwen3");
        if (src) {
            /* does the generation prompt open the block? (DeepSeek-R1 style) */
            char *out = NULL, terr[256];
            size_t ol = 0;
            const char *ctx = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": "
                              "true}";
            if (eng_chat_render(&s->chat, ctx, &out, &ol, terr, sizeof terr) == 0) {
                const char *so = mem_last(out, ol, "<think>"), *eo = mem_last(out, ol, "</think>");
                if (so && (!eo || so > eo)) f = srv_reason_format_named("deepseek_r1");
            }
            free(out);
        }
        s->reason = f;
    } else {
        s->reason = srv_reason_format_named(want);
        if (!s->reason) {
            snprintf(err, errlen, "--reasoning-parser expects auto, none, qwen3 or deepseek_r1, got '%s'", want);
            return -1;
        }
    }
    /* the end marker's tokens, forced at the thinking budget */
    int32_t *ids = NULL;
    int n = 0;
    char terr[128];
    size_t nn = 0;
    if (tok_encode(s->tok, s->reason->end, strlen(s->reason->end), 0, &ids, &nn, terr, sizeof terr) != TOK_OK ||
        nn == 0 || nn > 16) {
        free(ids);
        snprintf(err, errlen, "--reasoning-parser %s: the end marker '%s' does not tokenize (%s)", s->reason->name,
                 s->reason->end, terr);
        return -1;
    }
    n = (int)nn;
    memcpy(s->think_end_ids, ids, (size_t)n * sizeof *ids);
    s->n_think_end = n;
    free(ids);
    ids = NULL;
    if (tok_encode(s->tok, s->reason->start, strlen(s->reason->start), 0, &ids, &nn, terr, sizeof terr) == TOK_OK &&
        nn == 1)
        s->think_start_id = ids[0];
    free(ids);
    return 0;
}

/* ---- the scheduler's side ---- */

int srv_think_gate(const srv_req *r) {
    return r->rz_on ? r->rz.state != SRV_RZ_THINK : 1;
}

void srv_think_mask(const srv_server *s, const srv_req *r, uint32_t *mask) {
    /* before the output has opened a block, the start marker stays allowed
     * beside the grammar's tokens: the model may think first */
    if (r->rz_on && r->rz.state == SRV_RZ_START && r->rz.np == 0 && s->think_start_id >= 0)
        mask[s->think_start_id / 32] |= 1u << (s->think_start_id % 32);
}

int srv_think_accept(const srv_server *s, srv_req *r, int32_t tok) {
    if (r->gm_taken) {
        r->gm_taken = 0;
        return 1;
    }
    if (!srv_think_gate(r)) return 1;
    if (r->rz_on && r->rz.state == SRV_RZ_START && tok == s->think_start_id) return 1;
    return gram_matcher_accept(r->gm, tok);
}

int srv_think_override(const srv_server *s, srv_req *r, srv_tokrec *rec) {
    int n_out = r->n_all - r->n_prompt;
    int32_t tok = -1;
    int why = 0;
    if (r->n_forced > n_out) { /* --debug-request-fields: the output is given */
        tok = r->forced[n_out];
        why = 1;
    }
    if (r->rz_on && r->rz.state == SRV_RZ_THINK && r->think_budget >= 0 &&
        (r->rz_forcing > 0 || atomic_load(&r->n_think) >= r->think_budget) && r->rz_forcing < s->n_think_end) {
        tok = s->think_end_ids[r->rz_forcing++];
        why = 2;
    }
    if (!why) return 0;
    if (why == 1 && r->gm && srv_think_gate(r) && !(r->rz_on && r->rz.state == SRV_RZ_START &&
                                                    tok == s->think_start_id)) {
        /* a given output the request's grammar refuses ends there: the
         * sampled (masked) token stands, and no 500 follows */
        if (!gram_matcher_accept(r->gm, tok)) {
            r->n_forced = 0;
            return 0;
        }
        r->gm_taken = 1; /* srv_think_accept must not feed it twice */
    }
    /* a forced token has no sampled logprob: 0, no alternatives */
    memset(rec, 0, sizeof *rec);
    rec->token = tok;
    return why;
}

void srv_think_track(srv_req *r, size_t gen_before, int32_t tok, int forced_close) {
    if (!r->rz_on) return;
    srv_rz_state before = r->rz.state;
    int marks = r->rz.marks;
    if (r->gen_len > gen_before) srv_reasoner_feed(&r->rz, r->gen + gen_before, r->gen_len - gen_before, NULL, NULL);
    if (before == SRV_RZ_THINK && r->rz.state == SRV_RZ_THINK && r->rz.marks == marks && !forced_close)
        atomic_fetch_add(&r->n_think, 1);
    /* a tool-call marker ended the block: the grammar starts at it */
    if (before == SRV_RZ_THINK && r->rz.state == SRV_RZ_CONTENT && r->rz.stop && r->gm && r->rz.np == 0 &&
        !forced_close) {
        const char *st = r->rz.stop;
        size_t sl = strlen(st);
        if (r->gen_len >= sl && !memcmp(r->gen + r->gen_len - sl, st, sl)) gram_matcher_accept(r->gm, tok);
    }
}

int srv_reason_set(const srv_server *s, json_t *obj, json_t *val) {
    int f = s->opt.reasoning_field, rc = 0;
    if (!val) return -1;
    if (f == 0 || f == 2) rc |= json_object_set(obj, "reasoning_content", val);
    if (f == 1 || f == 2) rc |= json_object_set(obj, "reasoning", val);
    json_decref(val);
    return rc ? -1 : 0;
}
