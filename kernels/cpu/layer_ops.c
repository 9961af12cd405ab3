/* The small per-layer operations of a decoder step on CPU, fp32, each one pass in C.
 *
 * Built by kernels/cpu/build.py, called from kernels/cpu/layer_ops.py (GNU C, no torch
 * headers; gcc -O3 -fopenmp, never -ffast-math).
 *
 * Why: in a decode step these operate on a few rows of a few hundred floats, where
 * each PyTorch op costs several microseconds of dispatch whatever its size, and the
 * eager model needs about a dozen of them per layer for the norms, the rotary
 * embedding and the K/V store (plus a slow single-threaded argmax over the vocabulary
 * at the end). Each function here replaces such a group with one call.
 *
 * - rms_norm_f32: optional residual add (r += x, in place), then
 *   out = r * rsqrt(mean(r^2) + eps) * weight, as HF's LlamaRMSNorm in fp32.
 * - rotary_store_f32 / rotary_store_f16kv: rotate-half RoPE of the q and k heads of a
 *   packed q/k/v row, in place, then store k and v of each token at its cache slot
 *   (slot -1: not stored), into an fp32 cache or a float16 one (rounded to nearest
 *   even as torch's .to(torch.float16) rounds, see half8.h, so this store and the
 *   PyTorch one write the same bits).
 * - argmax_rows_f32: index of each row's maximum (the first one; a NaN counts as the
 *   maximum, as in torch.argmax).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half8.h"
#include "kernels.h"
#include "vec8.h"

/* Sum of squares, 8 lanes at a time, then a tree sum. */
static float sum_squares(const float *r, int64_t n) {
    v8f acc = (v8f){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f v = load8(r + i);
        acc += v * v;
    }
    float s = hsum8(acc);
    for (; i < n; i++) s += r[i] * r[i];
    return s;
}

int rms_norm_f32(const float *x, int64_t xs, float *residual, int64_t rs, const float *weight,
                 float *out, int64_t os, int64_t M, int64_t N, float eps, int num_threads) {
    if (M < 0 || N < 1) return 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (M * N > 65536)
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * xs;
        const float *r = xr;
        if (residual) {
            float *rr = residual + m * rs;
            for (int64_t i = 0; i < N; i++) rr[i] += xr[i];
            r = rr;
        }
        const float inv = 1.0f / sqrtf(sum_squares(r, N) / (float)N + eps);
        float *o = out + m * os;
        for (int64_t i = 0; i < N; i++) o[i] = weight[i] * (r[i] * inv);
    }
    return 0;
}

/* One head of D floats rotated in place with cos/sin rows c, s (D/2 each). */
static inline void rotate_half(float *h, const float *c, const float *s, int half) {
    for (int i = 0; i < half; i++) {
        const float x1 = h[i], x2 = h[i + half];
        h[i] = x1 * c[i] - x2 * s[i];
        h[i + half] = x2 * c[i] + x1 * s[i];
    }
}

/* One head's D floats written to a cache row of floats or of halves. */
static inline __attribute__((always_inline)) void store_head(void *dst, const float *src, int D, const int kv16) {
    if (!kv16) {
        memcpy(dst, src, (size_t)D * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    int i = 0;
    for (; i + 8 <= D; i += 8) store8_f16(h + i, load8(src + i));
    for (; i < D; i++) h[i] = f32_to_f16(src[i]);
}

/* qkv [T, (hq + 2 hkv) * D] with row stride qs: q heads, then k heads, then v heads.
 * cos_sin [T, D] contiguous: cos in the first half, sin in the second. slots [T].
 * Cache views k/v [num_blocks, block_size, hkv, D] given by base pointer and the
 * strides of their first three dimensions in elements (the last is 1); kv16: the
 * caches hold float16, else float. */
static inline __attribute__((always_inline)) int rotary_store(float *qkv, int64_t qs, int64_t T, int hq, int hkv,
                                                              int D, const float *cos_sin, const int64_t *slots,
                                                              void *k_cache, int64_t kb, int64_t kp, int64_t kh,
                                                              void *v_cache, int64_t vb, int64_t vp, int64_t vh,
                                                              int64_t num_blocks, int block_size, int num_threads,
                                                              const int kv16) {
    if (T < 0 || D < 2 || D % 2 || block_size < 1) return 1;
    const int half = D / 2;
    const int64_t elem = kv16 ? 2 : 4;
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T > 64) reduction(| : bad)
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * qs;
        const float *c = cos_sin + t * D, *s = c + half;
        for (int h = 0; h < hq + hkv; h++) rotate_half(row + (int64_t)h * D, c, s, half);
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        const int64_t block = slot / block_size, pos = slot % block_size;
        if (block >= num_blocks) {
            bad = 1;
            continue;
        }
        const float *k = row + (int64_t)hq * D, *v = k + (int64_t)hkv * D;
        for (int h = 0; h < hkv; h++) {
            store_head((char *)k_cache + (block * kb + pos * kp + h * kh) * elem, k + (int64_t)h * D, D, kv16);
            store_head((char *)v_cache + (block * vb + pos * vp + h * vh) * elem, v + (int64_t)h * D, D, kv16);
        }
    }
    return bad ? 3 : 0;
}

int rotary_store_f32(float *qkv, int64_t qs, int64_t T, int hq, int hkv, int D, const float *cos_sin,
                     const int64_t *slots, float *k_cache, int64_t kb, int64_t kp, int64_t kh, float *v_cache,
                     int64_t vb, int64_t vp, int64_t vh, int64_t num_blocks, int block_size, int num_threads) {
    return rotary_store(qkv, qs, T, hq, hkv, D, cos_sin, slots, k_cache, kb, kp, kh, v_cache, vb, vp, vh,
                        num_blocks, block_size, num_threads, 0);
}

int rotary_store_f16kv(float *qkv, int64_t qs, int64_t T, int hq, int hkv, int D, const float *cos_sin,
                       const int64_t *slots, uint16_t *k_cache, int64_t kb, int64_t kp, int64_t kh,
                       uint16_t *v_cache, int64_t vb, int64_t vp, int64_t vh, int64_t num_blocks, int block_size,
                       int num_threads) {
    return rotary_store(qkv, qs, T, hq, hkv, D, cos_sin, slots, k_cache, kb, kp, kh, v_cache, vb, vp, vh,
                        num_blocks, block_size, num_threads, 1);
}

int argmax_rows_f32(const float *x, int64_t xs, int64_t M, int64_t N, int64_t *out,
                    int num_threads) {
    if (M < 0 || N < 1) return 1;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t m = 0; m < M; m++) {
        const float *r = x + m * xs;
        /* Lane-wise running maxima (NaN-free pass), then the first index that holds the
         * maximum; a NaN anywhere wins, as in torch. */
        v8f best = splat8(-INFINITY);
        v8i has_nan = (v8i){0};
        int64_t i = 0;
        for (; i + 8 <= N; i += 8) {
            const v8f v = load8(r + i);
            has_nan |= v != v;
            const v8i gt = v > best;
            best = (v8f)(((v8i)v & gt) | ((v8i)best & ~gt));
        }
        float top = -INFINITY;
        int nan = 0;
        for (int l = 0; l < 8; l++) {
            top = best[l] > top ? best[l] : top;
            nan |= has_nan[l] != 0;
        }
        for (int64_t j = i; j < N; j++) {
            nan |= r[j] != r[j];
            top = r[j] > top ? r[j] : top;
        }
        int64_t index = 0;
        for (int64_t j = 0; j < N; j++) {
            if (nan ? r[j] != r[j] : r[j] == top) {
                index = j;
                break;
            }
        }
        out[m] = index;
    }
    return 0;
}
