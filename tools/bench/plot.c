/*
 * echo-bench plot: PNG pictures of benchmark results, drawn by gnuplot
 * (Debian's gnuplot-nox; pngcairo when it has it, else the libgd png
 * terminal). The kind of plot follows the files given:
 *
 *   serve results   ({"summary": ..., "requests": [...]} from echo-bench
 *                   serve --save-result): empirical CDF of a per-request
 *                   metric (TTFT by default), one curve per file, labelled
 *                   by the run's --label (else the file name), with p50/p99
 *                   in the legend.
 *   allreduce rows  (the JSON array of echo-bench allreduce --json):
 *                   algbw (or busbw) vs message size, one curve per algo
 *                   and file, log2 size axis.
 *
 * Data goes to gnuplot inline through a pipe, so nothing is left behind but
 * the PNG. Mixing the two kinds is a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tools/bench/bench.h"

#define PL_MAX_FILES 32
#define PL_MAX_ALGOS 8

typedef struct pl_opts {
    const char *out, *title, *metric, *gnuplot, *bw;
    int logx, logy, width, height;
} pl_opts;

typedef struct pl_file {
    const char *path;
    json_t *root;
    char label[256];
} pl_file;

static int pl_usage_error(const char *fmt, const char *a) { return bench_usage_error("plot", fmt, a); }

static const char *PL_USAGE =
    "usage: echo-bench plot RESULT.json... -o FILE.png [--metric ttft|tpot|e2e|itl] [--bw algbw|busbw]\n"
    "                       [--title TEXT] [--logx] [--logy] [--size WxH] [--gnuplot PATH]\n"
    "\n"
    "  serve results (echo-bench serve --save-result): CDF of the per-request metric, one curve per file\n"
    "  allreduce results (echo-bench allreduce --json): bandwidth vs message size, one curve per algo\n"
    "\n"
    "Needs gnuplot (Debian: apt-get install gnuplot-nox). Exit status: 0 ok, 1 runtime error, 2 usage error.\n";

/* gnuplot double-quoted string: backslash and quote escaped. */
static void pl_quote(FILE *g, const char *s) {
    fputc('"', g);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', g);
        if (*s == '\n') continue;
        fputc(*s, g);
    }
    fputc('"', g);
}

static int pl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ask gnuplot which terminals it has; pngcairo draws antialiased lines,
 * the libgd png terminal is the fallback every gnuplot build carries. */
static const char *pl_terminal(const char *gnuplot) {
    char cmd[1200], line[512];
    snprintf(cmd, sizeof cmd, "'%s' -e 'set terminal' 2>&1", gnuplot);
    FILE *p = popen(cmd, "r");
    int cairo = 0;
    if (!p) return "png";
    while (fgets(line, sizeof line, p))
        if (strstr(line, "pngcairo")) cairo = 1;
    pclose(p);
    return cairo ? "pngcairo" : "png";
}

static int pl_have_gnuplot(const char *gnuplot) {
    char cmd[1200];
    if (strchr(gnuplot, '\'')) return 0;
    snprintf(cmd, sizeof cmd, "'%s' --version >/dev/null 2>&1", gnuplot);
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Per-request values of `metric` from a serve result, successful requests
 * only (failed ones have null timings). itl pools every gap. */
static double *pl_metric_values(json_t *root, const char *metric, size_t *n) {
    json_t *reqs = json_object_get(root, "requests"), *r;
    size_t i, cap = 64, len = 0;
    double *v = malloc(cap * sizeof *v);
    char key[32];
    snprintf(key, sizeof key, "%s_ms", metric);
    if (!v) return NULL;
    json_array_foreach(reqs, i, r) {
        json_t *x = json_object_get(r, key);
        size_t k, m = json_is_array(x) ? json_array_size(x) : 1;
        for (k = 0; k < m; k++) {
            json_t *e = json_is_array(x) ? json_array_get(x, k) : x;
            if (!json_is_number(e)) continue;
            if (len == cap) {
                double *w = realloc(v, cap * 2 * sizeof *v);
                if (!w) {
                    free(v);
                    return NULL;
                }
                v = w, cap *= 2;
            }
            v[len++] = json_number_value(e);
        }
    }
    qsort(v, len, sizeof *v, pl_cmp);
    *n = len;
    return v;
}

static int pl_serve(FILE *g, pl_file *f, int nf, const pl_opts *o) {
    static const char *names[][2] = {{"ttft", "TTFT"}, {"tpot", "TPOT"}, {"e2e", "E2E latency"}, {"itl", "ITL"}};
    const char *name = o->metric;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(names[i][0], o->metric)) name = names[i][1];
    double *vals[PL_MAX_FILES] = {0};
    size_t nv[PL_MAX_FILES] = {0};
    int status = 1;
    for (int i = 0; i < nf; i++) {
        if (!(vals[i] = pl_metric_values(f[i].root, o->metric, &nv[i]))) {
            fprintf(stderr, "echo-bench plot: out of memory reading %s\n", f[i].path);
            goto out;
        }
        if (!nv[i]) fprintf(stderr, "echo-bench plot: %s has no successful requests to plot\n", f[i].path);
    }
    char title[300];
    snprintf(title, sizeof title, "%s CDF", name);
    fprintf(g, "set title ");
    pl_quote(g, o->title ? o->title : title);
    fprintf(g, "\nset xlabel \"%s (ms)\"\nset ylabel \"fraction of requests\"\n", name);
    fprintf(g, "set yrange [0:1.02]\nset key bottom right\n");
    if (o->logx) fprintf(g, "set logscale x\n");
    fprintf(g, "plot ");
    int first = 1;
    for (int i = 0; i < nf; i++) {
        if (!nv[i]) continue;
        char t[400];
        snprintf(t, sizeof t, "%s (n=%zu, p50 %.3g ms, p99 %.3g ms)", f[i].label, nv[i],
                 bench_percentile(vals[i], nv[i], 50), bench_percentile(vals[i], nv[i], 99));
        fprintf(g, "%s'-' using 1:2 with steps lw 2 title ", first ? "" : ", ");
        pl_quote(g, t);
        first = 0;
    }
    if (first) {
        fprintf(stderr, "echo-bench plot: nothing to plot (no successful requests in any file)\n");
        goto out;
    }
    fprintf(g, "\n");
    for (int i = 0; i < nf; i++) {
        if (!nv[i]) continue;
        /* the empirical CDF as a step function that starts at 0 */
        fprintf(g, "%.9g 0\n", vals[i][0]);
        for (size_t k = 0; k < nv[i]; k++) fprintf(g, "%.9g %.9g\n", vals[i][k], (double)(k + 1) / (double)nv[i]);
        fprintf(g, "e\n");
    }
    status = 0;
out:
    for (int i = 0; i < nf; i++) free(vals[i]);
    return status;
}

static int pl_allreduce(FILE *g, pl_file *f, int nf, const pl_opts *o) {
    char key[32];
    snprintf(key, sizeof key, "%s_gbps", o->bw);
    char title[300];
    json_int_t ranks = json_integer_value(json_object_get(json_array_get(f[0].root, 0), "ranks"));
    snprintf(title, sizeof title, "all-reduce %s vs message size (%lld ranks)", o->bw, (long long)ranks);
    fprintf(g, "set title ");
    pl_quote(g, o->title ? o->title : title);
    fprintf(g, "\nset xlabel \"message size (bytes)\"\nset ylabel \"%s (GB/s)\"\n", o->bw);
    fprintf(g, "set logscale x 2\nset format x \"%%.0b %%BB\"\nset key top left\n");
    if (o->logy) fprintf(g, "set logscale y\n");
    /* one curve per (file, algo), algos in order of first appearance */
    const char *algos[PL_MAX_FILES][PL_MAX_ALGOS];
    int na[PL_MAX_FILES] = {0};
    for (int i = 0; i < nf; i++) {
        size_t k;
        json_t *row;
        json_array_foreach(f[i].root, k, row) {
            const char *a = json_string_value(json_object_get(row, "algo"));
            int seen = 0;
            for (int j = 0; a && j < na[i]; j++) seen |= !strcmp(algos[i][j], a);
            if (a && !seen) {
                if (na[i] == PL_MAX_ALGOS) {
                    fprintf(stderr, "echo-bench plot: %s has more than %d algos\n", f[i].path, PL_MAX_ALGOS);
                    return 1;
                }
                algos[i][na[i]++] = a;
            }
        }
    }
    fprintf(g, "plot ");
    for (int i = 0, first = 1; i < nf; i++)
        for (int j = 0; j < na[i]; j++, first = 0) {
            char t[400];
            if (nf > 1) snprintf(t, sizeof t, "%s: %s", f[i].label, algos[i][j]);
            else snprintf(t, sizeof t, "%s", algos[i][j]);
            fprintf(g, "%s'-' using 1:2 with linespoints lw 2 pt 7 ps 0.6 title ", first ? "" : ", ");
            pl_quote(g, t);
        }
    fprintf(g, "\n");
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < na[i]; j++) {
            size_t k;
            json_t *row;
            json_array_foreach(f[i].root, k, row) {
                const char *a = json_string_value(json_object_get(row, "algo"));
                json_t *b = json_object_get(row, "bytes"), *y = json_object_get(row, key);
                if (a && !strcmp(a, algos[i][j]) && json_is_number(b) && json_is_number(y))
                    fprintf(g, "%.17g %.9g\n", json_number_value(b), json_number_value(y));
            }
            fprintf(g, "e\n");
        }
    return 0;
}

static int pl_parse(int argc, char **argv, pl_opts *o, const char **files, int *nf) {
    static const struct option lo[] = {
        {"output", required_argument, 0, 'o'}, {"title", required_argument, 0, 't'},
        {"metric", required_argument, 0, 'm'}, {"gnuplot", required_argument, 0, 'g'},
        {"bw", required_argument, 0, 'b'},     {"logx", no_argument, 0, 'x'},
        {"logy", no_argument, 0, 'y'},         {"size", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    char **av = argv; /* argv[0] is the subcommand name */
    int ac = argc, c, rc = 0;
    bench_getopt_reset();
    while (!rc && (c = getopt_long(ac, av, ":o:h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case 'o': o->out = a; break;
        case 't': o->title = a; break;
        case 'g': o->gnuplot = a; break;
        case 'x': o->logx = 1; break;
        case 'y': o->logy = 1; break;
        case 'm':
            if (strcmp(a, "ttft") && strcmp(a, "tpot") && strcmp(a, "e2e") && strcmp(a, "itl"))
                rc = pl_usage_error("--metric: expected ttft, tpot, e2e or itl, got '%s'", a);
            o->metric = a;
            break;
        case 'b':
            if (strcmp(a, "algbw") && strcmp(a, "busbw")) rc = pl_usage_error("--bw: expected algbw or busbw, got '%s'", a);
            o->bw = a;
            break;
        case 's':
            if (sscanf(a, "%dx%d", &o->width, &o->height) != 2 || o->width < 100 || o->height < 100 ||
                o->width > 8000 || o->height > 8000)
                rc = pl_usage_error("--size: expected WxH in pixels (100..8000), got '%s'", a);
            break;
        case 'h':
            fputs(PL_USAGE, stdout);
            rc = -1;
            break;
        default: rc = bench_getopt_error("plot", c, av); break;
        }
    }
    for (int i = optind; !rc && i < ac; i++) {
        if (*nf == PL_MAX_FILES) rc = pl_usage_error("at most 32 result files, got more (%s)", av[i]);
        else files[(*nf)++] = av[i];
    }
    if (!rc && !*nf) rc = pl_usage_error("no result files given%s", "");
    if (!rc && !o->out) rc = pl_usage_error("-o FILE.png is required%s", "");
    return rc;
}

int bench_plot_main(int argc, char **argv) {
    pl_opts o = {.metric = "ttft", .bw = "algbw", .width = 900, .height = 560};
    const char *paths[PL_MAX_FILES];
    pl_file f[PL_MAX_FILES] = {0};
    int nf = 0, status = 1, kind = 0; /* 1 serve, 2 allreduce */
    o.gnuplot = getenv("GNUPLOT") ? getenv("GNUPLOT") : "gnuplot";
    int rc = pl_parse(argc, argv, &o, paths, &nf);
    if (rc) return rc < 0 ? 0 : rc;
    for (int i = 0; i < nf; i++) {
        json_error_t je;
        f[i].path = paths[i];
        if (!(f[i].root = json_load_file(paths[i], 0, &je))) {
            fprintf(stderr, "echo-bench plot: %s:%d: %s\n", paths[i], je.line, je.text);
            goto out;
        }
        int k = json_is_array(json_object_get(f[i].root, "requests")) ? 1
                : json_is_array(f[i].root) && json_object_get(json_array_get(f[i].root, 0), "algbw_gbps") ? 2
                                                                                                           : 0;
        if (!k) {
            fprintf(stderr,
                    "echo-bench plot: %s is neither an echo-bench serve result ({\"requests\": [...]}) nor "
                    "echo-bench allreduce --json output\n",
                    paths[i]);
            status = 2;
            goto out;
        }
        if (kind && k != kind) {
            fprintf(stderr, "echo-bench plot: cannot mix serve results and allreduce results in one plot (%s)\n",
                    paths[i]);
            status = 2;
            goto out;
        }
        kind = k;
        const char *lab = json_string_value(json_object_get(json_object_get(f[i].root, "summary"), "label"));
        if (!lab) {
            const char *b = strrchr(paths[i], '/');
            lab = b ? b + 1 : paths[i];
        }
        snprintf(f[i].label, sizeof f[i].label, "%s", lab);
        char *dot = strstr(f[i].label, ".json");
        if (dot && !json_object_get(json_object_get(f[i].root, "summary"), "label")) *dot = 0;
    }
    if (!pl_have_gnuplot(o.gnuplot)) {
        fprintf(stderr, "echo-bench plot: cannot run '%s': install gnuplot (Debian: apt-get install gnuplot-nox) "
                        "or point --gnuplot / $GNUPLOT at it\n", o.gnuplot);
        goto out;
    }
    const char *term = pl_terminal(o.gnuplot);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s'", o.gnuplot);
    remove(o.out); /* a stale PNG must not pass for this run's */
    FILE *g = popen(cmd, "w");
    if (!g) {
        fprintf(stderr, "echo-bench plot: cannot start gnuplot: %s\n", strerror(errno));
        goto out;
    }
    fprintf(g, "set terminal %s size %d,%d%s noenhanced\nset output ", term, o.width, o.height,
            strcmp(term, "pngcairo") ? "" : " font \"sans,10\"");
    pl_quote(g, o.out);
    fprintf(g, "\nset grid\nset border lw 1\n");
    int prc = kind == 1 ? pl_serve(g, f, nf, &o) : pl_allreduce(g, f, nf, &o);
    fprintf(g, "set output\n");
    int st = pclose(g);
    if (prc) goto out;
    struct stat sb;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || stat(o.out, &sb) || sb.st_size == 0) {
        fprintf(stderr, "echo-bench plot: gnuplot failed to write %s (see its messages above)\n", o.out);
        goto out;
    }
    fprintf(stderr, "echo-bench plot: wrote %s (%s, %d file%s)\n", o.out, kind == 1 ? "CDF" : "bandwidth", nf,
            nf > 1 ? "s" : "");
    status = 0;
out:
    for (int i = 0; i < nf; i++) json_decref(f[i].root);
    return status;
}
