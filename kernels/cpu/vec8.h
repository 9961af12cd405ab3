/* 8-float vectors through GCC vector extensions (AVX on x86-64, narrower vectors
 * elsewhere), shared by the C kernels in this directory. */
#ifndef CHATSITE_VEC8_H
#define CHATSITE_VEC8_H

#include <stdint.h>

typedef float v8f __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f load8(const float *p) { return *(const v8u *)p; }
static inline void store8(float *p, v8f v) { *(v8u *)p = v; }
static inline v8f splat8(float x) { return (v8f){x, x, x, x, x, x, x, x}; }

/* Tree sum of the 8 lanes (plain C would add them one after the other). */
static inline float hsum8(v8f v) {
    v = v + __builtin_shuffle(v, (v8i){4, 5, 6, 7, 0, 1, 2, 3});
    v = v + __builtin_shuffle(v, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    v = v + __builtin_shuffle(v, (v8i){1, 0, 3, 2, 5, 4, 7, 6});
    return v[0];
}

/* The 8 lanes' sum in the order sum8x8 (below) adds each of its vectors': ((x0 + x1) +
 * (x2 + x3)) + ((x4 + x5) + (x6 + x7)), so that a sum does not depend on whether it
 * was taken alone or among 8. */
static inline float pair_sum8(v8f v) {
    v = v + __builtin_shuffle(v, (v8i){1, 0, 3, 2, 5, 4, 7, 6});
    v = v + __builtin_shuffle(v, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    return v[0] + v[4];
}

/* Lane j of the result: the sum of v[j]'s eight lanes (an 8 x 8 transpose folded into
 * the adds: pairs, then quads, then halves). */
static inline __attribute__((always_inline)) v8f sum8x8(const v8f v[8]) {
    const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8f p[4], q[2];
    for (int i = 0; i < 4; i++)
        p[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], even) +
               __builtin_shuffle(v[2 * i], v[2 * i + 1], odd);
    for (int i = 0; i < 2; i++)
        q[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], lo2) +
               __builtin_shuffle(p[2 * i], p[2 * i + 1], hi2);
    return __builtin_shuffle(q[0], q[1], lo4) + __builtin_shuffle(q[0], q[1], hi4);
}

/* exp(x) lane by lane for x <= 0 (scores minus their running max), to about 1 ulp
 * (Cephes expf). Results below exp(-87) flush to 0: they are under 2^-125 times the
 * largest term of the sum, which is 1; x = -inf (padding) gives 0. */
static inline v8f exp8_nonpos(v8f x) {
    const v8f lo = splat8(-87.0f);
    const v8i under = x < lo;
    x = (v8f)(((v8i)x & ~under) | ((v8i)lo & under));
    /* n = round(x / ln 2) with the 1.5 * 2^23 trick: exact, no rounding call. */
    const v8f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v8f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f p = splat8(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const v8f y = p * (r * r) + r + 1.0f;
    const v8f two_n = (v8f)((__builtin_convertvector(n, v8i) + 127) << 23);
    return (v8f)((v8i)(y * two_n) & ~under);
}

/* silu(g) * u = g * sigmoid(g) * u, with sigmoid from e = exp(-|g|) so that nothing
 * overflows: 1 / (1 + e) for g >= 0, e / (1 + e) below. */
static inline v8f silu_mul8(v8f g, v8f u) {
    const v8i neg = g < 0;
    const v8f minus_abs = (v8f)(((v8i)(-g) & ~neg) | ((v8i)g & neg));
    const v8f e = exp8_nonpos(minus_abs);
    const v8f num = (v8f)(((v8i)splat8(1.0f) & ~neg) | ((v8i)e & neg));
    return g * (num / (1.0f + e)) * u;
}

/* Runs TILE(mr, x rows, y rows) over `rows` rows: full MR-row tiles (MR is the including
 * kernel's tile height), then one tile for the rest, each with mr a compile-time constant
 * so the tile is fully unrolled. Shared by the fp32 and the quantized GEMMs. */
#define FOR_ROW_TILES(rows, x, xs, y, ys, TILE)                                  \
    do {                                                                         \
        int64_t m_ = 0;                                                          \
        for (; m_ + MR <= (rows); m_ += MR) TILE(MR, (x) + m_ * (xs), (y) + m_ * (ys)); \
        const float *x_ = (x) + m_ * (xs);                                       \
        float *y_ = (y) + m_ * (ys);                                             \
        switch ((rows) - m_) {                                                   \
        case 5: TILE(5, x_, y_); break;                                          \
        case 4: TILE(4, x_, y_); break;                                          \
        case 3: TILE(3, x_, y_); break;                                          \
        case 2: TILE(2, x_, y_); break;                                          \
        case 1: TILE(1, x_, y_); break;                                          \
        default: break;                                                          \
        }                                                                        \
    } while (0)

#endif
