/*
 * cuda: out(n, w.rows) = in(n, w.cols) · wᵀ with cuBLASLt.
 *
 * Contract (twin of kernels/cpu/matmul.c): in, out are bf16 activations,
 * w is a bf16 device weight (upload_weight), products accumulate in fp32
 * (CUBLAS_COMPUTE_32F) and the result is rounded to bf16 once. Not in place
 * (out == in is rejected, like the cpu twin). Enqueued on the stream.
 *
 * Row-major -> column-major mapping. cuBLASLt is column-major; a row-major
 * (r, c) buffer is the same bytes as a column-major (c, r) matrix with
 * leading dimension c, i.e. its transpose. With R = w.rows, C = w.cols:
 *
 *   row-major   out(n, R)  = in(n, C) · W(R, C)ᵀ
 *   transpose:  outᵀ(R, n) = W(R, C) · inᵀ(C, n)
 *
 * and in column-major terms the buffers are
 *   out -> D: column-major (R, n), ld = R        (exactly outᵀ)
 *   in  -> B: column-major (C, n), ld = C        (exactly inᵀ), op N
 *   w   -> A: column-major (C, R), ld = C        (this is Wᵀ), op T, so op(A) = W(R, C)
 * hence cuBLASLt computes D(m=R, n=n) = op(A)(R, C) · B(C, n) with k = C:
 * the "TN" layout, the best supported one for bf16 tensor cores.
 *
 * Descriptors and the heuristic's first algorithm are cached per
 * (m, n, k, alignment of A/B/C) in a small LRU table in the backend.
 */
#include <string.h>

#include "kernels/cuda/cuda.h"

/* Largest power of two (<= 256) dividing the address: cuBLASLt picks
 * vectorised algorithms only for pointers aligned well enough. */
static uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

static void plan_release(cuda_mm_plan *p) {
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

void cuda_mm_plans_clear(cuda_impl *impl) {
    for (int i = 0; i < impl->nplans; i++)
        plan_release(&impl->plans[i]);
    impl->nplans = 0;
}

static int plan_build(kern_backend *be, cuda_mm_plan *p) {
    cuda_impl *impl = cuda_get(be);
    int rc = 0;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    uint64_t ws = impl->workspace_bytes;

    LT_TRY_GOTO(be, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), rc, done);
    LT_TRY_GOTO(be, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), rc, done);
    LT_TRY_GOTO(be, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), rc, done);
    /* A: W as column-major (k, m), ld k; B: in as (k, n), ld k; C = D: out as (m, n), ld m */
    LT_TRY_GOTO(be, cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)p->k, (uint64_t)p->m, p->k), rc, done);
    LT_TRY_GOTO(be, cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)p->k, (uint64_t)p->n, p->k), rc, done);
    LT_TRY_GOTO(be, cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, (uint64_t)p->m, (uint64_t)p->n, p->m), rc, done);

    LT_TRY_GOTO(be, cublasLtMatmulPreferenceCreate(&pref), rc, done);
    LT_TRY_GOTO(be,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                rc, done);
    LT_TRY_GOTO(be,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->align_a,
                                                     sizeof p->align_a),
                rc, done);
    LT_TRY_GOTO(be,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->align_b,
                                                     sizeof p->align_b),
                rc, done);
    LT_TRY_GOTO(be,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->align_c,
                                                     sizeof p->align_c),
                rc, done);
    LT_TRY_GOTO(be,
                cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->align_c,
                                                     sizeof p->align_c),
                rc, done);
    memset(&res, 0, sizeof res);
    LT_TRY_GOTO(be, cublasLtMatmulAlgoGetHeuristic(impl->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found), rc,
                done);
    if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS) {
        rc = kern_fail(be, "matmul: cuBLASLt has no bf16 algorithm for m=%lld n=%lld k=%lld (alignments %u/%u/%u)",
                       (long long)p->m, (long long)p->n, (long long)p->k, p->align_a, p->align_b, p->align_c);
        goto done;
    }
    p->algo = res.algo;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return rc;
}

static int plan_get(kern_backend *be, int64_t m, int64_t n, int64_t k, uint32_t aa, uint32_t ab, uint32_t ac,
                    cuda_mm_plan **out) {
    cuda_impl *impl = cuda_get(be);
    impl->plan_tick++;
    for (int i = 0; i < impl->nplans; i++) {
        cuda_mm_plan *p = &impl->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->align_a == aa && p->align_b == ab && p->align_c == ac) {
            p->last_used = impl->plan_tick;
            *out = p;
            return 0;
        }
    }
    cuda_mm_plan *p;
    if (impl->nplans < CUDA_MM_PLANS) {
        p = &impl->plans[impl->nplans++];
    } else { /* evict the least recently used */
        p = &impl->plans[0];
        for (int i = 1; i < impl->nplans; i++)
            if (impl->plans[i].last_used < p->last_used) p = &impl->plans[i];
        plan_release(p);
    }
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    p->k = k;
    p->align_a = aa;
    p->align_b = ab;
    p->align_c = ac;
    if (plan_build(be, p) != 0) {
        plan_release(p); /* leaves an all-zero entry that matches no real shape (m > 0) */
        return -1;
    }
    p->last_used = impl->plan_tick;
    *out = p;
    return 0;
}

int cuda_matmul(kern_backend *be, void *out, const void *in, const kern_weight *w, int n) {
    cuda_impl *impl = cuda_get(be);
    if (out == in) return kern_fail(be, "matmul: out must not alias in");
    if (cuda_check_weight(be, "matmul", w)) return -1;
    if (n < 0) return kern_fail(be, "matmul: n = %d", n);
    if (n == 0 || w->rows == 0) return 0;
    if (w->cols == 0) return kern_fail(be, "matmul: weight has 0 columns");
    if (cuda_enter(be)) return -1;
    cuda_mm_plan *p = NULL;
    if (plan_get(be, w->rows, n, w->cols, ptr_align(w->data), ptr_align(in), ptr_align(out), &p)) return -1;
    if (cuda_replaying(be)) return 0;
    const float alpha = 1.0f, beta = 0.0f;
    LT_TRY(be, cublasLtMatmul(impl->lt, p->op, &alpha, w->data, p->a, in, p->b, &beta, out, p->c, out, p->c, &p->algo,
                              impl->workspace, impl->workspace_bytes, impl->stream));
    return 0;
}
