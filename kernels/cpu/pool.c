/* The cpu backend's thread pool (see cpu.h for the contract). */
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/cpu.h"

#define SEG(f, b) ((unsigned long long)(unsigned)(f) << 32 | (unsigned)(b))

/* One task from slot s: its front when `front`, else its back; -1 when
 * the share is empty. */
static int seg_take(cpu_pool_slot *s, int front) {
    unsigned long long v = atomic_load_explicit(&s->seg, memory_order_relaxed);
    for (;;) {
        int f = (int)(v >> 32), b = (int)(unsigned)v;
        if (f >= b) return -1;
        unsigned long long n = front ? SEG(f + 1, b) : SEG(f, b - 1);
        if (atomic_compare_exchange_weak_explicit(&s->seg, &v, n, memory_order_relaxed, memory_order_relaxed))
            return front ? f : b - 1;
    }
}

/* Thread `self`'s share in order, then the others' from their ends. */
static void pool_run_tasks(cpu_pool *p, int self) {
    int t;
    while ((t = seg_take(&p->slots[self], 1)) >= 0) p->fn(p->arg, t);
    for (int k = 1; k < p->nthreads; k++) {
        cpu_pool_slot *s = &p->slots[(self + k) % p->nthreads];
        while ((t = seg_take(s, 0)) >= 0) p->fn(p->arg, t);
    }
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Poll for a region after `seen` for up to p->spin_ns: a decode step is
 * hundreds of short regions, and a sleeping worker costs each one its
 * wake-up (microseconds, tens in a VM). */
static void pool_spin(cpu_pool *p, unsigned long seen) {
    if (p->spin_ns <= 0) return;
    long end = now_ns() + p->spin_ns;
    for (int i = 1;; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_relaxed) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (!(i & 255) && now_ns() > end) return;
    }
}

static void *pool_worker(void *arg) {
    cpu_pool_slot *me = arg;
    cpu_pool *p = me->pool;
    unsigned long seen = 0;
    for (;;) {
        pool_spin(p, seen);
        pthread_mutex_lock(&p->mu);
        while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen) {
            p->sleepers++;
            pthread_cond_wait(&p->start_cv, &p->mu);
            p->sleepers--;
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->generation);
        if (!p->open) { /* the caller finished it alone */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        p->active++;
        pthread_mutex_unlock(&p->mu);
        pool_run_tasks(p, me->idx);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0 && !p->open) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int cpu_pool_init(cpu_pool *p, int nthreads) {
    p->nthreads = nthreads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, 0);
    p->open = p->active = p->sleepers = 0;
    const char *sp = getenv("ECHO_POOL_SPIN_US");
    long us = sp && *sp ? strtol(sp, NULL, 10) : CPU_POOL_SPIN_US;
    p->spin_ns = (us < 0 ? 0 : us > 1000000 ? 1000000 : us) * 1000L;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    p->slots = aligned_alloc(64, (size_t)nthreads * sizeof *p->slots);
    if (!p->threads || !p->slots) {
        p->nthreads = 1; /* nothing to join */
        return -1;
    }
    for (int i = 0; i < nthreads; i++) {
        atomic_init(&p->slots[i].seg, 0);
        p->slots[i].pool = p;
        p->slots[i].idx = i;
    }
    for (int i = 1; i < nthreads; i++) {
        if (pthread_create(&p->threads[i], NULL, pool_worker, &p->slots[i]) != 0) {
            p->nthreads = i; /* join the ones we started */
            return -1;
        }
    }
    return 0;
}

void cpu_pool_destroy(cpu_pool *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->slots);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
}

void cpu_parallel_for(kern_backend *be, int ntasks, cpu_task_fn fn, void *arg) {
    cpu_pool *p = &((cpu_impl *)be->impl)->pool;
    if (ntasks <= 0) return;
    if (p->nthreads == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    for (int i = 0; i < p->nthreads; i++)
        atomic_store_explicit(&p->slots[i].seg,
                              SEG((long long)ntasks * i / p->nthreads, (long long)ntasks * (i + 1) / p->nthreads),
                              memory_order_relaxed);
    p->open = 1;
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers) pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    pool_run_tasks(p, 0);
    /* close the region: a worker that wakes up later leaves the tasks alone */
    pthread_mutex_lock(&p->mu);
    p->open = 0;
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int cpu_nthreads(const kern_backend *be) { return ((const cpu_impl *)be->impl)->pool.nthreads; }
