/* Batched LoRA products on CPU, fp32: the shrink and expand of punica / S-LoRA, for rows
 * that each run their own adapter (or none) in one batch.
 *
 * Built by kernels/cpu/build.py, called from kernels/cpu/lora.py (GNU C, no torch
 * headers; gcc -O3 -fopenmp, never -ffast-math).
 *
 * The resident adapters are stacked: A as [S, R, K] (rank R, zero-padded to the largest
 * rank), B as [S, N, R]. Row t of the batch runs adapter slots[t] (-1: the base model, no
 * LoRA product).
 * - lora_shrink_f32: y[t] = A[s] x[t]            ([T, K] -> [T, R]; rows of slot -1: 0)
 * - lora_expand_f32: out[t] += scale[s] B[s] y[t] ([T, R] -> [T, N], in place)
 * Each row's sums run in one order whatever the batch holds, so a row's result does not
 * depend on the rows beside it. Rows of one adapter read the same A and B, which stay in
 * cache across them: the grouping S-LoRA gets from its segments.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "vec8.h"

/* A decode batch's products are a few hundred thousand multiply-adds: well under a
 * millisecond on one core, while a parallel region's barrier waits for the slowest
 * thread, which on a busy machine is one the OS has descheduled. Only prefill-sized
 * products are split. */
#define PARALLEL_MIN (1 << 22)

static float dot(const float *a, const float *b, int64_t n) {
    v8f acc = (v8f){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
    float s = hsum8(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static int check_slots(const int32_t *slots, int64_t T, int64_t S) {
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < -1 || slots[t] >= S) return 3;
    return 0;
}

int lora_shrink_f32(const float *x, int64_t xs, const float *a, int64_t S, int64_t R, int64_t K,
                    const int32_t *slots, int64_t T, float *y, int64_t ys, int num_threads) {
    if (T < 0 || S < 1 || R < 1 || K < 1) return 1;
    const int rc = check_slots(slots, T, S);
    if (rc) return rc;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * R * K > PARALLEL_MIN)
    for (int64_t t = 0; t < T; t++) {
        float *yr = y + t * ys;
        const int32_t s = slots[t];
        if (s < 0) {
            memset(yr, 0, (size_t)R * sizeof(float));
            continue;
        }
        const float *as = a + (int64_t)s * R * K;
        for (int64_t r = 0; r < R; r++) yr[r] = dot(as + r * K, x + t * xs, K);
    }
    return 0;
}

int lora_expand_f32(const float *y, int64_t ys, const float *b, int64_t S, int64_t N, int64_t R,
                    const int32_t *slots, const float *scales, int64_t T, float *out, int64_t os,
                    int num_threads) {
    if (T < 0 || S < 1 || R < 1 || N < 1) return 1;
    const int rc = check_slots(slots, T, S);
    if (rc) return rc;
    /* Rows times column chunks: a decode batch has few rows and many columns. */
    const int64_t chunk = 256, chunks = (N + chunk - 1) / chunk;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads) if (T * N * R > PARALLEL_MIN)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < chunks; c++) {
            const int32_t s = slots[t];
            if (s < 0) continue;
            const float *bs = b + (int64_t)s * N * R, *yr = y + t * ys;
            const float scale = scales[s];
            float *o = out + t * os;
            const int64_t end = (c + 1) * chunk < N ? (c + 1) * chunk : N;
            for (int64_t n = c * chunk; n < end; n++) o[n] += scale * dot(bs + n * R, yr, R);
        }
    }
    return 0;
}
