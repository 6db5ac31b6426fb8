// grammar/: the C interface of grammar.h over xgrammar's C++ API. The only
// file that includes xgrammar; every entry point catches what xgrammar
// throws and turns it into a status and a message.
#include "grammar/grammar.h"

#include <xgrammar/xgrammar.h>

#include <picojson.h>

#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace {

int set_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int set_err(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

// xgrammar's messages can carry a long backtrace-like tail; keep the first
// line, without the "[16:45:02] /build/path/file.cc:5082: " prefix of its
// logger (a timestamp and the build machine's paths mean nothing to a client).
std::string first_line(const char *what) {
    std::string s = what ? what : "";
    size_t nl = s.find('\n');
    if (nl != std::string::npos) s.resize(nl);
    size_t at = 0;
    if (s.size() > 2 && s[0] == '[') {
        size_t rb = s.find("] ");
        if (rb != std::string::npos && rb < 32) at = rb + 2;
    }
    // "file.cc:123: " (a path without spaces, a line number, then ": ")
    size_t sp = s.find(' ', at);
    if (sp != std::string::npos && sp > at + 1 && s[sp - 1] == ':') {
        size_t c2 = sp - 1, c1 = s.rfind(':', c2 - 1);
        bool num = c1 != std::string::npos && c1 >= at && c2 > c1 + 1;
        for (size_t i = c1 + 1; num && i < c2; i++) num = s[i] >= '0' && s[i] <= '9';
        if (num && s.find('.', at) < c1) at = sp + 1;
    }
    return s.substr(at);
}

// EBNF string literal of arbitrary UTF-8 text (GRAM_CHOICE).
void ebnf_quote(const std::string &s, std::string *out) {
    out->push_back('"');
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out->push_back('\\');
            out->push_back((char)c);
        } else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\x%02x", c);
            out->append(buf);
        } else {
            out->push_back((char)c);
        }
    }
    out->push_back('"');
}

// Choices as a JSON array of strings -> `root ::= "a" | "b"`. xgrammar's
// bundled picojson parses the array, so no second JSON library is needed.
int choice_ebnf(const std::string &src, std::string *ebnf, char *err, size_t errlen) {
    picojson::value v;
    std::string perr = picojson::parse(v, src);
    if (!perr.empty()) return set_err(err, errlen, GRAM_EINVAL, "choices: not JSON: %s", perr.c_str());
    if (!v.is<picojson::array>() || v.get<picojson::array>().empty())
        return set_err(err, errlen, GRAM_EINVAL, "choices: must be a non-empty array of strings");
    *ebnf = "root ::= ";
    size_t i = 0;
    for (const picojson::value &c : v.get<picojson::array>()) {
        if (!c.is<std::string>()) return set_err(err, errlen, GRAM_EINVAL, "choices[%zu]: must be a string", i);
        if (c.get<std::string>().empty())
            return set_err(err, errlen, GRAM_EINVAL, "choices[%zu]: must not be empty", i);
        if (i++) ebnf->append(" | ");
        ebnf_quote(c.get<std::string>(), ebnf);
    }
    ebnf->push_back('\n');
    return GRAM_OK;
}

} // namespace

struct gram_vocab {
    xgrammar::TokenizerInfo info;
    xgrammar::GrammarCompiler compiler;
    size_t vocab_size;
    // Bit i set unless token i holds a byte below 0x20. xgrammar 0.2.9 lets a
    // JSON string hold raw control characters (a string with minLength, a
    // pattern such as "\t"), which makes the text invalid JSON; JSON here has
    // no free whitespace, so a JSON grammar never needs such a token.
    std::vector<uint32_t> no_ctl;
    gram_vocab(xgrammar::TokenizerInfo i, size_t vs)
        // One thread per compile: the server runs compiles on threads of its
        // own (server/compile.c), as many at once as it allows; xgrammar's
        // pool would multiply that behind its back. The cache's cap is
        // xgrammar's estimate of the compiled grammars' bytes.
        : info(i), compiler(info, /*max_threads=*/1, /*cache_enabled=*/true,
                            /*max_memory_bytes=*/GRAM_CACHE_BYTES),
          vocab_size(vs) {}
};

struct gram_grammar {
    xgrammar::CompiledGrammar cg;
    const uint32_t *no_ctl; // JSON kinds: the vocab's mask of tokens without control bytes
};

struct gram_matcher {
    xgrammar::GrammarMatcher m;
    size_t vocab_size;
    const uint32_t *no_ctl;
};

extern "C" {

int gram_vocab_new(const char *const *tokens, const size_t *lens, size_t n_tokens, size_t vocab_size,
                   const int32_t *stop_ids, size_t n_stop, gram_vocab **out, char *err, size_t errlen) {
    *out = nullptr;
    if (n_tokens == 0 || vocab_size < n_tokens || vocab_size > (1u << 24))
        return set_err(err, errlen, GRAM_EINVAL, "vocab: %zu tokens for a vocabulary of %zu", n_tokens, vocab_size);
    try {
        std::vector<std::string> vocab(n_tokens);
        for (size_t i = 0; i < n_tokens; i++)
            if (lens[i]) vocab[i].assign(tokens[i], lens[i]);
        std::vector<int32_t> stops;
        for (size_t i = 0; i < n_stop; i++) {
            if (stop_ids[i] < 0 || (size_t)stop_ids[i] >= n_tokens)
                return set_err(err, errlen, GRAM_EINVAL, "vocab: stop id %d out of range", (int)stop_ids[i]);
            stops.push_back(stop_ids[i]);
        }
        // RAW: the strings are already the decoded bytes (the caller's
        // tokenizer did the byte-level / SentencePiece decoding).
        xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, (int)vocab_size, stops, false);
        gram_vocab *gv = new gram_vocab(info, vocab_size);
        gv->no_ctl.assign(gram_mask_words(vocab_size), 0xffffffffu);
        for (size_t i = 0; i < n_tokens; i++)
            for (size_t k = 0; k < lens[i]; k++)
                if ((unsigned char)tokens[i][k] < 0x20) {
                    gv->no_ctl[i / 32] &= ~(1u << (i % 32));
                    break;
                }
        *out = gv;
        return GRAM_OK;
    } catch (const std::bad_alloc &) {
        return set_err(err, errlen, GRAM_ENOMEM, "out of memory building the grammar vocabulary");
    } catch (const std::exception &e) {
        return set_err(err, errlen, GRAM_EINTERNAL, "vocab: %s", first_line(e.what()).c_str());
    } catch (...) {
        return set_err(err, errlen, GRAM_EINTERNAL, "vocab: unknown error");
    }
}

void gram_vocab_free(gram_vocab *v) {
    delete v;
}

size_t gram_vocab_size(const gram_vocab *v) {
    return v->vocab_size;
}

int gram_compile(gram_vocab *v, gram_kind kind, const char *src, size_t len, gram_grammar **out, double *seconds,
                 char *err, size_t errlen) {
    *out = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    const char *what = "grammar";
    try {
        std::string s = src ? std::string(src, len) : std::string();
        std::optional<xgrammar::CompiledGrammar> cg;
        switch (kind) {
        case GRAM_JSON:
        case GRAM_JSON_SCHEMA:
            // GRAM_JSON is "any object" (OpenAI's json_object), not any JSON
            // value: xgrammar's builtin JSON grammar also allows arrays and
            // scalars. Fixed separators, no free whitespace: a small model
            // could otherwise pad with newlines until max_tokens.
            what = kind == GRAM_JSON ? "json_object" : "json_schema";
            cg = v->compiler.CompileJSONSchema(kind == GRAM_JSON ? std::string("{\"type\": \"object\"}") : s,
                                               /*any_whitespace=*/false, std::nullopt,
                                               std::make_pair(std::string(", "), std::string(": ")),
                                               /*strict_mode=*/true);
            break;
        case GRAM_REGEX:
            what = "regex";
            cg = v->compiler.CompileRegex(s);
            break;
        case GRAM_CHOICE: {
            what = "choice";
            std::string ebnf;
            int rc = choice_ebnf(s, &ebnf, err, errlen);
            if (rc) return rc;
            cg = v->compiler.CompileGrammar(ebnf, "root");
            break;
        }
        case GRAM_EBNF:
            what = "grammar";
            cg = v->compiler.CompileGrammar(s, "root");
            break;
        case GRAM_STRUCTURAL:
            what = "structural tag";
            cg = v->compiler.CompileStructuralTag(s);
            break;
        default: return set_err(err, errlen, GRAM_EINVAL, "unknown grammar kind %d", (int)kind);
        }
        bool json = kind == GRAM_JSON || kind == GRAM_JSON_SCHEMA;
        *out = new gram_grammar{*cg, json ? v->no_ctl.data() : nullptr};
        if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return GRAM_OK;
    } catch (const std::bad_alloc &) {
        return set_err(err, errlen, GRAM_ENOMEM, "out of memory compiling the %s", what);
    } catch (const std::exception &e) {
        return set_err(err, errlen, GRAM_EINVAL, "%s: %s", what, first_line(e.what()).c_str());
    } catch (...) {
        return set_err(err, errlen, GRAM_EINTERNAL, "%s: unknown error", what);
    }
}

void gram_grammar_free(gram_grammar *g) {
    delete g;
}

int gram_matcher_new(const gram_grammar *g, gram_matcher **out, char *err, size_t errlen) {
    *out = nullptr;
    try {
        size_t vs = (size_t)g->cg.GetTokenizerInfo().GetVocabSize();
        *out = new gram_matcher{xgrammar::GrammarMatcher(g->cg), vs, g->no_ctl};
        return GRAM_OK;
    } catch (const std::bad_alloc &) {
        return set_err(err, errlen, GRAM_ENOMEM, "out of memory for a grammar matcher");
    } catch (const std::exception &e) {
        return set_err(err, errlen, GRAM_EINTERNAL, "matcher: %s", first_line(e.what()).c_str());
    }
}

void gram_matcher_free(gram_matcher *m) {
    delete m;
}

int gram_matcher_accept(gram_matcher *m, int32_t token) {
    if (token < 0 || (size_t)token >= m->vocab_size) return 0;
    try {
        return m->m.AcceptToken(token) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

int gram_matcher_fill(gram_matcher *m, uint32_t *mask, char *err, size_t errlen) {
    int64_t words = (int64_t)gram_mask_words(m->vocab_size);
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    t.data = mask;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = &words;
    try {
        int some = m->m.FillNextTokenBitmask(&t) ? 1 : 0;
        if (m->no_ctl) {
            for (int64_t w = 0; w < words; w++)
                mask[w] &= m->no_ctl[w];
            some = 1;
        }
        return some;
    } catch (const std::bad_alloc &) {
        return set_err(err, errlen, GRAM_ENOMEM, "out of memory filling a token mask");
    } catch (const std::exception &e) {
        return set_err(err, errlen, GRAM_EINTERNAL, "token mask: %s", first_line(e.what()).c_str());
    }
}

int gram_matcher_complete(const gram_matcher *m) {
    try {
        return m->m.IsCompleted() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

int gram_matcher_terminated(const gram_matcher *m) {
    try {
        return m->m.IsTerminated() ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

size_t gram_mask_words(size_t vocab_size) {
    return (vocab_size + 31) / 32;
}

void gram_mask_apply(float *row, size_t vocab_size, const uint32_t *mask) {
    for (size_t w = 0; w * 32 < vocab_size; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xffffffffu) continue;
        size_t end = w * 32 + 32 < vocab_size ? w * 32 + 32 : vocab_size;
        for (size_t i = w * 32; i < end; i++)
            if (!(bits >> (i - w * 32) & 1u)) row[i] = -INFINITY;
    }
}

} // extern "C"
