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
 * - lora_group_f32: both for a group of projections that share their input (q/k/v,
 *   gate/up): one shrink with the group's A matrices stacked ([S, n R, K]), then each
 *   projection's expand, in one parallel region.
 * - lora_swiglu_f32: SwiGLU's gate and up group, added to their base product (gate and
 *   up interleaved 8 by 8, as linear.c's and quant_linear.c's SwiGLU panels give them),
 *   and silu(gate) * up written out in the same region.
 * Each row's sums run in one order whatever the batch holds, so a row's result does not
 * depend on the rows beside it.
 *
 * How: both products are dot products along a contiguous axis (K for A's rows, R for
 * B's), taken eight at a time. The shrink runs eight of A's rows against one input row:
 * eight independent accumulators (a single one would wait on each multiply-add's
 * latency), the input loaded once for the eight. The expand runs eight output features:
 * their B rows (R floats each) against the row's y. Either way the eight accumulators'
 * lanes are summed together by one transposing reduction (vec8.h sum8x8) into the eight
 * results, instead of eight horizontal sums. The expand walks the output features in
 * chunks with every row inside a chunk, so a chunk of B (CHUNK R floats per slot) stays
 * in L1 while the rows of its adapter pass over it.
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
#define CHUNK 256 /* output features per parallel chunk of the expand (a multiple of 8) */
/* lora_group_f32 splits a decode step's group across the threads: its adapters' A and
 * B come from memory (a step reads every layer's), and one core alone cannot stream
 * them as fast as the base product's threads work. */
#define GROUP_PARALLEL_MIN (1 << 16)
#define GROUP_MAX 4 /* projections per group */

static float dot(const float *a, const float *b, int64_t n) {
    v8f acc = (v8f){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
    float s = hsum8(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Lane j: the dot product of rows[j * stride ..] (n floats) with x. */
static inline __attribute__((always_inline)) v8f dot8(const float *rows, int64_t stride, const float *x, int64_t n) {
    v8f acc[8];
    for (int j = 0; j < 8; j++) acc[j] = (v8f){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f xv = load8(x + i);
        for (int j = 0; j < 8; j++) acc[j] += load8(rows + j * stride + i) * xv;
    }
    v8f sums = sum8x8(acc);
    if (i < n) {
        float tail[8];
        for (int j = 0; j < 8; j++) {
            float s = 0.0f;
            for (int64_t k = i; k < n; k++) s += rows[j * stride + k] * x[k];
            tail[j] = s;
        }
        sums += load8(tail);
    }
    return sums;
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
        const float *as = a + (int64_t)s * R * K, *xr = x + t * xs;
        int64_t r = 0;
        for (; r + 8 <= R; r += 8) store8(yr + r, dot8(as + r * K, K, xr, K));
        for (; r < R; r++) yr[r] = dot(as + r * K, xr, K);
    }
    return 0;
}

/* Row t's output features n0..end-1, scaled by scale and added to o. */
static inline __attribute__((always_inline)) void expand_row(const float *yr, const float *bs, int64_t R,
                                                             float scale, float *o, int64_t n0,
                                                             int64_t end) {
    int64_t n = n0;
    if (R % 8 == 0)
        for (; n + 8 <= end; n += 8) store8(o + n, load8(o + n) + scale * dot8(bs + n * R, R, yr, R));
    for (; n < end; n++) o[n] += scale * dot(bs + n * R, yr, R);
}

/* Rows 0..T-1's expand over output features n0..end-1, the usual ranks as compile-time
 * constants so that the dot products unroll. */
static void expand_rows(const float *y, int64_t ys, const float *b, int64_t N, int64_t R,
                        const int32_t *slots, const float *scales, int64_t T, float *out, int64_t os,
                        int64_t n0, int64_t end) {
    for (int64_t t = 0; t < T; t++) {
        const int32_t s = slots[t];
        if (s < 0) continue;
        const float *yr = y + t * ys, *bs = b + (int64_t)s * N * R;
        if (R == 16)
            expand_row(yr, bs, 16, scales[s], out + t * os, n0, end);
        else if (R == 8)
            expand_row(yr, bs, 8, scales[s], out + t * os, n0, end);
        else
            expand_row(yr, bs, R, scales[s], out + t * os, n0, end);
    }
}

int lora_expand_f32(const float *y, int64_t ys, const float *b, int64_t S, int64_t N, int64_t R,
                    const int32_t *slots, const float *scales, int64_t T, float *out, int64_t os,
                    int num_threads) {
    if (T < 0 || S < 1 || R < 1 || N < 1) return 1;
    const int rc = check_slots(slots, T, S);
    if (rc) return rc;
    /* Column chunks outside, rows inside: a decode batch has few rows and many columns,
     * and the rows of one adapter reuse the chunk's B from cache. */
    const int64_t chunks = (N + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (T * N * R > PARALLEL_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n0 = c * CHUNK, end = n0 + CHUNK < N ? n0 + CHUNK : N;
        expand_rows(y, ys, b, N, R, slots, scales, T, out, os, n0, end);
    }
    return 0;
}

/* Rows 0..T-1's shrink into y's columns r0..r1-1 (a block of 8 of A's rows, or a tail). */
static void shrink_rows(const float *x, int64_t xs, const float *a, int64_t R, int64_t K,
                        const int32_t *slots, int64_t T, float *y, int64_t ys, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < T; t++) {
        const int32_t s = slots[t];
        if (s < 0) continue;
        const float *as = a + (int64_t)s * R * K, *xr = x + t * xs;
        if (r1 - r0 == 8)
            store8(y + t * ys + r0, dot8(as + r0 * K, K, xr, K));
        else
            for (int64_t r = r0; r < r1; r++) y[t * ys + r] = dot(as + r * K, xr, K);
    }
}

/* A group of n projections sharing the input x [T, K]: y = A x with the group's A
 * matrices stacked ([S, n R, K]: projection i's are rows i R..), then for each projection
 * outs[i] [T, widths[i]] (row stride os) += scale B_i y_i, B_i [S, widths[i], R]. y: T n R
 * floats of scratch (rows of slot -1 are left as they were, and so are their outputs).
 * The same sums as lora_shrink_f32 and lora_expand_f32, in one parallel region: the
 * shrink split by blocks of 8 of A's rows, a barrier, the expands by blocks of 8 output
 * features, so that every thread streams its own part of the adapters' weights. */
int lora_group_f32(const float *x, int64_t xs, int64_t K, const float *a, int64_t S, int64_t R, int n,
                   const float *const *b, const int64_t *widths, float *const *outs, int64_t os,
                   const int32_t *slots, const float *scales, int64_t T, float *y, int num_threads) {
    if (T < 0 || S < 1 || R < 1 || K < 1 || n < 1 || n > GROUP_MAX) return 1;
    int64_t blocks[GROUP_MAX], total_blocks = 0, total_width = 0;
    for (int i = 0; i < n; i++) {
        if (widths[i] < 1) return 1;
        blocks[i] = (widths[i] + 7) / 8;
        total_blocks += blocks[i];
        total_width += widths[i];
    }
    const int rc = check_slots(slots, T, S);
    if (rc) return rc;
    const int64_t GR = n * R, r_blocks = (GR + 7) / 8;
    const int parallel = T * R * (n * K + total_width) >= GROUP_PARALLEL_MIN;
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t rb = 0; rb < r_blocks; rb++)
            shrink_rows(x, xs, a, GR, K, slots, T, y, GR, 8 * rb, 8 * rb + 8 < GR ? 8 * rb + 8 : GR);
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < total_blocks; blk++) {
            int i = 0;
            int64_t j = blk;
            while (j >= blocks[i]) j -= blocks[i++];
            const int64_t n0 = 8 * j, end = n0 + 8 < widths[i] ? n0 + 8 : widths[i];
            expand_rows(y + i * R, GR, b[i], widths[i], R, slots, scales, T, outs[i], os, n0, end);
        }
    }
    return 0;
}

/* SwiGLU with adapters on gate and up. raw [T, 2 P] (row stride 2 P, P = inter rounded
 * up to 8) holds the base product of gate and up interleaved 8 by 8: gate features
 * 8 j..8 j + 7 at raw + 16 j, up's at raw + 16 j + 8. Adds each row's adapter products
 * (a [S, 2 R, K]: gate's A rows then up's; b[0] gate's B [S, inter, R], b[1] up's) into
 * raw, then out [T, P] (row stride os) = silu(gate) * up for every row. y: 2 T R floats
 * of scratch. The shrink is split by blocks of 8 of A's rows; after the barrier, each
 * block of 8 features gets its expands and its SiLU at once, so raw's block is still in
 * cache for the SiLU. */
int lora_swiglu_f32(const float *x, int64_t xs, int64_t K, const float *a, int64_t S, int64_t R,
                    const float *const *b, int64_t inter, float *raw, float *out, int64_t os,
                    const int32_t *slots, const float *scales, int64_t T, float *y, int num_threads) {
    if (T < 0 || S < 1 || R < 1 || K < 1 || inter < 1) return 1;
    const int rc = check_slots(slots, T, S);
    if (rc) return rc;
    const int64_t GR = 2 * R, r_blocks = (GR + 7) / 8, blocks = (inter + 7) / 8, width = 16 * blocks;
    const int parallel = T * R * (2 * K + 2 * inter) >= GROUP_PARALLEL_MIN;
#pragma omp parallel num_threads(num_threads) if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t rb = 0; rb < r_blocks; rb++)
            shrink_rows(x, xs, a, GR, K, slots, T, y, GR, 8 * rb, 8 * rb + 8 < GR ? 8 * rb + 8 : GR);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < blocks; j++) {
            const int64_t n0 = 8 * j, end = n0 + 8 < inter ? n0 + 8 : inter;
            /* Feature n of block j sits at raw + 16 j + n % 8 = (raw + 8 j) + n. */
            expand_rows(y, GR, b[0], inter, R, slots, scales, T, raw + 8 * j, width, n0, end);
            expand_rows(y + R, GR, b[1], inter, R, slots, scales, T, raw + 8 * j + 8, width, n0, end);
            for (int64_t t = 0; t < T; t++) {
                const float *pair = raw + t * width + 16 * j;
                store8(out + t * os + 8 * j, silu_mul8(load8(pair), load8(pair + 8)));
            }
        }
    }
    return 0;
}
