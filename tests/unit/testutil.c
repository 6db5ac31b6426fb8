#include "tests/unit/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

char *tu_mkdtemp(void) {
    char *d = strdup("/tmp/echo-test-XXXXXX");
    if (d && !mkdtemp(d)) { free(d); return NULL; }
    return d;
}

void tu_rmtree(const char *dir) {
    if (!dir || strncmp(dir, "/tmp/echo-test-", 15) != 0) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

char *tu_run(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, p)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    int st = pclose(p);
    if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (buf) buf[n] = 0;
    return buf;
}

double tu_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

json_t *tu_load_jsonl(const char *path) {
    size_t len;
    char *buf = tu_read_file(path, &len);
    if (!buf) {
        fprintf(stderr, "cannot read %s\n", path);
        return NULL;
    }
    json_t *arr = json_array();
    for (char *p = buf; arr && *p;) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n) {
            json_error_t je;
            json_t *v = json_loadb(p, n, JSON_ALLOW_NUL, &je);
            if (!v) {
                fprintf(stderr, "%s: %s\n", path, je.text);
                json_decref(arr);
                arr = NULL;
                break;
            }
            json_array_append_new(arr, v);
        }
        p += n + (nl ? 1 : 0);
    }
    free(buf);
    return arr;
}
