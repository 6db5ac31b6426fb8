// C API over the SentencePiece C++ library, for models that ship a
// tokenizer.model (Llama-2 / Mistral style). Only tokenizer/ calls these;
// the declarations live in tokenizer/internal.h. No C++ exception may cross
// into C, so every entry point catches.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tokenizer/internal.h"
#include "tokenizer/tokenizer.h"

struct tok_spm {
    sentencepiece::SentencePieceProcessor sp;
    int strip_first_space;
};

extern "C" int tok_spm_load(const char *path, tok_spm **out, char *err, size_t errlen) {
    *out = nullptr;
    try {
        tok_spm *m = new tok_spm();
        auto st = m->sp.Load(path);
        if (!st.ok()) {
            int rc = tok_err(err, errlen, TOK_EFORMAT, "%s: %s", path, st.ToString().c_str());
            delete m;
            return rc;
        }
        // The decoder drops the space of the first piece when the model adds
        // a dummy prefix; probe it instead of reading the model proto (its
        // protobuf header is not installed).
        std::vector<std::string> pieces;
        m->strip_first_space = 1;
        if (m->sp.Encode("a", &pieces).ok() && !pieces.empty())
            m->strip_first_space = pieces[0].rfind("\xE2\x96\x81", 0) == 0;
        *out = m;
        return TOK_OK;
    } catch (const std::bad_alloc &) {
        return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
    } catch (...) {
        return tok_err(err, errlen, TOK_EFORMAT, "%s: cannot load SentencePiece model", path);
    }
}

extern "C" void tok_spm_free(tok_spm *m) { delete m; }

extern "C" int tok_spm_encode(const tok_spm *m, const char *text, size_t len, int32_t **ids,
                              size_t *n, char *err, size_t errlen) {
    *ids = nullptr;
    *n = 0;
    try {
        std::vector<int> v;
        auto st = m->sp.Encode(std::string(text, len), &v);
        if (!st.ok()) return tok_err(err, errlen, TOK_EINVAL, "%s", st.ToString().c_str());
        int32_t *p = static_cast<int32_t *>(malloc((v.size() ? v.size() : 1) * sizeof(int32_t)));
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        for (size_t i = 0; i < v.size(); i++) p[i] = v[i];
        *ids = p;
        *n = v.size();
        return TOK_OK;
    } catch (...) {
        return tok_err(err, errlen, TOK_ENOMEM, "SentencePiece encode failed");
    }
}

extern "C" int tok_spm_decode(const tok_spm *m, const int32_t *ids, size_t n, char **out,
                              size_t *out_len, char *err, size_t errlen) {
    *out = nullptr;
    *out_len = 0;
    try {
        std::vector<int> v;
        int size = m->sp.GetPieceSize();
        // Out-of-range ids are skipped, as for tokenizer.json models (the
        // library would fail the whole call).
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < size) v.push_back(ids[i]);
        std::string s;
        auto st = m->sp.Decode(v, &s);
        if (!st.ok()) return tok_err(err, errlen, TOK_EINVAL, "%s", st.ToString().c_str());
        char *p = static_cast<char *>(malloc(s.size() + 1));
        if (!p) return tok_err(err, errlen, TOK_ENOMEM, "out of memory");
        memcpy(p, s.data(), s.size());
        p[s.size()] = 0;
        *out = p;
        *out_len = s.size();
        return TOK_OK;
    } catch (...) {
        return tok_err(err, errlen, TOK_ENOMEM, "SentencePiece decode failed");
    }
}

extern "C" size_t tok_spm_vocab_size(const tok_spm *m) { return (size_t)m->sp.GetPieceSize(); }

extern "C" int32_t tok_spm_piece_to_id(const tok_spm *m, const char *piece) {
    try {
        int id = m->sp.PieceToId(piece);
        // PieceToId answers unk for unknown strings; only an exact unk piece
        // should map to it.
        if (m->sp.IsUnknown(id) && m->sp.IdToPiece(id) != piece) return -1;
        return id;
    } catch (...) {
        return -1;
    }
}

extern "C" char *tok_spm_id_to_piece(const tok_spm *m, int32_t id) {
    if (id < 0 || id >= m->sp.GetPieceSize()) return nullptr;
    try {
        const std::string &s = m->sp.IdToPiece(id);
        char *p = static_cast<char *>(malloc(s.size() + 1));
        if (!p) return nullptr;
        memcpy(p, s.data(), s.size());
        p[s.size()] = 0;
        return p;
    } catch (...) {
        return nullptr;
    }
}

extern "C" int tok_spm_piece_kind(const tok_spm *m, int32_t id) {
    if (m->sp.IsControl(id)) return TOK_SPM_CONTROL;
    if (m->sp.IsUnknown(id)) return TOK_SPM_UNKNOWN;
    if (m->sp.IsByte(id)) return TOK_SPM_BYTE;
    if (m->sp.IsUnused(id)) return TOK_SPM_UNUSED;
    return TOK_SPM_NORMAL;
}

extern "C" int32_t tok_spm_bos_id(const tok_spm *m) { return m->sp.bos_id(); }
extern "C" int32_t tok_spm_eos_id(const tok_spm *m) { return m->sp.eos_id(); }
extern "C" int tok_spm_add_dummy_prefix(const tok_spm *m) { return m->strip_first_space; }
