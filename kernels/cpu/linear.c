/* Linear layer on CPU, fp32: y[m, n] = x[m, :] . w[n, :] + bias[n], with the weight
 * pre-packed in panels of 16 output features.
 *
 * Built by kernels/cpu/build.py, called from kernels/cpu/linear.py (GNU C, no torch
 * headers; gcc -O3 -fopenmp, never -ffast-math). Same result as
 * torch.nn.functional.linear up to float rounding.
 *
 * Why: a decode step multiplies every weight matrix by only as many rows as there are
 * running sequences (1 to 64). BLAS libraries are tuned for large products; on this
 * kind of CPU their small-M path streams the weights at a fraction of the memory
 * bandwidth (5-10 GB/s where a plain read reaches 25), and for a 135M model that is
 * most of a decode step. The same kernel also matches BLAS on prefill-sized products.
 *
 * Layout: wp is [ceil(N / 16)][K][16]: panel p holds output features 16p..16p+15,
 * k-major, zero-padded past N. One k step of a panel is 64 contiguous bytes.
 *
 * How (the classic GEMM micro-kernel, as in BLIS): a tile is MR input rows by one
 * panel. Its 16 outputs per row live in two 8-float vector accumulators (MR * 2 = 12
 * registers for MR = 6); each k step loads the panel's 16 weights once, broadcasts one
 * input per row, and does 12 fused multiply-adds. No horizontal sums; each output is
 * accumulated in k order. Rows are taken in blocks small enough to stay in L2 while
 * the threads (torch's own libgomp pool) share the panels; a panel (K * 64 bytes) stays
 * in L1/L2 while the block's row tiles pass over it, so weights come from memory once
 * per block of rows, and a decode step (one block) reads them exactly once.
 *
 * SwiGLU's gate and up projections have a fused form: their panels are interleaved
 * ([ceil(N / 8)][K][16]: 8 gate then 8 up features per k step) and each tile
 * writes silu(gate) * up directly, so neither product goes to memory and no separate
 * pass over them is needed.
 *
 * GCC vector extensions: 8 floats (AVX on x86-64, narrower vectors elsewhere).
 */
#include <stdint.h>
#include <string.h>

#define PANEL 16
#define MR 6                     /* input rows per tile */
#define ROW_BLOCK_BYTES (1 << 18) /* input rows per block: about 256 KiB of them */
#define GU_PANEL 8                /* gate/up features per fused panel: 8 gate + 8 up */

#include "kernels.h"
#include "vec8.h"

/* Rows 0..mr-1 (a compile-time constant once inlined) of x times one panel; stores the
 * first nr (<= PANEL) outputs of each row. bias16: the panel's 16 biases (zeros if none). */
static inline __attribute__((always_inline)) void tile(int mr, const float *x, int64_t xs,
                                                       const float *panel, int64_t K,
                                                       const float *bias16, float *y, int64_t ys,
                                                       int nr) {
    v8f lo[MR], hi[MR];
    const v8f b0 = load8(bias16), b1 = load8(bias16 + 8);
    for (int i = 0; i < mr; i++) {
        lo[i] = b0;
        hi[i] = b1;
    }
    for (int64_t k = 0; k < K; k++) {
        const v8f w0 = load8(panel + k * PANEL), w1 = load8(panel + k * PANEL + 8);
        for (int i = 0; i < mr; i++) {
            const v8f xv = splat8(x[i * xs + k]);
            lo[i] += xv * w0;
            hi[i] += xv * w1;
        }
    }
    for (int i = 0; i < mr; i++) {
        if (nr == PANEL) {
            store8(y + i * ys, lo[i]);
            store8(y + i * ys + 8, hi[i]);
        } else {
            float row[PANEL];
            store8(row, lo[i]);
            store8(row + 8, hi[i]);
            memcpy(y + i * ys, row, nr * sizeof(float));
        }
    }
}


/* The shapes both entry points accept: x [M, K] and y [M, N] rows at strides xs, ys. */
static int bad_shape(int64_t M, int64_t N, int64_t K, int64_t xs, int64_t ys) {
    return M < 0 || N < 0 || K < 1 || (M > 1 && xs < K) || (M > 1 && ys < N);
}

/* Input rows per block: about ROW_BLOCK_BYTES of them, a whole number of tiles. */
static int64_t row_block(int64_t K) {
    const int64_t block = ROW_BLOCK_BYTES / (K * (int64_t)sizeof(float)) / MR * MR;
    return block < MR ? MR : block;
}

/* x [M, K] with row stride xs; wp packed as above for N outputs; bias [N] or NULL;
 * y [M, N] with row stride ys. Returns 0, or 1 for a bad shape. */
int linear_packed_f32(const float *x, int64_t xs, const float *wp, const float *bias, float *y,
                      int64_t ys, int64_t M, int64_t N, int64_t K, int num_threads) {
    if (bad_shape(M, N, K, xs, ys)) return 1;
    if (M == 0 || N == 0) return 0;
    const int64_t panels = (N + PANEL - 1) / PANEL, block = row_block(K);
#pragma omp parallel num_threads(num_threads)
    for (int64_t m0 = 0; m0 < M; m0 += block) {
        const int64_t rows = M - m0 < block ? M - m0 : block;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * PANEL;
            const int nr = N - n0 < PANEL ? (int)(N - n0) : PANEL;
            float bias16[PANEL] = {0};
            if (bias) memcpy(bias16, bias + n0, nr * sizeof(float));
            const float *panel = wp + p * K * PANEL;
#define LINEAR_TILE(mr, xr, yr) tile(mr, xr, xs, panel, K, bias16, yr, ys, nr)
            FOR_ROW_TILES(rows, x + m0 * xs, xs, y + m0 * ys + n0, ys, LINEAR_TILE);
#undef LINEAR_TILE
        }
    }
    return 0;
}

static inline __attribute__((always_inline)) void tile_gate_up(int mr, const float *x, int64_t xs,
                                                               const float *panel, int64_t K,
                                                               float *y, int64_t ys, int nr) {
    v8f g[MR], u[MR];
    for (int i = 0; i < mr; i++) g[i] = u[i] = (v8f){0};
    for (int64_t k = 0; k < K; k++) {
        const v8f wg = load8(panel + k * 2 * GU_PANEL), wu = load8(panel + k * 2 * GU_PANEL + 8);
        for (int i = 0; i < mr; i++) {
            const v8f xv = splat8(x[i * xs + k]);
            g[i] += xv * wg;
            u[i] += xv * wu;
        }
    }
    for (int i = 0; i < mr; i++) {
        float row[GU_PANEL];
        store8(row, silu_mul8(g[i], u[i]));
        memcpy(y + i * ys, row, nr * sizeof(float));
    }
}

/* y [M, N] = silu(x Wg^T) * (x Wu^T), with wp the interleaved gate/up panels described
 * above (N = intermediate size). Returns 0, or 1 for a bad shape. */
int gate_up_silu_f32(const float *x, int64_t xs, const float *wp, float *y, int64_t ys, int64_t M,
                     int64_t N, int64_t K, int num_threads) {
    if (bad_shape(M, N, K, xs, ys)) return 1;
    if (M == 0 || N == 0) return 0;
    const int64_t panels = (N + GU_PANEL - 1) / GU_PANEL, block = row_block(K);
#pragma omp parallel num_threads(num_threads)
    for (int64_t m0 = 0; m0 < M; m0 += block) {
        const int64_t rows = M - m0 < block ? M - m0 : block;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * GU_PANEL;
            const int nr = N - n0 < GU_PANEL ? (int)(N - n0) : GU_PANEL;
            const float *panel = wp + p * K * 2 * GU_PANEL;
#define GATE_UP_TILE(mr, xr, yr) tile_gate_up(mr, xr, xs, panel, K, yr, ys, nr)
            FOR_ROW_TILES(rows, x + m0 * xs, xs, y + m0 * ys + n0, ys, GATE_UP_TILE);
#undef GATE_UP_TILE
        }
    }
    return 0;
}
