/*
 * cpu backend: which instruction sets this machine runs (a leaf: the pool,
 * the kernels and the backend's setup all ask it, it asks nobody).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

int cpu_isa_detect(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return CPU_ISA_AVX2;
    return CPU_ISA_SCALAR;
}

int cpu_vnni_detect(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}

/* The machine's isa, capped by ECHO_CPU_ISA (scalar, avx2, avx512): read
 * once per backend, so tests can run every path on one machine. */
int cpu_isa_for_backend(void) {
    int isa = cpu_isa_detect();
    const char *cap = getenv("ECHO_CPU_ISA");
    if (cap) {
        int c = !strcmp(cap, "scalar") ? CPU_ISA_SCALAR : !strcmp(cap, "avx2") ? CPU_ISA_AVX2 : isa;
        if (c < isa) isa = c;
    }
    return isa;
}

int cpu_isa(const kern_backend *be) { return ((const cpu_impl *)be->impl)->isa; }
