/*
 * The Jinja lexer: template source to tokens (data, tag delimiters,
 * names, literals, operators), with trim_blocks / lstrip_blocks and
 * whitespace control applied here.
 */
#include "tokenizer/jinja_internal.h"

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_ident0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* Decode a string literal body the way jinja2 does (Python's
 * unicode-escape: known escapes are replaced, unknown ones kept). */
static void lex_string(parser *p, token *t, const char *s, size_t n, int line) {
    sbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            sb_put(p->a, &b, s + i, 1);
            continue;
        }
        char c = s[++i];
        const char *simple = NULL;
        switch (c) {
        case 'n': simple = "\n"; break;
        case 't': simple = "\t"; break;
        case 'r': simple = "\r"; break;
        case '\\': simple = "\\"; break;
        case '\'': simple = "'"; break;
        case '"': simple = "\""; break;
        case 'a': simple = "\a"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'v': simple = "\v"; break;
        case '\n': simple = ""; break;
        default: break;
        }
        if (simple) {
            sb_puts(p->a, &b, simple);
            continue;
        }
        int32_t cp = -1;
        if (c >= '0' && c <= '7') {
            cp = 0;
            size_t k = 0;
            for (; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++, i++) cp = cp * 8 + (s[i] - '0');
            i--;
        } else if (c == 'x' || c == 'u' || c == 'U') {
            size_t want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            cp = 0;
            for (size_t k = 0; k < want; k++) {
                char h = i + 1 + k < n ? s[i + 1 + k] : 0;
                int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (v < 0) perr(p, line, "truncated \\%c escape in string literal", c);
                cp = cp * 16 + v;
            }
            i += want;
        } else if (c == 'N') {
            perr(p, line, "unsupported construct '\\N{...}' escape");
        } else {
            sb_put(p->a, &b, s + i - 1, 2); /* unknown escape stays as written */
            continue;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) perr(p, line, "invalid escape in string literal");
        char u[4];
        sb_put(p->a, &b, u, u8enc(cp, u));
    }
    t->s = b.p ? b.p : "";
    t->n = b.n;
}

static const char *const OPS3[] = {"**", "//", "==", "!=", ">=", "<=", NULL};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Lex the inside of a tag until its end marker; returns the position after
 * the end marker (with trim_blocks/`-` handling applied). */
static size_t lex_tag(parser *p, const char *src, size_t n, size_t i, int *line, int is_block, int *line_starting) {
    int bal = 0;
    for (;;) {
        while (i < n && is_ws(src[i])) *line += src[i++] == '\n';
        if (i >= n) perr(p, *line, "unexpected end of template, expected end of %s", is_block ? "block" : "print");
        /* end of tag, only when brackets are balanced */
        if (!bal) {
            const char *end = is_block ? "%}" : "}}";
            int minus = 0, plus = 0;
            size_t j = i;
            if (src[j] == '-' && j + 2 < n + 1 && !strncmp(src + j + 1, end, 2)) minus = 1, j++;
            else if (is_block && src[j] == '+' && !strncmp(src + j + 1, end, 2)) plus = 1, j++;
            if (j + 2 <= n && !strncmp(src + j, end, 2)) {
                j += 2;
                push_tok(p, is_block ? TK_BEND : TK_VEND, *line);
                if (minus) {
                    while (j < n && is_ws(src[j])) *line += src[j++] == '\n';
                } else if (is_block && !plus && j < n && src[j] == '\n') {
                    j++, (*line)++;
                    *line_starting = 1;
                    return j;
                }
                *line_starting = j > 0 && src[j - 1] == '\n';
                return j;
            }
        }
        char c = src[i];
        if (is_ident0(c) || (unsigned char)c >= 0x80) {
            size_t j = i;
            while (j < n && (is_ident0(src[j]) || is_digit(src[j]))) j++;
            if (j == i) perr(p, *line, "unexpected character in tag");
            token *t = push_tok(p, TK_NAME, *line);
            t->s = src + i;
            t->n = j - i;
            i = j;
        } else if (c == '0' && i + 2 < n && strchr("xXoObB", src[i + 1]) && src[i + 1] &&
                   (isxdigit((unsigned char)src[i + 2]) || src[i + 2] == '_')) {
            /* 0x / 0o / 0b literals */
            int base = (src[i + 1] | 32) == 'x' ? 16 : (src[i + 1] | 32) == 'o' ? 8 : 2;
            size_t j = i + 2;
            uint64_t v = 0;
            int any = 0;
            for (; j < n; j++) {
                int d = src[j] == '_' ? -2 : is_digit(src[j]) ? src[j] - '0' : isxdigit((unsigned char)src[j]) ? (src[j] | 32) - 'a' + 10 : -1;
                if (d == -2) continue;
                if (d < 0 || d >= base) break;
                if (v > (uint64_t)INT64_MAX / (uint64_t)base) perr(p, *line, "unsupported construct: integer literal too large");
                v = v * (uint64_t)base + (uint64_t)d;
                any = 1;
            }
            if (!any || v > (uint64_t)INT64_MAX) perr(p, *line, "invalid integer literal");
            token *t = push_tok(p, TK_INT, *line);
            t->i = (int64_t)v;
            i = j;
        } else if (is_digit(c)) {
            /* integer / float with '_' separators, as jinja2's lexer; no
             * float right after a '.' (x.0.1 is two subscripts) */
            int after_dot = p->n && p->t[p->n - 1].type == TK_OP && p->t[p->n - 1].n == 1 && p->t[p->n - 1].s[0] == '.';
            size_t j = i;
            char num[80];
            size_t k = 0;
            int isf = 0;
            while (j < n && (is_digit(src[j]) || (src[j] == '_' && j + 1 < n && is_digit(src[j + 1]))))
                if (src[j++] != '_' && k < sizeof num - 8) num[k++] = src[j - 1];
            if (!after_dot && j + 1 < n && src[j] == '.' && is_digit(src[j + 1])) {
                isf = 1;
                num[k++] = src[j++];
                while (j < n && (is_digit(src[j]) || (src[j] == '_' && j + 1 < n && is_digit(src[j + 1]))))
                    if (src[j++] != '_' && k < sizeof num - 8) num[k++] = src[j - 1];
            }
            if (!after_dot && j < n && (src[j] == 'e' || src[j] == 'E')) {
                size_t e = j + 1;
                if (e < n && (src[e] == '+' || src[e] == '-')) e++;
                if (e < n && is_digit(src[e])) {
                    isf = 1;
                    num[k++] = 'e';
                    if (src[j + 1] == '-') num[k++] = '-';
                    j = e;
                    while (j < n && (is_digit(src[j]) || (src[j] == '_' && j + 1 < n && is_digit(src[j + 1]))))
                        if (src[j++] != '_' && k < sizeof num - 2) num[k++] = src[j - 1];
                }
            }
            num[k] = 0;
            token *t = push_tok(p, isf ? TK_FLOAT : TK_INT, *line);
            if (isf) t->f = strtod(num, NULL);
            else {
                errno = 0;
                unsigned long long v = strtoull(num, NULL, 10);
                if (errno || v > INT64_MAX) perr(p, *line, "unsupported construct: integer literal too large");
                t->i = (int64_t)v;
            }
            i = j;
        } else if (c == '\'' || c == '"') {
            size_t j = i + 1;
            int l0 = *line;
            while (j < n && src[j] != c) {
                if (src[j] == '\\' && j + 1 < n) j++;
                *line += src[j] == '\n';
                j++;
            }
            if (j >= n) perr(p, l0, "unterminated string literal");
            token *t = push_tok(p, TK_STR, l0);
            lex_string(p, t, src + i + 1, j - i - 1, l0);
            i = j + 1;
        } else {
            size_t len = 0;
            for (int k = 0; OPS3[k]; k++)
                if (i + 1 < n && src[i] == OPS3[k][0] && src[i + 1] == OPS3[k][1]) len = 2;
            if (!len && c && strchr(OPS1, c)) len = 1;
            if (!len) perr(p, *line, "unexpected character '%c'", c);
            if (len == 1 && (c == '(' || c == '[' || c == '{')) bal++;
            if (len == 1 && (c == ')' || c == ']' || c == '}')) {
                if (!bal) perr(p, *line, "unexpected '%c'", c);
                bal--;
            }
            token *t = push_tok(p, TK_OP, *line);
            t->s = src + i;
            t->n = len;
            i += len;
        }
    }
}

/* Split the source into data and tag tokens, applying jinja2's whitespace
 * rules (see jinja2/lexer.py: `-`/`+` markers, lstrip_blocks, trim_blocks). */
void jinja_lex(parser *p, const char *src, size_t n) {
    size_t i = 0;
    int line = 1, line_starting = 1;
    while (i < n) {
        /* earliest tag start */
        size_t j = i;
        while (j + 1 < n && !(src[j] == '{' && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#'))) j++;
        if (j + 1 >= n) {
            token *t = push_tok(p, TK_DATA, line);
            t->s = src + i;
            t->n = n - i;
            return;
        }
        char kind = src[j + 1];
        char sign = j + 2 < n ? src[j + 2] : 0;
        if (sign != '-' && sign != '+') sign = 0;
        size_t tlen = j - i;
        if (sign == '-') {
            while (tlen && is_ws(src[i + tlen - 1])) tlen--;
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: drop spaces between the line start and a block/comment tag */
            size_t l = tlen;
            while (l && src[i + l - 1] != '\n') l--;
            int has_nl = l > 0;
            if (has_nl || line_starting) {
                size_t k = l;
                while (k < tlen && is_ws(src[i + k])) k++;
                if (k == tlen && l < tlen) tlen = l;
            }
        }
        if (tlen) {
            token *t = push_tok(p, TK_DATA, line);
            t->s = src + i;
            t->n = tlen;
        }
        line += count_nl(src + i, j - i);
        i = j + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            /* comment: ends at the first #} (with -/+ markers and trim_blocks) */
            size_t k = i;
            while (k + 1 < n && !(src[k] == '#' && src[k + 1] == '}')) k++;
            if (k + 1 >= n) perr(p, line, "missing end of comment tag");
            int minus = k > i && src[k - 1] == '-', plus = k > i && src[k - 1] == '+';
            line += count_nl(src + i, k - i);
            i = k + 2;
            if (minus) {
                while (i < n && is_ws(src[i])) line += src[i++] == '\n';
            } else if (!plus && i < n && src[i] == '\n') {
                i++, line++;
            }
            line_starting = src[i - 1] == '\n';
            continue;
        }
        if (kind == '%') {
            /* {% raw %} is not supported: say so instead of rendering it wrong */
            size_t k = i;
            while (k < n && is_ws(src[k])) k++;
            if (n - k >= 3 && !strncmp(src + k, "raw", 3) && (k + 3 >= n || !is_ident0(src[k + 3])))
                perr(p, line, "unsupported construct '{%% raw %%}'");
        }
        push_tok(p, kind == '%' ? TK_BBEGIN : TK_VBEGIN, line);
        i = lex_tag(p, src, n, i, &line, kind == '%', &line_starting);
    }
    push_tok(p, TK_EOF, line);
}
