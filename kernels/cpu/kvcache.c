/*
 * cpu: the KV cache's storage types (kernels.h, kern_kv_dtype). kv_store
 * writes kernels/kv.h's reference bytes; attention widens a few cache rows
 * of one kv head at a time into an fp32 tile (cpu_kv_load_rows) and runs
 * the fp32 kernels on it, so a 16- or 8-bit cache is read at its own width
 * and never copied whole. The widening is exact (bf16/fp16) or one fp32
 * multiply (q8_0): every isa gives kern_kv_load_ref's values.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kv.h"

#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define A256 __attribute__((target("avx2,fma,f16c")))

static void load_c(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    for (int r = 0; r < n; r++) kern_kv_load_ref(dt, src + (size_t)r * ld, hd, dst + (size_t)r * ldd);
}

A256 static void load256(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    for (int r = 0; r < n; r++) {
        const uint8_t *s = src + (size_t)r * ld;
        float *d = dst + (size_t)r * ldd;
        int j = 0;
        switch (dt) {
        case KERN_KV_BF16:
            for (; j + 8 <= hd; j += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * j)));
                _mm256_storeu_ps(d + j, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
            break;
        case KERN_KV_F16:
            for (; j + 8 <= hd; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * j))));
            break;
        case KERN_KV_Q8_0:
            for (; j < hd; j += KERN_KV_Q8_BLOCK) {
                __m256 sc = _mm256_set1_ps(kern_kv_f16_to_f32((uint16_t)(s[hd + j / 16] | s[hd + j / 16 + 1] << 8)));
                for (int u = 0; u < KERN_KV_Q8_BLOCK; u += 8) {
                    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + j + u)));
                    _mm256_storeu_ps(d + j + u, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(q)));
                }
            }
            break;
        default: memcpy(d, s, (size_t)hd * 4); j = hd; break;
        }
        if (j < hd) { /* a tail of a 16-bit head: the reference, element by element */
            float t[KERN_KV_MAX_HD];
            kern_kv_load_ref(dt, s, hd, t);
            memcpy(d + j, t + j, (size_t)(hd - j) * 4);
        }
    }
}

A512 static void load512(kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst, size_t ldd) {
    if (dt != KERN_KV_Q8_0 && hd % 16) {
        load256(dt, src, ld, n, hd, dst, ldd);
        return;
    }
    for (int r = 0; r < n; r++) {
        const uint8_t *s = src + (size_t)r * ld;
        float *d = dst + (size_t)r * ldd;
        switch (dt) {
        case KERN_KV_BF16:
            for (int j = 0; j < hd; j += 16) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 2 * j)));
                _mm512_storeu_ps(d + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
            break;
        case KERN_KV_F16:
            for (int j = 0; j < hd; j += 16)
                _mm512_storeu_ps(d + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * j))));
            break;
        case KERN_KV_Q8_0:
            for (int j = 0; j < hd; j += KERN_KV_Q8_BLOCK) {
                __m512 sc = _mm512_set1_ps(kern_kv_f16_to_f32((uint16_t)(s[hd + j / 16] | s[hd + j / 16 + 1] << 8)));
                for (int u = 0; u < KERN_KV_Q8_BLOCK; u += 16) {
                    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + j + u)));
                    _mm512_storeu_ps(d + j + u, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(q)));
                }
            }
            break;
        default: memcpy(d, s, (size_t)hd * 4); break;
        }
    }
}

void cpu_kv_load_rows(int isa, kern_kv_dtype dt, const uint8_t *src, size_t ld, int n, int hd, float *dst,
                      size_t ldd) {
    if (isa >= CPU_ISA_AVX512)
        load512(dt, src, ld, n, hd, dst, ldd);
    else if (isa >= CPU_ISA_AVX2)
        load256(dt, src, ld, n, hd, dst, ldd);
    else
        load_c(dt, src, ld, n, hd, dst, ldd);
}
