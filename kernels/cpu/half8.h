/* float16 <-> float32 for 8 lanes at a time: a KV cache held as IEEE half floats is
 * read and written through these, while all the arithmetic stays fp32.
 *
 * With F16C (x86-64 built with -march=native on any AVX2 machine) each is one
 * instruction. GCC's __builtin_convertvector from a _Float16 vector is no substitute:
 * gcc 12 lowers it lane by lane, and decode attention ran 2.4x slower than fp32 with
 * it. Elsewhere a scalar _Float16 loop stands in (correct, slower).
 *
 * Rounding to half is to nearest, ties to even; past 65504 it gives inf, a NaN stays a
 * NaN with its payload's top bits, exactly as torch's tensor.to(torch.float16) on the
 * CPU (which converts with the same instruction), so either store gives the same bits. */
#ifndef CHATSITE_HALF8_H
#define CHATSITE_HALF8_H

#include <stdint.h>

#include "vec8.h"

#ifdef __F16C__
#include <immintrin.h>

static inline v8f load8_f16(const uint16_t *p) {
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void store8_f16(uint16_t *p, v8f v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

static inline uint16_t f32_to_f16(float x) {
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
static inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    __builtin_memcpy(&x, &h, sizeof x);
    return (float)x;
}

static inline uint16_t f32_to_f16(float x) {
    const _Float16 h = (_Float16)x;
    uint16_t bits;
    __builtin_memcpy(&bits, &h, sizeof bits);
    return bits;
}

static inline v8f load8_f16(const uint16_t *p) {
    v8f v;
    for (int i = 0; i < 8; i++) v[i] = f16_to_f32(p[i]);
    return v;
}

static inline void store8_f16(uint16_t *p, v8f v) {
    for (int i = 0; i < 8; i++) p[i] = f32_to_f16(v[i]);
}
#endif

#endif
