/* Paged decode attention on CPU, fp32 math: one new query token per sequence.
 *
 * Built by kernels/cpu/build.py, called from kernels/cpu/decode.py (GNU C, no torch headers; gcc -O3
 * -fopenmp, never -ffast-math). Same contract as
 * inference.layers.attention.decode_attention_torch and kernels.reference.paged_attention_ref
 * with one query per sequence:
 *
 *   out[b, h] = softmax(scale * q[b, h] . K[b]^T) V[b]
 *
 * where K[b]/V[b] are the first context_lens[b] positions of sequence b, found block
 * by block through block_tables[b]. Its arguments `window`, `softcap` and `sinks` add the
 * features of inference.layers.window_attention: a sliding window (only the last `window`
 * positions; blocks before them are never read), a logit soft-cap
 * (s = cap * tanh(s / cap)) and per-head sinks (exp(sink[h]) joins the softmax
 * denominator). Those are compile-time switches of the inner loop, so the plain kernel
 * keeps its code. Each K/V block is read from memory once, in place,
 * and never past a sequence's length (stale slots may hold anything, NaN included).
 * The query heads that share one KV head (a GQA group) are processed together, one
 * tile of positions at a time, so the tile's K/V rows come from memory once for the
 * group (the other heads of the group re-read them from L1). The softmax is online:
 * running max and sum in fp32, the accumulator rescaled when the max grows.
 *
 * Work items are (run of rows, kv head) pairs, shared by the OpenMP threads dynamically;
 * a run is usually one sequence, or the successive positions of one sequence that a
 * speculative verify step brings, which then read each K/V tile once for all of them.
 * The OpenMP runtime is torch's own libgomp.so.1 (same soname, already loaded when
 * this library is), so the threads are those of torch's intra-op pool.
 *
 * Rows (head_dim) that are a multiple of 8 go through GCC vector extensions (8 floats:
 * AVX on x86-64, lowered to narrower vectors elsewhere); other sizes take a scalar path.
 *
 * The K/V caches are fp32 or IEEE float16 (the `kv16` argument): the query,
 * the output and every sum stay fp32, and a half element is widened as it is loaded
 * (half8.h), so a float16 cache gives bit for bit what the fp32 kernel gives on that
 * cache upcast, while reading half the bytes (decode attention over long histories is
 * bound by them). One body serves both: the element type is a compile-time flag
 * (`kv16`) of the always-inline functions below, strides stay in elements.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 32   /* positions per online-softmax step (a block is split in tiles) */
#define MAX_VEC 64 /* vector path up to head_dim 512 */
#define RUN_MAX 16 /* rows of one work item */

#include "half8.h"
#include "kernels.h"
#include "vec8.h"

static inline v8f max8(v8f a, v8f b) {
    const v8i gt = a > b;
    return (v8f)(((v8i)a & gt) | ((v8i)b & ~gt));
}

static inline float hmax8(v8f v) {
    v = max8(v, __builtin_shuffle(v, (v8i){4, 5, 6, 7, 0, 1, 2, 3}));
    v = max8(v, __builtin_shuffle(v, (v8i){2, 3, 0, 1, 6, 7, 4, 5}));
    v = max8(v, __builtin_shuffle(v, (v8i){1, 0, 3, 2, 5, 4, 7, 6}));
    return v[0];
}

/* Online-softmax update for one query head over one tile of scores s[0..n) (s has
 * room for TILE floats): turns the scores into probabilities in place, updates the
 * running max *m and sum *l, returns the factor the accumulator must be scaled by. */
static inline float softmax_tile(float *restrict s, int n, float *restrict m, float *restrict l) {
    const int padded = (n + 7) & ~7;
    for (int t = n; t < padded; t++) s[t] = -INFINITY;
    v8f mx = load8(s);
    for (int t = 8; t < padded; t += 8) mx = max8(mx, load8(s + t));
    const float tile_max = hmax8(mx);
    const float new_max = tile_max > *m ? tile_max : *m;
    const v8f shift = splat8(new_max);
    v8f sum = {0};
    for (int t = 0; t < padded; t += 8) {
        const v8f p = exp8_nonpos(load8(s + t) - shift);
        store8(s + t, p);
        sum += p;
    }
    float alpha = 0.0f; /* nothing accumulated yet when *m is -inf */
    if (*m != -INFINITY) {
        alpha = exp8_nonpos(splat8(*m - new_max))[0];
    }
    *l = *l * alpha + hsum8(sum);
    *m = new_max;
    return alpha;
}

/* Asks for the next block's rows ahead of use, into L2 (a block's K and V rows of one
 * head are 8 KB at head_dim 64; L1 would evict the current block). Random block order
 * defeats the hardware prefetcher at every block start; measured on a 2-core EPYC with
 * a cache bigger than L3, this cuts decode attention time by about a fifth. */
static inline void prefetch_rows(const char *base, int rows, int64_t row_stride_bytes, int row_bytes) {
    for (int t = 0; t < rows; t++) {
        const char *row = base + (int64_t)t * row_stride_bytes;
        for (int off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + off, 0, 1);
    }
}

/* A cache's element i as an address, and elements i..i+7 as fp32, for a cache of
 * floats (kv16 = 0) or of halves (kv16 = 1). */
static inline __attribute__((always_inline)) const void *kv_at(const void *base, int64_t i, const int kv16) {
    return kv16 ? (const void *)((const uint16_t *)base + i) : (const void *)((const float *)base + i);
}

static inline __attribute__((always_inline)) v8f kv_load8(const void *base, int64_t i, const int kv16) {
    return kv16 ? load8_f16((const uint16_t *)base + i) : load8((const float *)base + i);
}

/* The row of `head_dim` elements at element i as floats: in place for an fp32 cache,
 * else widened into `buf` (head_dim floats of the thread's scratch). The scalar path
 * then sums the same floats with the same loop (so the same vectorisation and order)
 * whatever the cache's type. */
static inline __attribute__((always_inline)) const float *widen_row(const void *base, int64_t i, int head_dim,
                                                                    float *buf, const int kv16) {
    if (!kv16) return (const float *)base + i;
    const uint16_t *h = (const uint16_t *)base + i;
    for (int d = 0; d < head_dim; d++) buf[d] = f16_to_f32(h[d]);
    return buf;
}

/* Scores of one query head over a tile of n K rows: s[t] = scale * q . k[t]. Eight
 * positions at a time, each with its own accumulator (eight independent FMA chains,
 * the query chunk loaded once for the eight), summed across by sum8x8. */
static inline __attribute__((always_inline)) void qk_tile(const float *restrict q, const void *restrict k,
                                                          int64_t k_pos_stride, int n, const int head_dim,
                                                          float scale, float *restrict s, float *restrict buf,
                                                          const int kv16) {
    if (head_dim % 8 == 0 && head_dim / 8 <= MAX_VEC) {
        const int nv = head_dim / 8;
        int t = 0;
        for (; t + 8 <= n; t += 8) {
            const void *k0 = kv_at(k, (int64_t)t * k_pos_stride, kv16);
            v8f a[8];
            for (int j = 0; j < 8; j++) a[j] = (v8f){0};
            for (int c = 0; c < nv; c++) {
                const v8f qc = load8(q + 8 * c);
                for (int j = 0; j < 8; j++) a[j] += qc * kv_load8(k0, j * k_pos_stride + 8 * c, kv16);
            }
            store8(s + t, sum8x8(a) * splat8(scale));
        }
        for (; t < n; t++) {
            const void *krow = kv_at(k, (int64_t)t * k_pos_stride, kv16);
            v8f a = {0};
            for (int c = 0; c < nv; c++) a += load8(q + 8 * c) * kv_load8(krow, 8 * c, kv16);
            s[t] = pair_sum8(a) * scale;
        }
    } else {
        for (int t = 0; t < n; t++) {
            const float *krow = widen_row(k, (int64_t)t * k_pos_stride, head_dim, buf, kv16);
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < head_dim; d++) dot += q[d] * krow[d];
            s[t] = dot * scale;
        }
    }
}

/* acc = alpha * acc + sum_t p[t] * v[t] over a tile of n V rows. */
static inline __attribute__((always_inline)) void pv_tile(float *restrict acc, float alpha,
                                                          const float *restrict p, const void *restrict v,
                                                          int64_t v_pos_stride, int n, const int head_dim,
                                                          float *restrict buf, const int kv16) {
    if (head_dim % 8 == 0 && head_dim / 8 <= MAX_VEC) {
        const int nv = head_dim / 8;
        v8f av[MAX_VEC]; /* the accumulator row, in registers for 64/128 */
        for (int c = 0; c < nv; c++) av[c] = alpha * load8(acc + 8 * c);
        for (int t = 0; t < n; t++) {
            const void *vrow = kv_at(v, (int64_t)t * v_pos_stride, kv16);
            for (int c = 0; c < nv; c++) av[c] += p[t] * kv_load8(vrow, 8 * c, kv16);
        }
        for (int c = 0; c < nv; c++) store8(acc + 8 * c, av[c]);
    } else {
        for (int d = 0; d < head_dim; d++) acc[d] *= alpha;
        for (int t = 0; t < n; t++) {
            const float *vrow = widen_row(v, (int64_t)t * v_pos_stride, head_dim, buf, kv16);
#pragma omp simd
            for (int d = 0; d < head_dim; d++) acc[d] += p[t] * vrow[d];
        }
    }
}

struct item {
    const float *q; /* the first row's group's first query head; heads q_head_stride apart */
    int64_t q_seq_stride, q_head_stride;
    const void *k, *v; /* the caches at the item's kv head: floats or halves */
    int64_t k_block_stride, k_pos_stride, v_block_stride, v_pos_stride;
    const int32_t *table; /* the last row's, which covers every row's blocks */
    const int32_t *lengths; /* of each row, non-decreasing */
    int rows, block_size, group;
    float scale;
    int window;          /* > 0: attend to the last `window` positions only */
    float softcap;       /* > 0: scores become softcap * tanh(scores / softcap) */
    const float *sinks;  /* NULL, or this group's first head's sink logit */
    float *out; /* the first row's group's first output head */
    int64_t out_seq_stride, out_head_stride;
    float *acc;  /* rows * group * head_dim floats of scratch */
    float *wide; /* head_dim more: a float16 row widened (scalar path) */
};

/* One work item: a run of rows (query tokens whose K/V are the same cache positions,
 * see find_runs), one KV head and its group of query heads. Block by block (the next
 * one prefetched), tile by tile; each row's query heads one after the other over the
 * same K/V rows (from L1 after the first), so a run reads its K/V from memory once
 * whatever its number of rows. Each row sees the tiles it would see alone, cut at its
 * own length, so its result is bit-identical to a run of one. `head_dim` is a
 * compile-time constant in the specialised copies (rows unroll into registers). */
static inline __attribute__((always_inline)) void attend(const struct item *it, const int head_dim,
                                                         const int featured, const int kv16) {
    const int group = it->group, bs = it->block_size, rows = it->rows;
    const int heads = rows * group, length = it->lengths[rows - 1];
    const int window = featured ? it->window : 0;
    const int64_t elem = kv16 ? 2 : 4;
    float m[heads], l[heads], s[TILE];
    for (int g = 0; g < heads; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(it->acc, 0, sizeof(float) * (size_t)heads * (size_t)head_dim);
    const int num_blocks = (length + bs - 1) / bs;
    /* Lengths do not decrease along a run, so the first row's window starts first. */
    const int first_blk = window > 0 && it->lengths[0] > window ? (it->lengths[0] - window) / bs : 0;
    for (int blk = first_blk; blk < num_blocks; blk++) {
        if (blk + 1 < num_blocks) {
            const int64_t next = it->table[blk + 1];
            const int ahead = length - (blk + 1) * bs < bs ? length - (blk + 1) * bs : bs;
            prefetch_rows(kv_at(it->k, next * it->k_block_stride, kv16), ahead, it->k_pos_stride * elem,
                          head_dim * (int)elem);
            prefetch_rows(kv_at(it->v, next * it->v_block_stride, kv16), ahead, it->v_pos_stride * elem,
                          head_dim * (int)elem);
        }
        const int64_t block = it->table[blk];
        const int in_block = length - blk * bs < bs ? length - blk * bs : bs;
        for (int t0 = 0; t0 < in_block; t0 += TILE) {
            const void *kt = kv_at(it->k, block * it->k_block_stride + (int64_t)t0 * it->k_pos_stride, kv16);
            const void *vt = kv_at(it->v, block * it->v_block_stride + (int64_t)t0 * it->v_pos_stride, kv16);
            for (int r = 0; r < rows; r++) {
                const int row_in_block = it->lengths[r] - blk * bs < bs ? it->lengths[r] - blk * bs : bs;
                const int n = row_in_block - t0 < TILE ? row_in_block - t0 : TILE;
                /* Positions before the row's window are cut off the tile's front. */
                int skip = 0;
                if (window > 0) {
                    skip = it->lengths[r] - window - (blk * bs + t0);
                    if (skip < 0) skip = 0;
                }
                const int kept = n - skip;
                for (int g = 0; kept > 0 && g < group; g++) {
                    const int rg = r * group + g;
                    qk_tile(it->q + r * it->q_seq_stride + g * it->q_head_stride,
                            kv_at(kt, skip * it->k_pos_stride, kv16), it->k_pos_stride, kept, head_dim, it->scale,
                            s, it->wide, kv16);
                    if (featured && it->softcap > 0.0f) {
                        const float cap = it->softcap;
                        for (int t = 0; t < kept; t++) s[t] = cap * tanhf(s[t] / cap);
                    }
                    const float alpha = softmax_tile(s, kept, &m[rg], &l[rg]);
                    pv_tile(it->acc + (int64_t)rg * head_dim, alpha, s, kv_at(vt, skip * it->v_pos_stride, kv16),
                            it->v_pos_stride, kept, head_dim, it->wide, kv16);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        for (int g = 0; g < group; g++) {
            const int rg = r * group + g;
            float *o = it->out + r * it->out_seq_stride + g * it->out_head_stride;
            const float *a = it->acc + (int64_t)rg * head_dim;
            float inv = it->lengths[r] > 0 ? 1.0f / l[rg] : 0.0f;
            if (featured && it->sinks != NULL && it->lengths[r] > 0) {
                /* The sink's exp joins the denominator, both taken against the larger max. */
                const float sink = it->sinks[g], top = sink > m[rg] ? sink : m[rg];
                const float keep = expf(m[rg] - top);
                inv = keep / (l[rg] * keep + expf(sink - top));
            }
            for (int d = 0; d < head_dim; d++) o[d] = a[d] * inv;
        }
    }
}

/* A row's length and the block ids its window reads are inside the cache (it is never
 * read otherwise). */
static int row_ok(const int32_t *table, int length, int table_width, int block_size, int num_blocks,
                  int window) {
    if (length < 0 || length > (int64_t)table_width * block_size) return 0;
    const int first = window > 0 && length > window ? (length - window) / block_size : 0;
    for (int j = first; (int64_t)j * block_size < length; j++)
        if (table[j] < 0 || table[j] >= num_blocks) return 0;
    return 1;
}

/* Splits the rows into runs: consecutive rows whose lengths do not decrease and whose
 * block tables agree on every block the shorter one reads (a speculative proposal's
 * verify rows: one sequence at successive positions). starts[i] is the first row of
 * run i, starts[runs] = num_seqs; a bad row (bad[b] set) is a run of its own. */
static int find_runs(const int32_t *block_tables, int64_t table_stride, int table_width,
                     const int32_t *context_lens, int num_seqs, int block_size, int num_blocks,
                     int window, int *starts, char *bad) {
    int runs = 0;
    for (int b = 0; b < num_seqs; b++) {
        const int32_t *table = block_tables + (int64_t)b * table_stride;
        bad[b] = !row_ok(table, context_lens[b], table_width, block_size, num_blocks, window);
        int joins = b > 0 && !bad[b] && !bad[b - 1] && b - starts[runs - 1] < RUN_MAX &&
                    context_lens[b] >= context_lens[b - 1];
        if (joins) {
            const int used = (context_lens[b - 1] + block_size - 1) / block_size;
            joins = !memcmp(table - table_stride, table, sizeof(int32_t) * (size_t)used);
        }
        if (!joins) starts[runs++] = b;
    }
    starts[runs] = num_seqs;
    return runs;
}

/* One work item with `featured`, `kv16` and (for the plain kernel's common sizes)
 * `head_dim` as compile-time constants: each combination is its own specialised copy. */
static void attend_item(const struct item *it, int head_dim, int featured, int kv16) {
#define ATTEND_SIZES(KV16)                     \
    do {                                       \
        if (featured)                          \
            attend(it, head_dim, 1, KV16);     \
        else if (head_dim == 64)               \
            attend(it, 64, 0, KV16);           \
        else if (head_dim == 128)              \
            attend(it, 128, 0, KV16);          \
        else                                   \
            attend(it, head_dim, 0, KV16);     \
    } while (0)
    if (kv16)
        ATTEND_SIZES(1);
    else
        ATTEND_SIZES(0);
#undef ATTEND_SIZES
}

/* Returns 0 on success, 1 on bad sizes, 2 if out of memory, 3 if a length exceeds its
 * block table or a block id is outside [0, num_blocks) (such an item is not read).
 * Strides are in elements (of the cache's own type for the caches); the head_dim axis
 * of every tensor must be contiguous. window <= 0: no window; softcap <= 0: no
 * soft-cap; sinks NULL or [q_heads]. kv16: the caches hold float16, else float. */
int paged_decode_attention(const float *query, int64_t q_seq_stride, int64_t q_head_stride,
                           const void *k_cache, int64_t k_block_stride, int64_t k_pos_stride,
                           int64_t k_head_stride, const void *v_cache, int64_t v_block_stride,
                           int64_t v_pos_stride, int64_t v_head_stride, int num_blocks,
                           const int32_t *block_tables, int64_t table_stride, int table_width,
                           const int32_t *context_lens, float *out, int64_t out_seq_stride,
                           int64_t out_head_stride, int num_seqs, int q_heads, int kv_heads, int head_dim,
                           int block_size, float scale, int window, float softcap, const float *sinks,
                           int kv16, int num_threads) {
    const int featured = window > 0 || softcap > 0.0f || sinks != NULL;
    if (kv_heads <= 0 || q_heads % kv_heads != 0 || block_size <= 0 || head_dim <= 0) return 1;
    if (num_seqs <= 0) return 0;
    const int group = q_heads / kv_heads;
    int *starts = malloc(sizeof(int) * ((size_t)num_seqs + 1) + (size_t)num_seqs);
    if (!starts) return 2;
    char *bad = (char *)(starts + num_seqs + 1);
    const int runs = find_runs(block_tables, table_stride, table_width, context_lens, num_seqs,
                               block_size, num_blocks, featured ? window : 0, starts, bad);
    /* A run is cut into `pieces` when there are too few work items to keep every thread
     * busy (one sequence verifying a proposal): each piece reads the K/V once. */
    const int64_t target = 2 * (int64_t)(num_threads > 1 ? num_threads : 1);
    int pieces = (int)((target + (int64_t)runs * kv_heads - 1) / ((int64_t)runs * kv_heads));
    const int64_t items = (int64_t)runs * pieces * kv_heads;
    const size_t acc_floats = ((size_t)RUN_MAX * (size_t)group + 1) * (size_t)head_dim;
    int failed = 0;

#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && items > 1)
    {
        float *acc = malloc(sizeof(float) * acc_floats);
        if (acc == NULL) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            if (acc == NULL) continue;
            const int run = (int)(i / ((int64_t)pieces * kv_heads));
            const int piece = (int)(i / kv_heads % pieces), h = (int)(i % kv_heads);
            const int size = starts[run + 1] - starts[run];
            const int b = starts[run] + (int)((int64_t)size * piece / pieces);
            const int rows = starts[run] + (int)((int64_t)size * (piece + 1) / pieces) - b;
            if (rows <= 0) continue;
            if (bad[b]) { /* never read outside the cache: a bad length or block id fails the call */
#pragma omp atomic write
                failed = 3;
                continue;
            }
            const struct item it = {
                .q = query + (int64_t)b * q_seq_stride + (int64_t)h * group * q_head_stride,
                .q_seq_stride = q_seq_stride,
                .q_head_stride = q_head_stride,
                .k = kv16 ? (const void *)((const uint16_t *)k_cache + (int64_t)h * k_head_stride)
                          : (const void *)((const float *)k_cache + (int64_t)h * k_head_stride),
                .v = kv16 ? (const void *)((const uint16_t *)v_cache + (int64_t)h * v_head_stride)
                          : (const void *)((const float *)v_cache + (int64_t)h * v_head_stride),
                .k_block_stride = k_block_stride,
                .k_pos_stride = k_pos_stride,
                .v_block_stride = v_block_stride,
                .v_pos_stride = v_pos_stride,
                .table = block_tables + (int64_t)(b + rows - 1) * table_stride,
                .lengths = context_lens + b,
                .rows = rows,
                .block_size = block_size,
                .group = group,
                .scale = scale,
                .window = window,
                .softcap = softcap,
                .sinks = sinks != NULL ? sinks + (int64_t)h * group : NULL,
                .out = out + (int64_t)b * out_seq_stride + (int64_t)h * group * out_head_stride,
                .out_seq_stride = out_seq_stride,
                .out_head_stride = out_head_stride,
                .acc = acc,
                .wide = acc + (size_t)RUN_MAX * (size_t)group * (size_t)head_dim,
            };
            attend_item(&it, head_dim, featured, kv16);
        }
        free(acc);
    }
    free(starts);
    return failed;
}
