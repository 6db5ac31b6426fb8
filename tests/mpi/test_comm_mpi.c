/*
 * tests/mpi/test_comm_mpi.c — the mpi transport against the local one, run
 * under `mpirun -np N` (tests/mpi/run.sh: N = 2, 3, 4). Every process also
 * runs the local transport with N threads on the same inputs (generated
 * from (pass, call, rank, index) alone) as its reference, and checks:
 *   - int4, echo, bf16: its rank's output equals local's bit for bit over
 *     chains of passes with residuals, gaps in the sites, f32 and bf16
 *     activations, counts that are not multiples of N*G, and the size
 *     policy (calls below min_bytes take the exact path);
 *   - exact calls: MPI_Allreduce within fp32 reordering of local, the
 *     two-shot path ($ECHO_MPI_EXACT=twoshot) bit for bit when no residual
 *     is carried in; exact and bf16 also against an fp64 sum within their
 *     rounding bounds (computed here, independent of comm/);
 *   - replicas are bit-identical across the processes;
 *   - a NaN on one rank fails the call on every rank, alike; a rank that
 *     passes another count or site fails every rank, without a hang, and
 *     the next pass works;
 *   - the same with the one-shot schedule for small messages
 *     (echo_config.oneshot_bytes), exact bit for bit too.
 * Plain C (MPI and Check's forking do not mix). Exit 0 when every check
 * passed on every rank; rank 0 prints the count.
 */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/echo.h"
#include "comm/echo_internal.h" /* a device-memory stand-in of the local transport */
#include "comm/transport/transport.h"
#include "tests/comm_preset.h"

static int g_rank, g_n;
static size_t g_oneshot; /* echo_config.oneshot_bytes of every world below */
static long g_checks, g_fail;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        g_checks++;                                                                                                    \
        if (!(cond)) {                                                                                                 \
            g_fail++;                                                                                                  \
            if (g_fail <= 20) {                                                                                        \
                fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);                                       \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

/* ---- inputs, independent of comm/ ---- */

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1), with outlier channels like activations */
static float value(int pass, int call, int rank, size_t i) {
    uint64_t h = mix(((uint64_t)pass << 48) ^ ((uint64_t)call << 40) ^ ((uint64_t)rank << 32) ^ i);
    float v = (float)((double)(h >> 11) * 0x1p-52 - 1.0);
    return i % 97 == 3 ? v * 30.0f : v;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (finite inputs) */
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x as the call sees it (rounded to bf16 for bf16 activations) */
static double input(echo_dtype dt, int pass, int call, int rank, size_t i) {
    float v = value(pass, call, rank, i);
    return dt == ECHO_BF16 ? (double)from_bf16(to_bf16(v)) : (double)v;
}

static void fill(void *buf, echo_dtype dt, size_t n, int pass, int call, int rank) {
    for (size_t i = 0; i < n; i++) {
        float v = value(pass, call, rank, i);
        if (dt == ECHO_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = to_bf16(v);
    }
}

static double get(const void *buf, echo_dtype dt, size_t i) {
    return dt == ECHO_F32 ? (double)((const float *)buf)[i] : (double)from_bf16(((const uint16_t *)buf)[i]);
}

/* ---- the chain both transports run ---- */

#define NPASS 6
#define NCALL 3
static const int sites[NCALL] = {0, 1, 3}; /* a gap: sites need only increase */
static size_t pass_count[NPASS];
static echo_dtype pass_dt(int p) {
    return p % 2 ? ECHO_BF16 : ECHO_F32;
}

static void init_counts(int n) {
    size_t c[NPASS] = {5000, 1, 300, (size_t)(4 * 64 * n + 13), 20000, 777};
    memcpy(pass_count, c, sizeof c);
}

/* outputs [pass][call][rank], max 20000 values of 4 bytes */
#define MAXC 20000
typedef struct results {
    unsigned char *out; /* NPASS * NCALL * ECHO_MAX_RANKS * MAXC * 4 */
} results;

static unsigned char *slot(results *r, int p, int k, int rank) {
    return r->out + (((size_t)p * NCALL + (size_t)k) * ECHO_MAX_RANKS + (size_t)rank) * MAXC * 4;
}

/* One rank's chain: 0 ok, else the first failure in err. */
static int run_chain(echo_comm *c, int rank, results *res, char *err, size_t errlen) {
    static _Thread_local unsigned char buf[MAXC * 4];
    for (int p = 0; p < NPASS; p++) {
        if (echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen)) return -1;
        for (int k = 0; k < NCALL; k++) {
            echo_dtype dt = pass_dt(p);
            fill(buf, dt, pass_count[p], p, k, rank);
            if (echo_allreduce(c, sites[k], buf, pass_count[p], dt, NULL, err, errlen)) return -1;
            memcpy(slot(res, p, k, rank), buf, pass_count[p] * (dt == ECHO_F32 ? 4 : 2));
        }
    }
    return 0;
}

typedef struct local_arg {
    echo_world *w;
    int rank, rc;
    results *res;
    char err[256];
} local_arg;

static void *local_rank(void *p) {
    local_arg *a = p;
    echo_comm *c = NULL;
    a->rc = echo_comm_create(a->w, a->rank, &c, a->err, sizeof a->err);
    if (!a->rc) a->rc = run_chain(c, a->rank, a->res, a->err, sizeof a->err);
    echo_comm_destroy(c);
    return NULL;
}

static int run_local(const echo_config *cfg, results *res) {
    echo_world *w;
    char err[256];
    if (echo_world_create_local(g_n, cfg, &w, err, sizeof err)) {
        CHECK(0, "local world: %s", err);
        return -1;
    }
    pthread_t th[ECHO_MAX_RANKS];
    local_arg a[ECHO_MAX_RANKS];
    for (int r = 0; r < g_n; r++) {
        a[r] = (local_arg){w, r, 0, res, ""};
        pthread_create(&th[r], NULL, local_rank, &a[r]);
    }
    int rc = 0;
    for (int r = 0; r < g_n; r++) {
        pthread_join(th[r], NULL);
        if (a[r].rc) {
            CHECK(0, "local rank %d: %s", r, a[r].err);
            rc = -1;
        }
    }
    echo_world_destroy(w);
    return rc;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Same value on every rank? (MPI_Allgather of a hash) */
static int all_same(uint64_t h) {
    uint64_t all[ECHO_MAX_RANKS];
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int j = 0; j < g_n; j++)
        if (all[j] != h) return 0;
    return 1;
}

static int all_true(int v) {
    int r = 0;
    MPI_Allreduce(&v, &r, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return r;
}

/* The mpi world against local for one configuration. `twoshot`: exact path
 * as two-shot (bit for bit against local when no residual is carried). */
static void compare(echo_preset mode, size_t min_bytes, int twoshot, echo_codec_id codec) {
    echo_config cfg = test_echo_cfg(mode, 0, min_bytes, 4, MAXC, 0, codec);
    cfg.oneshot_bytes = g_oneshot;
    results loc = {calloc((size_t)NPASS * NCALL * ECHO_MAX_RANKS, MAXC * 4)};
    results mp = {calloc((size_t)NPASS * NCALL * ECHO_MAX_RANKS, MAXC * 4)};
    char err[256];
    if (!loc.out || !mp.out) {
        CHECK(0, "out of memory");
        goto out;
    }
    if (run_local(&cfg, &loc)) goto out;
    setenv("ECHO_MPI_EXACT", twoshot ? "twoshot" : "allreduce", 1);
    echo_world *w = NULL;
    echo_comm *c = NULL;
    int rc = echo_world_create_mpi(&cfg, &w, err, sizeof err);
    CHECK(!rc, "mpi world: %s", err);
    if (rc) goto out;
    rc = echo_comm_create(w, g_rank, &c, err, sizeof err);
    CHECK(!rc, "mpi comm: %s", err);
    if (!rc) {
        rc = run_chain(c, g_rank, &mp, err, sizeof err);
        CHECK(!rc, "mpi chain (%s): %s", echo_preset_name(mode), err);
    }
    echo_comm_destroy(c);
    echo_world_destroy(w);
    if (!all_true(!rc)) goto out;
    for (int p = 0; p < NPASS; p++) {
        echo_dtype dt = pass_dt(p);
        size_t n = pass_count[p], esz = dt == ECHO_F32 ? 4 : 2;
        int exact = mode == ECHO_PRESET_EXACT || n * esz < min_bytes;
        for (int k = 0; k < NCALL; k++) {
            const unsigned char *a = slot(&mp, p, k, g_rank), *b = slot(&loc, p, k, g_rank);
            /* a residual is carried into an exact call only after a quantized one in echo mode */
            int bitwise = !exact || (twoshot && mode != ECHO_PRESET_ECHO);
            if (bitwise) {
                CHECK(!memcmp(a, b, n * esz), "%s min_bytes %zu%s pass %d call %d (%zu %s): mpi differs from local",
                      echo_preset_name(mode), min_bytes, twoshot ? " twoshot" : "", p, k, n,
                      dt == ECHO_F32 ? "f32" : "bf16");
            } else {
                double worst = 0;
                for (size_t i = 0; i < n; i++) {
                    double s = 0;
                    for (int j = 0; j < g_n; j++)
                        s += fabs(input(dt, p, k, j, i));
                    /* fp32 sums in another order (and a residual below one
                     * int4 step, added earlier or later), then the output
                     * rounding: one bf16 ulp for bf16 activations */
                    double tol = (dt == ECHO_F32 ? 1e-6 : 1.0 / 64) * (s + 1e-30) * (mode == ECHO_PRESET_ECHO ? 4 : 1);
                    double d = fabs(get(a, dt, i) - get(b, dt, i)) / tol;
                    worst = d > worst ? d : worst;
                }
                CHECK(worst <= 1, "%s min_bytes %zu pass %d call %d: exact path off local by %.3g x tolerance",
                      echo_preset_name(mode), min_bytes, p, k, worst);
            }
            /* exact and bf16 against an fp64 sum, f32 activations */
            if ((mode == ECHO_PRESET_BF16 || mode == ECHO_PRESET_EXACT) && dt == ECHO_F32) {
                double worst = 0;
                for (size_t i = 0; i < n; i++) {
                    double ref = 0, s = 0;
                    for (int j = 0; j < g_n; j++) {
                        ref += input(dt, p, k, j, i);
                        s += fabs(input(dt, p, k, j, i));
                    }
                    /* bf16 (8 significant bits, unit roundoff 2^-8): each
                     * peer's value rounded, the sum rounded once, fp32 adds;
                     * exact: fp32 adds only */
                    double tol = exact ? g_n * 0x1p-23 * s : 0x1p-8 * s + 0x1p-8 * fabs(ref) + g_n * 0x1p-23 * s;
                    double d = fabs(get(a, dt, i) - ref) / (tol + 1e-30);
                    worst = d > worst ? d : worst;
                }
                CHECK(worst <= 1, "%s pass %d call %d: off the fp64 sum by %.3g x its bound", echo_preset_name(mode), p,
                      k, worst);
            }
            CHECK(all_same(hash_bytes(a, n * esz)), "%s pass %d call %d: replicas differ across ranks",
                  echo_preset_name(mode), p, k);
        }
    }
out:
    free(loc.out);
    free(mp.out);
}

/* A NaN on the last rank fails the call on every rank, alike; the next
 * pass works. */
static void poison(echo_preset mode) {
    echo_config cfg = test_echo_cfg(mode, 0, 0, 2, 4096, 0, 0);
    cfg.oneshot_bytes = g_oneshot;
    echo_world *w = NULL;
    echo_comm *c = NULL;
    char err[256];
    float buf[1000];
    if (echo_world_create_mpi(&cfg, &w, err, sizeof err) || echo_comm_create(w, g_rank, &c, err, sizeof err)) {
        CHECK(0, "poison setup: %s", err);
        echo_world_destroy(w);
        return;
    }
    fill(buf, ECHO_F32, 1000, 9, 0, g_rank);
    if (g_rank == g_n - 1) buf[5] = NAN;
    int rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
    if (!rc) rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
    CHECK(rc == -1, "%s: a NaN on rank %d did not fail the call", echo_preset_name(mode), g_n - 1);
    CHECK(echo_pass_failed_alike(c), "%s: the NaN failure is not reported as alike", echo_preset_name(mode));
    CHECK(isnan(buf[5]), "%s: the poisoned element is %g, not NaN", echo_preset_name(mode), (double)buf[5]);
    CHECK(all_true(rc == -1), "%s: not every rank failed on the NaN", echo_preset_name(mode));
    fill(buf, ECHO_F32, 1000, 9, 1, g_rank);
    rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
    if (!rc) rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
    CHECK(!rc, "%s: the pass after a NaN failed: %s", echo_preset_name(mode), err);
    echo_comm_destroy(c);
    echo_world_destroy(w);
}

/* The last rank passes another count (then another site): every rank
 * fails, nobody hangs, the next pass works. */
static void disagree(echo_preset mode) {
    echo_config cfg = test_echo_cfg(mode, 0, 0, 4, 4096, 0, 0);
    cfg.oneshot_bytes = g_oneshot;
    echo_world *w = NULL;
    echo_comm *c = NULL;
    char err[256];
    float buf[1001];
    if (echo_world_create_mpi(&cfg, &w, err, sizeof err) || echo_comm_create(w, g_rank, &c, err, sizeof err)) {
        CHECK(0, "disagree setup: %s", err);
        echo_world_destroy(w);
        return;
    }
    for (int what = 0; what < 2; what++) {
        int last = g_rank == g_n - 1;
        size_t n = what == 0 && last ? 1001 : 1000;
        int site = what == 1 && last ? 2 : 1;
        fill(buf, ECHO_F32, n, 10, what, g_rank);
        int rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
        if (!rc) rc = echo_allreduce(c, site, buf, n, ECHO_F32, NULL, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "disagree"), "%s: a %s mismatch was not reported: rc %d, '%s'",
              echo_preset_name(mode), what ? "site" : "count", rc, rc ? err : "");
        CHECK(all_true(rc == -1), "%s: not every rank failed on a %s mismatch", echo_preset_name(mode),
              what ? "site" : "count");
        rc = echo_allreduce(c, 3, buf, 1000, ECHO_F32, NULL, err, sizeof err);
        CHECK(rc == -1, "%s: a call in the failed pass did not fail", echo_preset_name(mode));
        fill(buf, ECHO_F32, 1000, 10, 2, g_rank);
        rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
        if (!rc) rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
        CHECK(!rc, "%s: the pass after a mismatch failed: %s", echo_preset_name(mode), err);
    }
    echo_comm_destroy(c);
    echo_world_destroy(w);
}

/* echo_abort is local to the process: its calls fail (without
 * communicating) until echo_world_clear_abort; every rank aborts at the
 * same point here, so clearing re-arms the world. */
static void abort_local(void) {
    echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 2, 4096, 0, 0);
    echo_world *w = NULL;
    echo_comm *c = NULL;
    char err[256] = "", why[256] = "";
    float buf[1000];
    if (echo_world_create_mpi(&cfg, &w, err, sizeof err) || echo_comm_create(w, g_rank, &c, err, sizeof err)) {
        CHECK(0, "abort setup: %s", err);
        echo_world_destroy(w);
        return;
    }
    fill(buf, ECHO_F32, 1000, 11, 0, g_rank);
    int rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
    echo_abort(c);
    rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
    CHECK(rc == -1, "a call after echo_abort in the same pass worked");
    rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
    if (!rc) rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "aborted"), "a call of an aborted mpi world: rc %d '%s'", rc, err);
    CHECK(echo_world_usable(w, why, sizeof why) == 1, "an aborted mpi world reads as unusable: %s", why);
    echo_world_clear_abort(w);
    rc = echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err);
    if (!rc) rc = echo_allreduce(c, 0, buf, 1000, ECHO_F32, NULL, err, sizeof err);
    CHECK(!rc, "the call after clear_abort failed: %s", err);
    echo_comm_destroy(c);
    echo_world_destroy(w);
}

/* A transport on device memory refuses bf16 (its steps are host loops):
 * the local transport with a memory table that says "device", on host
 * buffers, as tests/unit/test_comm.c stands it in. */
static int fake_alloc(int device, size_t bytes, void **out, char *err, size_t errlen) {
    (void)device, (void)err, (void)errlen;
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? 0 : -1;
}
static void fake_free(int device, void *p) {
    (void)device;
    free(p);
}

static void bf16_refused_on_device(void) {
    static const echo_local_mem fake = {.device_memory = 1, .alloc = fake_alloc, .free = fake_free};
    echo_config cfg = test_echo_cfg(ECHO_PRESET_BF16, 0, 0, 2, 1024, 0, 0);
    echo_world *w = NULL;
    echo_comm *c = NULL;
    char err[256] = "";
    int rc = echo_local_world_create(2, 0, &fake, &echo_host_compute, &cfg, &w, err, sizeof err);
    CHECK(!rc, "device-memory stand-in: %s", err);
    if (rc) return;
    rc = echo_comm_create(w, 0, &c, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "host transports only"), "bf16 on a device transport: rc %d '%s'", rc, err);
    echo_comm_destroy(c);
    echo_world_destroy(w);
}

static void api(void) {
    echo_config cfg = test_echo_cfg(ECHO_PRESET_ECHO, 0, 0, 2, 1024, 0, 0);
    echo_world *w = NULL;
    echo_comm *c = NULL;
    char err[256] = "";
    int rc = echo_world_create_mpi(&cfg, &w, err, sizeof err);
    CHECK(!rc && echo_world_nranks(w) == g_n, "mpi world of %d ranks: %s", g_n, err);
    if (rc) return;
    rc = echo_comm_create(w, (g_rank + 1) % g_n, &c, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "takes that rank only"), "a comm for another process's rank: rc %d '%s'", rc, err);
    rc = echo_comm_create(w, g_rank, &c, err, sizeof err);
    CHECK(!rc, "own comm: %s", err);
    echo_comm_destroy(c);
    echo_world_destroy(w);
    echo_config bad = cfg;
    bad.deferred = 1;
    rc = echo_world_create_mpi(&bad, &w, err, sizeof err);
    CHECK(rc == -1 && !w, "a deferred mpi world was created");
    setenv("ECHO_MPI_EXACT", "ring", 1);
    rc = echo_world_create_mpi(&cfg, &w, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "ECHO_MPI_EXACT"), "ECHO_MPI_EXACT=ring was accepted");
    unsetenv("ECHO_MPI_EXACT");
    echo_preset m;
    CHECK(!echo_preset_parse("bf16", &m) && m == ECHO_PRESET_BF16, "'bf16' does not parse");
    CHECK(!strcmp(echo_preset_name(ECHO_PRESET_BF16), "bf16"), "the name of ECHO_PRESET_BF16");
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    int level = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &level) != MPI_SUCCESS) {
        fprintf(stderr, "MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_n);
    init_counts(g_n);
    api();
    abort_local();
    bf16_refused_on_device();
    const echo_preset modes[] = {ECHO_PRESET_NOFB, ECHO_PRESET_ECHO, ECHO_PRESET_BF16, ECHO_PRESET_EXACT};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        compare(modes[m], 0, 0, ECHO_CODEC_INT4);
        compare(modes[m], 2048, 0, ECHO_CODEC_INT4);
        compare(modes[m], 2048, 1, ECHO_CODEC_INT4);
        if (modes[m] == ECHO_PRESET_NOFB || modes[m] == ECHO_PRESET_ECHO) {
            compare(modes[m], 0, 0, ECHO_CODEC_HADAMARD);
            compare(modes[m], 2048, 0, ECHO_CODEC_HADAMARD);
            compare(modes[m], 0, 0, ECHO_CODEC_HSUB6);
            compare(modes[m], 2048, 0, ECHO_CODEC_HSUB6);
            compare(modes[m], 0, 0, ECHO_CODEC_OUT2);
            compare(modes[m], 2048, 0, ECHO_CODEC_HOUT2);
            compare(modes[m], 2048, 0, ECHO_CODEC_HNF3);
        }
        poison(modes[m]);
        disagree(modes[m]);
    }
    /* the one-shot schedule under 8 KiB (counts 1, 300, 4*64*N+13 and 777 of
     * the chain; 5000 and 20000 stay two-shot): mpi == local bit for bit
     * (exact too: both sum in rank order) */
    g_oneshot = 8192;
    const echo_preset os_modes[] = {ECHO_PRESET_NOFB, ECHO_PRESET_ECHO, ECHO_PRESET_EXACT};
    for (size_t m = 0; m < sizeof os_modes / sizeof *os_modes; m++) {
        compare(os_modes[m], 0, 1, ECHO_CODEC_INT4);
        if (os_modes[m] != ECHO_PRESET_EXACT) compare(os_modes[m], 0, 1, ECHO_CODEC_HOUT2);
        if (os_modes[m] != ECHO_PRESET_EXACT) compare(os_modes[m], 0, 1, ECHO_CODEC_HNF3);
        poison(os_modes[m]);
        disagree(os_modes[m]);
    }
    g_oneshot = 0;
    long tot[2] = {g_checks, g_fail}, sum[2] = {0, 0};
    MPI_Reduce(tot, sum, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (g_rank == 0) printf("mpi_test_comm: %d ranks: %ld checks, %ld failed\n", g_n, sum[0], sum[1]);
    int ok = all_true(g_fail == 0);
    MPI_Finalize();
    return ok ? 0 : 1;
}
