/*
 * tests/mpi/test_engine_cfg.c — an engine's config reaches every process
 * under `mpirun -np N` (tests/mpi/run.sh: N = 2, 3). Rank 0 sends, through
 * the message eng_create sends its followers (eng_priv_cfg_bcast,
 * engine/config.c):
 *   1. a config with every field set to a value none of the defaults has
 *      (64-bit values where the field is 64 bits, negative ones where it is
 *      signed, a string longer than any fixed buffer, "" apart from NULL);
 *   2. a config with every field zero and every string NULL;
 * and every rank > 0 checks each field, by name. The names are written here
 * by hand, apart from engine/config.c's list (a field missing there fails
 * here), and the test first checks that they cover every byte of eng_config
 * that is not padding (a field added to engine.h and named nowhere fails
 * too). Exit 0 when every check passed on every rank; rank 0 prints it.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/proc.h"
#include "engine/internal.h"

/* N(field, value): the numbers; S(field, value): the strings. */
#define CFG_TEST_FIELDS(N, S)                                                                                          \
    S(model_dir, long_path)                                                                                            \
    S(device, "cuda")                                                                                                  \
    N(tp, 5)                                                                                                           \
    N(allreduce, ECHO_PRESET_ECHO3)                                                                                    \
    N(allreduce_auto, 2)                                                                                               \
    N(echo_min_bytes, (size_t)0x123456789abull)                                                                        \
    N(echo_group, 7)                                                                                                   \
    N(threads, 11)                                                                                                     \
    N(kv_block_size, 13)                                                                                               \
    N(max_model_len, 17)                                                                                               \
    N(max_num_seqs, 19)                                                                                                \
    N(max_batch_tokens, 23)                                                                                            \
    N(kv_blocks, 29)                                                                                                   \
    N(kv_dtype, KERN_KV_Q8_0)                                                                                          \
    N(kv_cache_memory, (size_t)0xfedcba9876ull)                                                                        \
    N(kv_mem_available, (size_t)0x10000000031ull)                                                                      \
    N(gpu_memory_utilization, 0.375)                                                                                   \
    N(kv_gpu.total, (size_t)0x5000000041ull)                                                                           \
    N(kv_gpu.free, (size_t)0x4000000043ull)                                                                            \
    N(kv_gpu.weights, (size_t)0x300000047ull)                                                                          \
    N(kv_gpu.activations, (size_t)0x20000053ull)                                                                       \
    N(kv_gpu.ranks_per_gpu, 59)                                                                                        \
    S(transport, "")                                                                                                   \
    N(cuda_graphs, 1)                                                                                                  \
    N(fuse_weights, ENG_FUSE_OFF)                                                                                      \
    N(quantize, ENG_QUANT_Q8_0)                                                                                        \
    N(act_quant, ENG_ACT_Q8_0_ONLY)                                                                                    \
    N(echo_codec, ECHO_CODEC_HNF3)                                                                                     \
    N(no_prefix_cache, 1)                                                                                              \
    N(pass_tokens, 31)                                                                                                 \
    N(overlap, -1)                                                                                                     \
    N(overlap_min_rows, 37)                                                                                            \
    N(oneshot, -0x123456789l)                                                                                          \
    S(rope_scaling, "yarn:4")

#define CFG_ONE(f, v) +1
enum { CFG_TEST_NFIELDS = 0 CFG_TEST_FIELDS(CFG_ONE, CFG_ONE) };

static int g_rank, g_fail;
static char long_path[5000];

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "rank %d: ", g_rank);                                                                          \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fprintf(stderr, "\n");                                                                                         \
        g_fail++;                                                                                                      \
    } while (0)

static void fill(eng_config *c) {
    memset(c, 0, sizeof *c);
#define SET(f, v) c->f = v;
    CFG_TEST_FIELDS(SET, SET)
#undef SET
}

/* Every byte of eng_config that is not padding belongs to a field named
 * above (the compiler says which bytes are padding). */
static void check_coverage(void) {
#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
    unsigned char named[sizeof(eng_config)] = {0};
#define MARK(f, v) memset(named + offsetof(eng_config, f), 1, sizeof(((eng_config *)0)->f));
    CFG_TEST_FIELDS(MARK, MARK)
#undef MARK
    eng_config probe;
    memset(&probe, 0xff, sizeof probe);
    __builtin_clear_padding(&probe);
    const unsigned char *b = (const unsigned char *)&probe;
    for (size_t i = 0; i < sizeof probe; i++)
        if (b[i] && !named[i]) {
            FAIL("byte %zu of eng_config belongs to a field this test does not name: add it to CFG_TEST_FIELDS "
                 "(and to engine/config.c's ENG_CONFIG_FIELDS)", i);
            return;
        }
    return;
#endif
#endif
    if (g_rank == 0) printf("test_engine_cfg: no __builtin_clear_padding: the coverage check is skipped\n");
}

/* got (what this rank received) against want, field by field. */
static void check_fields(const eng_config *got, const eng_config *want, const char *what) {
#define CMP_N(f, v)                                                                                                    \
    if (memcmp(&got->f, &want->f, sizeof want->f))                                                                     \
        FAIL("%s: field " #f ": got %lld, want %lld", what, (long long)got->f, (long long)want->f);
#define CMP_S(f, v)                                                                                                    \
    if (!got->f != !want->f || (got->f && strcmp(got->f, want->f)))                                                    \
        FAIL("%s: field " #f ": got %.40s%s, want %.40s%s", what, got->f ? got->f : "NULL",                            \
             got->f && strlen(got->f) > 40 ? "..." : "", want->f ? want->f : "NULL",                                   \
             want->f && strlen(want->f) > 40 ? "..." : "");
    CFG_TEST_FIELDS(CMP_N, CMP_S)
#undef CMP_N
#undef CMP_S
}

/* Rank 0 sends *want; every other rank receives and checks it. */
static int round_trip(eng_config *want, const char *what) {
    char err[512] = "";
    eng_config got;
    memset(&got, 0x5a, sizeof got); /* what a field the message leaves out would show */
    char *keep = NULL;
    int rc = eng_priv_cfg_bcast(g_rank == 0 ? want : &got, &keep, err, sizeof err);
    if (rc) {
        FAIL("%s: eng_priv_cfg_bcast: %d: %s", what, rc, err);
        return -1;
    }
    if (g_rank) check_fields(&got, want, what);
    free(keep);
    return 0;
}

int main(void) {
    char err[512];
    int n;
    if (echo_proc_init(&g_rank, &n, err, sizeof err)) {
        fprintf(stderr, "test_engine_cfg: %s\n", err);
        return 1;
    }
    memset(long_path, 'p', sizeof long_path - 1);
    memcpy(long_path, "/models/", 8);
    check_coverage();
    if (n < 2) {
        fprintf(stderr, "test_engine_cfg: run it under mpirun -np 2 or more\n");
        g_fail++;
    } else {
        eng_config want;
        fill(&want);
        round_trip(&want, "every field set");
        memset(&want, 0, sizeof want);
        round_trip(&want, "every field zero or NULL");
    }
    char why[64];
    snprintf(why, sizeof why, "%d checks failed", g_fail);
    int rc = echo_proc_agree(g_fail == 0, why, err, sizeof err);
    if (g_rank == 0) {
        if (rc) printf("test_engine_cfg: FAIL (%s)\n", err);
        else
            printf("test_engine_cfg: %d processes: every rank > 0 saw each of the %d fields of 2 configs\n", n,
                   CFG_TEST_NFIELDS);
    }
    echo_proc_finalize();
    return rc ? 1 : 0;
}
