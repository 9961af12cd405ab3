/* Linear layer on CPU over block-quantized weights (GGUF Q8_0, Q4_0, Q4_1, Q4_K,
 * Q6_K, repacked by kernels/cpu/quant.py): y[m, n] = x[m, :] . w[n, :] + bias[n], where
 * each weight is de-quantized in registers and everything is computed in fp32.
 *
 * Built by kernels/cpu/build.py (gcc -O3 -fopenmp, never -ffast-math).
 *
 * Why: a decode step reads every weight once per step, so its speed is set by bytes.
 * Four-bit blocks are 0.75 bytes per weight here against 4 for fp32.
 *
 * Exactness: every de-quantized value equals what gguf-py's numpy code (which
 * transformers' GGUF loader calls) produces. All the scales and offsets are stored as
 * fp32 (f16 -> fp32 and the K-quants' d * sub-scale are exact), and scale * q is exact
 * for 4-bit q (11 + 6 + 4 bits < 24), so scale * q + offset rounds once whether or not
 * the compiler fuses it into an FMA, as numpy's separate multiply and add do. For
 * int8 q (Q8_0: 11 + 8 bits, exact; Q6_K: 11 + 8 + 6 bits) the single product is the
 * single rounding numpy does.
 *
 * Layout: the weight [N, K] is cut into panels of 16 output features; a panel is
 * K / G groups of G inputs, and each group is
 *   Q8  (G = 32):  16 f32 scales, then G x 16 int8 quants (k-major)
 *   Q8S (G = 16):  the same with G = 16 (Q6_K's sub-blocks of 16)
 *   Q4  (G = 32):  16 f32 scales, 16 f32 offsets, then G x 8 bytes: byte j of a k step
 *                  holds output j in its low nibble and output j + 8 in its high one.
 * So one k step of a panel is 16 (or 8) contiguous bytes, de-quantized into the two
 * 8-float vectors the fp32 micro-kernel (as in linear.c) multiplies.
 *
 * How:
 * - with AVX-512 (Zen 4/5, recent Xeons), any number of rows: tiles of up to MR_WIDE
 *   rows de-quantize each k step of a panel in registers and feed all their rows; the
 *   panel comes from memory once, for the first tile, and from L1 for the others.
 *   Every row's sums run in the same order whatever the row count, so a row's output
 *   does not depend on the rows beside it (a verified proposal matches plain decoding).
 * - without: up to MR rows the same in 8-float tiles; more rows (batched decode,
 *   prefill) de-quantize each panel once into a per-thread fp32 buffer (K x 16
 *   floats, L2-sized) and the fp32 micro-kernel runs every row tile over it.
 * - silu_pairs: SwiGLU's gate and up rows interleaved 8 by 8 (each panel = 8 gate + 8
 *   up features); the tile writes silu(gate) * up to 8 outputs, so neither product goes
 *   to memory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 16
#define MR 6
#define ROW_BLOCK_BYTES (1 << 18)
#ifndef PREFETCH_PANELS
#define PREFETCH_PANELS 4
#endif

#include "kernels.h"
#include "vec8.h"

enum { FMT_Q8 = 0, FMT_Q8S = 1, FMT_Q4 = 2 };

typedef int8_t v8s8 __attribute__((vector_size(8), aligned(1)));
typedef uint8_t v8u8 __attribute__((vector_size(8), aligned(1)));

static inline int group_size(int fmt) { return fmt == FMT_Q8S ? 16 : 32; }

static inline int64_t group_bytes(int fmt) {
    switch (fmt) {
    case FMT_Q8: return 64 + 32 * 16;
    case FMT_Q8S: return 64 + 16 * 16;
    default: return 128 + 32 * 8;
    }
}

/* Asks for the `bytes` at p (a group of a later panel) to be brought into the cache.
 * The small-M path streams the weights once, at more bytes per instruction than the
 * hardware prefetcher keeps up with across 4 KiB pages; a few panels ahead covers the
 * latency. */
static inline void prefetch_group(const uint8_t *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

/* One group's scale (and offset) vectors: lanes 0-7 and 8-15. */
typedef struct {
    v8f s0, s1, o0, o1;
} group_params;

static inline __attribute__((always_inline)) group_params params(int fmt, const uint8_t *g) {
    const float *s = (const float *)g;
    group_params p = {load8(s), load8(s + 8), {0}, {0}};
    if (fmt == FMT_Q4) {
        p.o0 = load8(s + 16);
        p.o1 = load8(s + 24);
    }
    return p;
}

/* 8 bytes widened to 8 int32 lanes. GCC lowers __builtin_convertvector from 8-byte
 * vectors element by element, so on AVX2 the widening load is spelled out. */
#ifdef __AVX2__
#include <immintrin.h>
static inline v8i widen_u8(const uint8_t *p) {
    return (v8i)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline v8i widen_s8(const int8_t *p) {
    return (v8i)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
#else
static inline v8i widen_u8(const uint8_t *p) { return __builtin_convertvector(*(const v8u8 *)p, v8i); }
static inline v8i widen_s8(const int8_t *p) { return __builtin_convertvector(*(const v8s8 *)p, v8i); }
#endif

/* The 16 de-quantized weights of k step `k` of group `g`. */
static inline __attribute__((always_inline)) void dequant_step(int fmt, const uint8_t *g,
                                                               const group_params *p, int k,
                                                               v8f *w0, v8f *w1) {
    if (fmt == FMT_Q4) {
        const v8i b = widen_u8(g + 128 + k * 8);
        const v8f lo = __builtin_convertvector(b & 15, v8f);
        const v8f hi = __builtin_convertvector(b >> 4, v8f);
        *w0 = p->s0 * lo + p->o0;
        *w1 = p->s1 * hi + p->o1;
    } else {
        const int8_t *q = (const int8_t *)(g + 64) + k * 16;
        *w0 = p->s0 * __builtin_convertvector(widen_s8(q), v8f);
        *w1 = p->s1 * __builtin_convertvector(widen_s8(q + 8), v8f);
    }
}

/* Stores one row's 16 accumulators: the first nr outputs, or with silu 8 outputs
 * silu(lo) * hi (nr of them). */
static inline __attribute__((always_inline)) void store_row(float *y, v8f lo, v8f hi, int nr,
                                                            int silu) {
    float row[PANEL];
    if (silu) {
        store8(row, silu_mul8(lo, hi));
    } else if (nr == PANEL) {
        store8(y, lo);
        store8(y + 8, hi);
        return;
    } else {
        store8(row, lo);
        store8(row + 8, hi);
    }
    memcpy(y, row, nr * sizeof(float));
}

/* mr rows of x times one quantized panel, de-quantizing in registers. */
static inline __attribute__((always_inline)) void tile_quant(int mr, int fmt, const float *x,
                                                             int64_t xs, const uint8_t *panel,
                                                             int64_t K, const float *bias16,
                                                             float *y, int64_t ys, int nr,
                                                             int silu, int64_t ahead) {
    const int G = group_size(fmt);
    const int64_t gb = group_bytes(fmt);
    v8f lo[MR], hi[MR];
    const v8f b0 = load8(bias16), b1 = load8(bias16 + 8);
    for (int i = 0; i < mr; i++) {
        lo[i] = b0;
        hi[i] = b1;
    }
    for (int64_t k0 = 0; k0 < K; k0 += G) {
        const uint8_t *g = panel + (k0 / G) * gb;
        if (ahead) prefetch_group(g + ahead, gb);
        const group_params p = params(fmt, g);
        for (int k = 0; k < G; k++) {
            v8f w0, w1;
            dequant_step(fmt, g, &p, k, &w0, &w1);
            for (int i = 0; i < mr; i++) {
                const v8f xv = splat8(x[i * xs + k0 + k]);
                lo[i] += xv * w0;
                hi[i] += xv * w1;
            }
        }
    }
    for (int i = 0; i < mr; i++) store_row(y + i * ys, lo[i], hi[i], nr, silu);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* The small-M tiles again with 16-float vectors, where the CPU has them: a register
 * holds one k step of a panel (all 16 outputs), and 32 registers leave room for
 * MR_WIDE rows. Each weight is still de-quantized as scale * q (+ offset) before it is
 * multiplied, and each x element is broadcast straight from memory into its FMA; the
 * row sums are split in two halves (even and odd k) that are added at the end, a
 * different order of the same fp32 additions, the same in every tile size. */
#define MR_WIDE 12
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f load16(const float *p) { return (v16f)_mm512_loadu_ps(p); }
static inline v16f splat16(float x) { return (v16f)_mm512_set1_ps(x); }
static inline v8f low8(v16f v) { return (v8f)_mm512_castps512_ps256((__m512)v); }
static inline v8f high8(v16f v) { return (v8f)_mm512_extractf32x8_ps((__m512)v, 1); }

static inline __attribute__((always_inline)) void tile_q4_wide(int mr, const float *x, int64_t xs,
                                                               const uint8_t *panel, int64_t K,
                                                               const float *bias16, float *y,
                                                               int64_t ys, int nr, int silu,
                                                               int64_t ahead) {
    v16f even[MR_WIDE], odd[MR_WIDE]; /* all 16 outputs, over even and odd k */
    for (int i = 0; i < mr; i++) even[i] = odd[i] = splat16(0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
        const uint8_t *g = panel + (k0 / 32) * group_bytes(FMT_Q4);
        if (ahead) prefetch_group(g + ahead, group_bytes(FMT_Q4));
        const float *sc = (const float *)g;
        const v16f s = load16(sc), o = load16(sc + 16);
        for (int k = 0; k < 32; k += 2) {
            /* 16 bytes = steps k and k + 1; their low nibbles are outputs 0-7, high 8-15. */
            const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + 128 + k * 8)));
            const __m512i lo = (__m512i)((v16i)b & 15), hi = (__m512i)((v16i)b >> 4);
            const v16i qe = (v16i)_mm512_shuffle_i32x4(lo, hi, 0x44); /* step k, outputs 0-15 */
            const v16i qo = (v16i)_mm512_shuffle_i32x4(lo, hi, 0xEE); /* step k + 1 */
            const v16f we = s * __builtin_convertvector(qe, v16f) + o;
            const v16f wo = s * __builtin_convertvector(qo, v16f) + o;
            for (int i = 0; i < mr; i++) {
                even[i] += splat16(x[i * xs + k0 + k]) * we;
                odd[i] += splat16(x[i * xs + k0 + k + 1]) * wo;
            }
        }
    }
    const v8f b0 = load8(bias16), b1 = load8(bias16 + 8);
    for (int i = 0; i < mr; i++) {
        const v16f sum = even[i] + odd[i];
        store_row(y + i * ys, low8(sum) + b0, high8(sum) + b1, nr, silu);
    }
}

static inline __attribute__((always_inline)) void tile_q8_wide(int mr, int fmt, const float *x,
                                                               int64_t xs, const uint8_t *panel,
                                                               int64_t K, const float *bias16,
                                                               float *y, int64_t ys, int nr,
                                                               int silu, int64_t ahead) {
    const int G = group_size(fmt);
    const int64_t gb = group_bytes(fmt);
    v16f even[MR_WIDE], odd[MR_WIDE]; /* all 16 outputs, over even and odd k */
    for (int i = 0; i < mr; i++) even[i] = odd[i] = splat16(0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += G) {
        const uint8_t *g = panel + (k0 / G) * gb;
        if (ahead) prefetch_group(g + ahead, gb);
        const v16f sc = load16((const float *)g);
        const int8_t *q = (const int8_t *)(g + 64);
        for (int k = 0; k < G; k += 2) {
            const v16f we = sc * __builtin_convertvector(
                                     (v16i)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + k * 16))), v16f);
            const v16f wo = sc * __builtin_convertvector(
                                     (v16i)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + k * 16 + 16))), v16f);
            for (int i = 0; i < mr; i++) {
                even[i] += splat16(x[i * xs + k0 + k]) * we;
                odd[i] += splat16(x[i * xs + k0 + k + 1]) * wo;
            }
        }
    }
    const v8f b0 = load8(bias16), b1 = load8(bias16 + 8);
    for (int i = 0; i < mr; i++) {
        const v16f sum = even[i] + odd[i];
        store_row(y + i * ys, low8(sum) + b0, high8(sum) + b1, nr, silu);
    }
}
#endif

/* mr rows of x times one de-quantized fp32 panel [K][16] (linear.c's micro-kernel). */
static inline __attribute__((always_inline)) void tile_f32(int mr, const float *x, int64_t xs,
                                                           const float *panel, int64_t K,
                                                           const float *bias16, float *y,
                                                           int64_t ys, int nr, int silu) {
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
    for (int i = 0; i < mr; i++) store_row(y + i * ys, lo[i], hi[i], nr, silu);
}

static void dequant_panel(int fmt, const uint8_t *panel, int64_t K, float *out) {
    const int G = group_size(fmt);
    const int64_t gb = group_bytes(fmt);
    for (int64_t k0 = 0; k0 < K; k0 += G) {
        const uint8_t *g = panel + (k0 / G) * gb;
        const group_params p = params(fmt, g);
        for (int k = 0; k < G; k++) {
            v8f w0, w1;
            dequant_step(fmt, g, &p, k, &w0, &w1);
            store8(out + (k0 + k) * PANEL, w0);
            store8(out + (k0 + k) * PANEL + 8, w1);
        }
    }
}


/* The small-M path with fmt a compile-time constant in each instance. */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define QUANT_TILE(mr, xr, yr)                                                                 \
    (FMT == FMT_Q4 ? tile_q4_wide(mr, xr, xs, panel, K, bias16, yr, ys, nr, silu, ahead)      \
                   : tile_q8_wide(mr, FMT, xr, xs, panel, K, bias16, yr, ys, nr, silu, ahead))
/* Every row count stays in registers here: the panel (a few KiB) is read from memory
 * by the first row tile and from L1 by the others, which de-quantize it again, and
 * their 16-float FMAs still beat the buffered path's 8-float ones (1.7-2x at 32-96
 * rows on Zen 5, benchmarks/bench_cpu_linear.py shapes). */
#define SMALL_M_MAX INT64_MAX
/* TILE over `rows` rows in the fewest tiles of at most MR_WIDE rows, of near-equal
 * heights; only the first tile prefetches the panels ahead. */
#define FOR_ROW_TILES_WIDE(rows, x, xs, y, ys, TILE)                                       \
    do {                                                                                   \
        const int64_t tiles_ = ((rows) + MR_WIDE - 1) / MR_WIDE;                           \
        int64_t m_ = 0;                                                                    \
        for (int64_t t_ = 0; t_ < tiles_; t_++, ahead = 0) {                               \
            const int h_ = (int)(((rows) - m_) / (tiles_ - t_));                           \
            const float *x_ = (x) + m_ * (xs);                                             \
            float *y_ = (y) + m_ * (ys);                                                   \
            m_ += h_;                                                                      \
            switch (h_) {                                                                  \
            case 12: TILE(12, x_, y_); break;                                              \
            case 11: TILE(11, x_, y_); break;                                              \
            case 10: TILE(10, x_, y_); break;                                              \
            case 9: TILE(9, x_, y_); break;                                                \
            case 8: TILE(8, x_, y_); break;                                                \
            case 7: TILE(7, x_, y_); break;                                                \
            case 6: TILE(6, x_, y_); break;                                                \
            case 5: TILE(5, x_, y_); break;                                                \
            case 4: TILE(4, x_, y_); break;                                                \
            case 3: TILE(3, x_, y_); break;                                                \
            case 2: TILE(2, x_, y_); break;                                                \
            default: TILE(1, x_, y_); break;                                               \
            }                                                                              \
        }                                                                                  \
    } while (0)
#define SMALL_M_TILES FOR_ROW_TILES_WIDE
#else
#define QUANT_TILE(mr, xr, yr) tile_quant(mr, FMT, xr, xs, panel, K, bias16, yr, ys, nr, silu, ahead)
#define SMALL_M_MAX MR
#define SMALL_M_TILES FOR_ROW_TILES
#endif
#define FMT FMT_Q8
static void rows_q8(const float *x, int64_t xs, const uint8_t *panel, int64_t K,
                    const float *bias16, float *y, int64_t ys, int64_t rows, int nr, int silu,
                    int64_t ahead) {
    SMALL_M_TILES(rows, x, xs, y, ys, QUANT_TILE);
}
#undef FMT
#define FMT FMT_Q8S
static void rows_q8s(const float *x, int64_t xs, const uint8_t *panel, int64_t K,
                     const float *bias16, float *y, int64_t ys, int64_t rows, int nr, int silu,
                    int64_t ahead) {
    SMALL_M_TILES(rows, x, xs, y, ys, QUANT_TILE);
}
#undef FMT
#define FMT FMT_Q4
static void rows_q4(const float *x, int64_t xs, const uint8_t *panel, int64_t K,
                    const float *bias16, float *y, int64_t ys, int64_t rows, int nr, int silu,
                    int64_t ahead) {
    SMALL_M_TILES(rows, x, xs, y, ys, QUANT_TILE);
}
#undef FMT
#undef QUANT_TILE

static void rows_f32(const float *x, int64_t xs, const float *panel, int64_t K,
                     const float *bias16, float *y, int64_t ys, int64_t rows, int nr, int silu) {
#define F32_TILE(mr, xr, yr) tile_f32(mr, xr, xs, panel, K, bias16, yr, ys, nr, silu)
    FOR_ROW_TILES(rows, x, xs, y, ys, F32_TILE);
#undef F32_TILE
}

/* The calling thread's fp32 panel buffer (K x 16 floats), kept between calls: an
 * allocation per call cost more than the product at decode batch sizes. */
static float *panel_buffer(int64_t K) {
    static __thread float *buf = NULL;
    static __thread size_t capacity = 0;
    const size_t need = (size_t)K * PANEL * sizeof(float);
    if (need > capacity) {
        free(buf);
        buf = aligned_alloc(64, need);
        capacity = buf ? need : 0;
    }
    return buf;
}

/* x [M, K] (row stride xs); wq: ceil(N / 16) panels in format fmt for N weight rows;
 * bias [N] or NULL (not with silu_pairs); y [M, N] at row stride ys, or [M, N / 2] with
 * silu_pairs (then N must be a multiple of 16). Returns 0, 1 for a bad shape or format,
 * 2 when a buffer cannot be allocated. */
int quant_linear_f32(const float *x, int64_t xs, const uint8_t *wq, int fmt, const float *bias,
                     float *y, int64_t ys, int64_t M, int64_t N, int64_t K, int silu_pairs,
                     int num_threads) {
    if (fmt < FMT_Q8 || fmt > FMT_Q4) return 1;
    const int G = group_size(fmt);
    const int64_t out_cols = silu_pairs ? N / 2 : N;
    if (M < 0 || N < 0 || K < G || K % G || (M > 1 && xs < K) || (M > 1 && ys < out_cols))
        return 1;
    if (silu_pairs && (N % PANEL || bias)) return 1;
    if (M == 0 || N == 0) return 0;
    const int64_t panels = (N + PANEL - 1) / PANEL;
    const int64_t panel_bytes = (K / G) * group_bytes(fmt);
    int64_t block = ROW_BLOCK_BYTES / (K * (int64_t)sizeof(float)) / MR * MR;
    if (block < MR) block = MR;
    const int buffered = M > SMALL_M_MAX;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *buf = buffered ? panel_buffer(K) : NULL;
        if (buffered && !buf) failed = 1;
        for (int64_t m0 = 0; m0 < M; m0 += block) {
            const int64_t rows = M - m0 < block ? M - m0 : block;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                if (buffered && !buf) continue;
                const int64_t n0 = p * PANEL;
                int nr = N - n0 < PANEL ? (int)(N - n0) : PANEL;
                float bias16[PANEL] = {0};
                if (bias) memcpy(bias16, bias + n0, nr * sizeof(float));
                const uint8_t *panel = wq + p * panel_bytes;
                const float *xr = x + m0 * xs;
                float *yr = y + m0 * ys + (silu_pairs ? p * (PANEL / 2) : n0);
                if (silu_pairs) nr = PANEL / 2;
                if (buffered) {
                    dequant_panel(fmt, panel, K, buf);
                    rows_f32(xr, xs, buf, K, bias16, yr, ys, rows, nr, silu_pairs);
                } else {
                    /* PREFETCH_PANELS ahead, within this thread's share of the panels. */
                    const int64_t ahead = p + PREFETCH_PANELS < panels ? PREFETCH_PANELS * panel_bytes : 0;
                    if (fmt == FMT_Q4)
                        rows_q4(xr, xs, panel, K, bias16, yr, ys, rows, nr, silu_pairs, ahead);
                    else if (fmt == FMT_Q8)
                        rows_q8(xr, xs, panel, K, bias16, yr, ys, rows, nr, silu_pairs, ahead);
                    else
                        rows_q8s(xr, xs, panel, K, bias16, yr, ys, rows, nr, silu_pairs, ahead);
                }
            }
        }
    }
    return failed ? 2 : 0;
}

/* The most rows of one call whose every output row has the bits that row alone would
 * get (the register tiles; the buffered path sums in another order). */
int64_t quant_linear_row_independent_max(void) { return SMALL_M_MAX; }

/* out [n_ids, K] = the de-quantized weight rows ids[i] (the embedding lookup: only the
 * rows asked for). Returns 0, 1 for a bad shape or format, 3 for an id out of range. */
int quant_rows_f32(const uint8_t *wq, int fmt, int64_t N, int64_t K, const int64_t *ids,
                   int64_t n_ids, float *out) {
    if (fmt < FMT_Q8 || fmt > FMT_Q4) return 1;
    const int G = group_size(fmt);
    if (N < 0 || n_ids < 0 || K < G || K % G) return 1;
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= N) return 3;
    const int64_t gb = group_bytes(fmt), panel_bytes = (K / G) * gb;
    for (int64_t i = 0; i < n_ids; i++) {
        const uint8_t *panel = wq + (ids[i] / PANEL) * panel_bytes;
        const int j = (int)(ids[i] % PANEL);
        float *row = out + i * K;
        for (int64_t k0 = 0; k0 < K; k0 += G) {
            const uint8_t *g = panel + (k0 / G) * gb;
            const group_params p = params(fmt, g);
            for (int k = 0; k < G; k++) {
                v8f w0, w1;
                dequant_step(fmt, g, &p, k, &w0, &w1);
                row[k0 + k] = j < 8 ? w0[j] : w1[j - 8];
            }
        }
    }
    return 0;
}
