/*
 * tests/toy/toy_test.c [mpi|cuda] — the toy codec of tests/toy/toy_codec.h, added
 * through comm/'s tables alone, runs like any codec (issue 34):
 *   - its row is in the codec table (name, bits, group bytes) and its wire
 *     form in the form table: the host codec's wire round trip equals the
 *     toy's own group functions, byte for byte;
 *   - an all-reduce of 3 ranks on the local transport (threads), or, with
 *     "mpi" under mpirun, on the mpi transport: every rank's output the same
 *     bits, within the toy's error of the fp64 sum; rank 0 prints a checksum
 *     of the output, which tests/toy/run.sh compares between the two;
 *   - with "cuda" (a build with ECHO_HAVE_CUDA: under the emulator, make
 *     test-toy-emu), the same all-reduce on the local transport with the
 *     ranks' buffers in GPU memory, so the cuda backend's record kernels
 *     code the toy's form (and hnf3's 3-bit one): its output the host
 *     run's, bit for bit.
 * Exit 0 when every check holds.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/codec/codec.h"
#include "comm/echo.h"
#include "comm/codec/echo_codec.h"
#ifdef ECHO_HAVE_MPI
#include <mpi.h>
#endif
#ifdef ECHO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

enum { N = 4096, G = 64, RANKS = 3 };

static float input(int rank, int i) {
    unsigned h = (unsigned)(rank * 7919 + i) * 2654435761u;
    return (float)((h >> 8) % 20001) / 10000.0f - 1.0f;
}

static int fails;
#define CHECK(c, ...)                                                                                                  \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "toy_test: FAIL: " __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                                     \
            fails++;                                                                                                   \
        }                                                                                                              \
    } while (0)

/* The tables: the row, and the host wire round trip against the form's own functions. */
static void check_tables(void) {
    echo_codec_id id;
    int g = -1;
    CHECK(echo_codec_parse("toy-g64", &id, &g) == 0 && id == ECHO_CODEC_TOY && g == 64, "toy-g64 does not parse");
    const echo_codec_info *ci = echo_codec_get(ECHO_CODEC_TOY);
    CHECK(ci && ci->form == ECHO_FORM_TOY && !strcmp(ci->name, "toy"), "no toy row");
    CHECK(fabs(echo_codec_bits(ECHO_CODEC_TOY, G) - (4.0 + 8.0 * ECHO_TOY_REC / G)) < 1e-12, "toy bits %g", echo_codec_bits(ECHO_CODEC_TOY, G));
    CHECK(echo_codec_group_bytes(ECHO_CODEC_TOY, G) == G / 2 + ECHO_TOY_REC, "toy group bytes");
    static float x[N], out[N], want[N];
    static uint8_t wire[N], codes[N / 2], recs[N / G * ECHO_TOY_REC];
    for (int i = 0; i < N; i++)
        x[i] = input(0, i);
    char err[256];
    CHECK(echo_codec_encode_as(ECHO_CODEC_TOY, x, NULL, N, G, wire, err, sizeof err) == 0, "encode_as: %s", err);
    CHECK(echo_codec_decode_as(ECHO_CODEC_TOY, wire, N, G, out, 0, err, sizeof err) == 0, "decode_as: %s", err);
    for (int k = 0; k < N / G; k++) {
        toy_encode_group(x + k * G, G, codes + k * G / 2, recs + k * ECHO_TOY_REC, NULL, G);
        toy_decode_group(codes + k * G / 2, recs + k * ECHO_TOY_REC, G, want + k * G);
    }
    CHECK(!memcmp(wire, codes, N / 2) && !memcmp(wire + N / 2, recs, sizeof recs), "the wire is not the toy form's");
    CHECK(!memcmp(out, want, sizeof out), "decode_as is not the toy form's decode");
}

/* rank r's all-reduce of buf in GPU memory (device >= 0) on its own stream */
static int reduce_device(echo_comm *c, int r, int device, float *buf, char *err, size_t errlen) {
#ifdef ECHO_HAVE_CUDA
    float *d = NULL;
    cudaStream_t s = NULL;
    int rc = -1;
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&d, N * sizeof *d) != cudaSuccess ||
        cudaMemcpy(d, buf, N * sizeof *d, cudaMemcpyHostToDevice) != cudaSuccess)
        snprintf(err, errlen, "rank %d: cuda setup failed", r);
    else if (echo_begin_pass(c, ECHO_PASS_EAGER, err, errlen) ||
             echo_allreduce(c, 0, d, N, ECHO_F32, s, err, errlen))
        ;
    else if (cudaStreamSynchronize(s) != cudaSuccess ||
             cudaMemcpy(buf, d, N * sizeof *d, cudaMemcpyDeviceToHost) != cudaSuccess)
        snprintf(err, errlen, "rank %d: cuda copy back failed", r);
    else
        rc = 0;
    if (d) cudaFree(d);
    if (s) cudaStreamDestroy(s);
    return rc;
#else
    (void)c, (void)device, (void)buf;
    snprintf(err, errlen, "rank %d: built without CUDA", r);
    return -1;
#endif
}

/* One all-reduce on rank r's comm (buffer in GPU memory when device >= 0);
 * returns the max relative error vs the fp64 sum. */
static double reduce(echo_comm *c, int r, int nranks, float *buf, int device) {
    char err[256];
    for (int i = 0; i < N; i++)
        buf[i] = input(r, i);
    if (device >= 0 ? reduce_device(c, r, device, buf, err, sizeof err)
                    : echo_begin_pass(c, ECHO_PASS_EAGER, err, sizeof err) ||
                          echo_allreduce(c, 0, buf, N, ECHO_F32, NULL, err, sizeof err)) {
        CHECK(0, "rank %d: %s", r, err);
        return INFINITY;
    }
    double e = 0, m = 0;
    for (int i = 0; i < N; i++) {
        double s = 0;
        for (int k = 0; k < nranks; k++)
            s += input(k, i);
        e = fmax(e, fabs(buf[i] - s));
        m = fmax(m, fabs(s));
    }
    return e / m;
}

typedef struct {
    echo_world *w;
    int r, device;
    float *buf;
    double err;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    char err[256];
    echo_comm *c = NULL;
    if (echo_comm_create(a->w, a->r, &c, err, sizeof err)) {
        CHECK(0, "comm %d: %s", a->r, err);
        return NULL;
    }
    a->err = reduce(c, a->r, RANKS, a->buf, a->device);
    echo_comm_destroy(c);
    return NULL;
}

static unsigned long checksum(const float *b) {
    unsigned long h = 1469598103934665603ul;
    const unsigned char *p = (const unsigned char *)b;
    for (size_t i = 0; i < N * sizeof *b; i++)
        h = (h ^ p[i]) * 1099511628211ul;
    return h;
}

/* An all-reduce of RANKS threads on the local transport, buffers in host
 * memory (device -1) or on GPU `device`; every rank's output the same. */
static int local_reduce(const echo_config *cfg, int device, float (*bufs)[N], double *rel) {
    char err[256];
    echo_world *w = NULL;
    echo_world_opts o = {.nranks = RANKS, .device = device};
    if (echo_world_create("local", &o, cfg, &w, err, sizeof err)) {
        fprintf(stderr, "toy_test: local world (device %d): %s\n", device, err);
        return -1;
    }
    pthread_t t[RANKS];
    rank_arg a[RANKS];
    for (int r = 0; r < RANKS; r++) {
        a[r] = (rank_arg){w, r, device, bufs[r], 0};
        pthread_create(&t[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < RANKS; r++) {
        pthread_join(t[r], NULL);
        *rel = fmax(*rel, a[r].err);
        CHECK(!memcmp(bufs[r], bufs[0], sizeof bufs[0]), "rank %d's output differs from rank 0's", r);
    }
    echo_world_destroy(w);
    return 0;
}

int main(int argc, char **argv) {
    int mpi = argc > 1 && !strcmp(argv[1], "mpi"), cuda = argc > 1 && !strcmp(argv[1], "cuda"), me = 0, n = RANKS;
    echo_config cfg = {.codec = ECHO_CODEC_TOY, .group_size = G, .n_sites = 1, .max_count = N};
    echo_world *w = NULL;
    static float bufs[RANKS][N];
    double rel = 0;
    if (!mpi) {
        check_tables();
        if (local_reduce(&cfg, -1, bufs, &rel)) return 1;
        /* the same calls with the buffers on the (emulated) GPU: the toy's
         * form, and hnf3 (3-bit codes), each with and without feedback */
        const echo_codec_id on_gpu[] = {ECHO_CODEC_TOY, ECHO_CODEC_HNF3};
        for (int k = 0; cuda && k < 2; k++)
            for (int fb = 0; fb < 2; fb++) {
                static float hbufs[RANKS][N], dbufs[RANKS][N];
                echo_config c2 = cfg;
                c2.codec = on_gpu[k];
                c2.feedback = fb;
                double hrel = 0, drel = 0;
                if (local_reduce(&c2, -1, hbufs, &hrel) || local_reduce(&c2, 0, dbufs, &drel)) return 1;
                const char *name = echo_codec_get(c2.codec)->name;
                CHECK(!memcmp(dbufs, hbufs, sizeof hbufs), "%s feedback=%d: the cuda backend's output differs from the host's",
                      name, fb);
                printf("%s cuda feedback=%d: %d ranks, max rel err %.4g, checksum %016lx (host %016lx)\n", name, fb, RANKS,
                       drel, checksum(dbufs[0]), checksum(hbufs[0]));
            }
    } else {
#ifdef ECHO_HAVE_MPI
        char err[256];
        int prov;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        echo_world_opts o = {.procs = 1, .device = -1};
        echo_comm *c = NULL;
        if (echo_world_create("mpi", &o, &cfg, &w, err, sizeof err) || echo_comm_create(w, me, &c, err, sizeof err)) {
            fprintf(stderr, "toy_test: mpi world: %s\n", err);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        rel = reduce(c, me, n, bufs[0], -1);
        unsigned long mine = checksum(bufs[0]), first = mine;
        MPI_Bcast(&first, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
        CHECK(mine == first, "rank %d's output differs from rank 0's", me);
        echo_comm_destroy(c);
#else
        fprintf(stderr, "toy_test: built without MPI\n");
        return 1;
#endif
    }
    /* int4 codes of max|y|/7: a value's error is at most half a step,
     * summed over the two coding passes of each rank's shard */
    CHECK(rel < 0.25, "relative error %g", rel);
    if (me == 0) printf("toy %s: %d ranks, max rel err %.4g, checksum %016lx\n", mpi ? "mpi" : "local", n, rel,
                        checksum(bufs[0]));
    echo_world_destroy(w);
#ifdef ECHO_HAVE_MPI
    if (mpi) MPI_Finalize();
#endif
    return fails ? 1 : 0;
}
