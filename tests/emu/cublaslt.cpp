/*
 * tests/emu/cublaslt.cpp — emulated cuBLASLt matmul (see include/cublasLt.h
 * for what is supported). D = alpha · op(A) · op(B) + beta · C, column-major,
 * each element's products summed in double and rounded once to fp32 (the
 * compute type), then scaled and rounded to D's dtype; beta = 0 does not read
 * C, as in cuBLAS. The work is enqueued on the stream, so a capture records
 * it like any kernel.
 */
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_bf16.h"
#include "cublasLt.h"
#include "emu_internal.h"

struct cublasLtContext {
    int magic;
};
struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
    bool unsupported; /* an attribute this emulator does not implement was set */
};
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_ws;
    uint32_t align[4]; /* A B C D */
    bool unsupported;
};

namespace {

size_t dtype_size(cudaDataType_t t) {
    return t == CUDA_R_32F ? 4 : (t == CUDA_R_16F || t == CUDA_R_16BF) ? 2 : 0;
}

float load(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    default: abort();
    }
}

void store(void *p, cudaDataType_t t, size_t i, float v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    default: abort();
    }
}

/* bytes from the first to the last element of a column-major layout */
size_t span(const cublasLtMatrixLayoutOpaque_t &l) {
    if (!l.rows || !l.cols) return 0;
    return ((size_t)(l.cols - 1) * (size_t)l.ld + l.rows) * dtype_size(l.type);
}

/* Is the problem one this emulator computes exactly as specified? m, n, k
 * are taken from D and op(A). */
cublasStatus_t check(const cublasLtMatmulDescOpaque_t *op, const cublasLtMatrixLayoutOpaque_t *a,
                     const cublasLtMatrixLayoutOpaque_t *b, const cublasLtMatrixLayoutOpaque_t *c,
                     const cublasLtMatrixLayoutOpaque_t *d) {
    if (!op || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
    if (op->unsupported || op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type != b->type || c->type != d->type || a->type != c->type || !dtype_size(a->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    uint64_t m = d->rows, n = d->cols;
    uint64_t am = op->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = op->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = op->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = op->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (am != m || bn != n || ak != bk || c->rows != m || c->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasLtMatrixLayoutOpaque_t *ls[4] = {a, b, c, d};
    for (auto *l : ls)
        if (l->ld < (int64_t)(l->rows ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new cublasLtContext{0x4c74};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    *d = new cublasLtMatmulDescOpaque_t{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, false};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)v;
        return CUBLAS_STATUS_SUCCESS;
    }
    d->unsupported = true;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!dtype_size(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    *l = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new cublasLtMatmulPreferenceOpaque_t{0, {256, 256, 256, 256}, false};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, sizeof p->max_ws);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    }
    p->unsupported = true;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t *results,
                                              int *returned) {
    *returned = 0;
    if (!h || !pref || requested < 1 || !results) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = check(op, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (pref->unsupported) return CUBLAS_STATUS_NOT_SUPPORTED;
    /* the element size is the least alignment any algorithm accepts */
    for (int i = 0; i < 4; i++)
        if (pref->align[i] < dtype_size(a->type) || (pref->align[i] & (pref->align[i] - 1)))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(results, 0, sizeof *results);
    /* the algorithm remembers the alignments it was chosen for: a matmul
     * with less aligned pointers is a caller bug */
    results->algo.data[0] = 0x656d75; /* "emu" */
    for (int i = 0; i < 4; i++)
        results->algo.data[1 + i] = pref->align[i];
    results->workspaceSize = 0;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    (void)workspace, (void)workspace_bytes;
    if (!h || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = check(op, a, b, c, d);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!algo || algo->data[0] != 0x656d75) return CUBLAS_STATUS_INVALID_VALUE;
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptrs[i] % algo->data[1 + i]) return CUBLAS_STATUS_INVALID_VALUE;
    if (C == D && (c->ld != d->ld)) return CUBLAS_STATUS_INVALID_VALUE;
    float al, be;
    memcpy(&al, alpha, sizeof al); /* host pointer mode: read at the call */
    memcpy(&be, beta, sizeof be);
    cublasLtMatmulDescOpaque_t o = *op;
    cublasLtMatrixLayoutOpaque_t la = *a, lb = *b, lc = *c, ld = *d;
    uint64_t m = ld.rows, n = ld.cols, k = o.ta == CUBLAS_OP_N ? la.cols : la.rows;
    if (!emu::is_device_range(A, span(la)) || !emu::is_device_range(B, span(lb)) || !emu::is_device_range(D, span(ld)) ||
        (be != 0.0f && !emu::is_device_range(C, span(lc))))
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaError_t e = emu::enqueue(stream, [=]() {
        std::vector<float> arow(k), bcol(k);
        for (uint64_t j = 0; j < n; j++) {
            for (uint64_t kk = 0; kk < k; kk++)
                bcol[kk] = load(B, lb.type, o.tb == CUBLAS_OP_N ? kk + j * (uint64_t)lb.ld : j + kk * (uint64_t)lb.ld);
            for (uint64_t i = 0; i < m; i++) {
                double s = 0;
                for (uint64_t kk = 0; kk < k; kk++) {
                    float av = load(A, la.type, o.ta == CUBLAS_OP_N ? i + kk * (uint64_t)la.ld : kk + i * (uint64_t)la.ld);
                    s += (double)av * (double)bcol[kk];
                }
                float v = al * (float)s;
                if (be != 0.0f) v += be * load(C, lc.type, i + j * (uint64_t)lc.ld);
                store(D, ld.type, i + j * (uint64_t)ld.ld, v);
            }
        }
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

const char *cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported (emulated cuBLASLt)";
    default: return "emulated cuBLASLt error";
    }
}

} /* extern "C" */
