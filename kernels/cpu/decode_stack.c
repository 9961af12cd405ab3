/* A Llama-style decoder stack's decode step on CPU, fp32, in one call: for every
 * layer the two RMSNorms (with the residual add), the q/k/v product, the rotary
 * embedding and K/V store, paged attention, the output product, SwiGLU and the down
 * product; then the final norm. The LM head and the sampler stay with the caller.
 *
 * Built by kernels/cpu/build.py together with quant_linear.c, linear.c, layer_ops.c
 * and paged_decode.c (one library), whose exported functions it calls in the order
 * the eager model calls them, on the same buffers, so the result is bit-identical to
 * the per-op path (gcc -O3 -fopenmp, never -ffast-math).
 *
 * Why: one stream's decode step runs each layer's eight kernels on a single row. Each
 * kernel takes microseconds, but reaching it from Python (module calls, argument
 * checks, tensor allocation, ctypes) costs about as much again, and for a 30-layer
 * model that glue was over half the step. Here it is one call per step.
 *
 * The KV pool is fp32 or float16 (pool->kv16): the K/V store and attention take the
 * matching entry points of layer_ops.c and paged_decode.c, as the per-op path does for
 * that pool, and everything else stays fp32.
 *
 * Every row is a decode token (one new token per sequence, its position's K/V stored
 * at slots[m]); the caller checks that and falls back to the per-op path otherwise.
 *
 * LoRA adapters (optional, lora.c's lora_group_f32 and lora_swiglu_f32): each product's
 * output gets its row's adapter product added right after the base product, as the
 * per-op path's inference/lora/layers.py does, one parallel region per projection group
 * (q/k/v, o, gate/up, down); the MLP then runs gate and up as a plain product (the
 * adapters join before the SiLU) and the SiLU in the gate/up group's region.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "vec8.h"

#define FMT_F32 (-1) /* fp32 panels of linear.c; 0.. are quant_linear.c's formats */

/* One product's weight: quantized panels (fmt >= 0) or fp32 panels (FMT_F32). */
typedef struct {
    const void *weight;
    int64_t fmt;
    const float *bias; /* or NULL (never for gate_up) */
} stack_linear;

typedef struct {
    const float *input_norm, *post_norm;
    stack_linear qkv, o, gate_up, down;
} stack_layer;

typedef struct {
    int64_t hidden, q_heads, kv_heads, head_dim, intermediate;
    float eps, scale;
} stack_shape;

/* One projection group's resident adapters: A [S, G R, K] (the group's A matrices one
 * under the other, each zero-padded to rank R), and B [S, N_i, R] per projection. */
typedef struct {
    const float *a;
    const float *b[3];
} stack_lora_group;

typedef struct {
    stack_lora_group qkv, o, gate_up, down;
} stack_lora_layer;

/* The step's adapters: row m runs slot row_slots[m] (-1: the base model alone). */
typedef struct {
    const stack_lora_layer *layers;
    const int32_t *row_slots;
    const float *scales; /* [S] */
    int64_t num_slots, rank;
} stack_lora;

/* The pool [num_blocks, 2, num_layers, block_size, kv_heads, head_dim] by its strides,
 * in elements: floats, or float16 bits when kv16 is 1. */
typedef struct {
    void *base;
    int64_t block, plane, layer, pos, head;
    int64_t num_blocks, block_size;
    int64_t kv16;
} stack_pool;

/* rotary_store of layer `l`'s K/V into the pool, whichever its element type. */
static int store_kv(const stack_pool *p, int64_t l, float *qkv, int64_t qkv_width, int64_t M, int hq,
                    int hkv, int D, const float *cos_sin, const int64_t *slots, int threads) {
    const int64_t k = l * p->layer, v = k + p->plane;
    if (p->kv16) {
        uint16_t *base = p->base;
        return rotary_store_f16kv(qkv, qkv_width, M, hq, hkv, D, cos_sin, slots, base + k, p->block, p->pos,
                                  p->head, base + v, p->block, p->pos, p->head, p->num_blocks,
                                  (int)p->block_size, threads);
    }
    float *base = p->base;
    return rotary_store_f32(qkv, qkv_width, M, hq, hkv, D, cos_sin, slots, base + k, p->block, p->pos, p->head,
                            base + v, p->block, p->pos, p->head, p->num_blocks, (int)p->block_size, threads);
}

/* Decode attention of layer `l`'s query heads (in qkv) over the pool into attn. */
static int attend_kv(const stack_pool *p, int64_t l, const float *qkv, int64_t qkv_width, int64_t D,
                     const int32_t *block_tables, int64_t table_stride, int64_t table_width,
                     const int32_t *context_lens, float *attn, int64_t attn_width, int64_t M, int hq, int hkv,
                     float scale, int threads) {
    const int64_t k = l * p->layer, v = k + p->plane;
    const size_t element = p->kv16 ? sizeof(uint16_t) : sizeof(float);
    const char *base = p->base;
    return paged_decode_attention(qkv, qkv_width, D, base + k * element, p->block, p->pos, p->head,
                                  base + v * element, p->block, p->pos, p->head, (int)p->num_blocks,
                                  block_tables, table_stride, (int)table_width, context_lens, attn, attn_width, D,
                                  (int)M, hq, hkv, (int)D, (int)p->block_size, scale, 0, 0.0f, NULL, (int)p->kv16,
                                  threads);
}

static int product(const stack_linear *w, const float *x, int64_t xs, float *y, int64_t ys,
                   int64_t M, int64_t N, int64_t K, int threads) {
    if (w->fmt == FMT_F32) return linear_packed_f32(x, xs, w->weight, w->bias, y, ys, M, N, K, threads);
    return quant_linear_f32(x, xs, w->weight, (int)w->fmt, w->bias, y, ys, M, N, K, 0, threads);
}

static int swiglu(const stack_linear *w, const float *x, int64_t xs, float *y, int64_t ys,
                  int64_t M, int64_t inter, int64_t K, int threads) {
    if (w->fmt == FMT_F32) return gate_up_silu_f32(x, xs, w->weight, y, ys, M, inter, K, threads);
    return quant_linear_f32(x, xs, w->weight, (int)w->fmt, NULL, y, ys, M, 2 * inter, K, 1, threads);
}

/* out_i [M, N_i] (row stride os, columns from offsets[i]) += scale B_i A_i x for the
 * group's n projections, each row with its own slot's adapter; y: M * n * R floats. */
static int lora_group(const stack_lora *lora, const stack_lora_group *g, int n, const float *x,
                      int64_t xs, int64_t K, float *out, int64_t os, const int64_t *offsets,
                      const int64_t *widths, int64_t M, float *y, int threads) {
    float *outs[3];
    for (int i = 0; i < n; i++) outs[i] = out + offsets[i];
    return lora_group_f32(x, xs, K, g->a, lora->num_slots, lora->rank, n, g->b, widths, outs, os,
                          lora->row_slots, lora->scales, M, y, threads);
}

/* The MLP with adapters: gate and up as plain products (interleaved 8 by 8 in raw),
 * then lora.c's lora_swiglu_f32 adds their adapters' products and writes
 * out = silu(gate) * up, `padded` wide (I rounded up to 8). */
static int lora_swiglu(const stack_linear *w, const stack_lora *lora, const stack_lora_group *g,
                       const float *x, int64_t xs, float *out, float *raw, float *y, int64_t padded,
                       int64_t M, int64_t inter, int64_t K, int threads) {
    const int64_t width = 2 * padded;
    int rc = w->fmt == FMT_F32
                 ? linear_packed_f32(x, xs, w->weight, NULL, raw, width, M, width, K, threads)
                 : quant_linear_f32(x, xs, w->weight, (int)w->fmt, NULL, raw, width, M, width, K, 0,
                                    threads);
    if (rc) return rc;
    return lora_swiglu_f32(x, xs, K, g->a, lora->num_slots, lora->rank, g->b, inter, raw, out, padded,
                           lora->row_slots, lora->scales, M, y, threads);
}

/* hidden [M, H]: the embeddings in, the final norm's output out. scratch: at least
 * M * (2 H + (Hq + 2 Hkv) D + Hq D + I) floats, and with adapters (lora not NULL)
 * M * (3 P + 3 R) more, P being I rounded up to 8 and R the adapters' rank. Returns 0, or the first failing
 * kernel's code (1 bad shape, 2 out of memory, 3 an index out of range). */
int decode_stack_f32(const stack_layer *layers, int64_t num_layers, const stack_shape *s,
                     const float *final_norm, float *hidden, int64_t M, const float *cos_sin,
                     const int64_t *slots, const stack_pool *pool, const int32_t *block_tables,
                     int64_t table_stride, int64_t table_width, const int32_t *context_lens,
                     const stack_lora *lora, float *scratch, int threads) {
    const int64_t H = s->hidden, D = s->head_dim, hq = s->q_heads, hkv = s->kv_heads;
    const int64_t qkv_width = (hq + 2 * hkv) * D, attn_width = hq * D, I = s->intermediate;
    if (M < 1 || num_layers < 0 || H < 1 || D < 2 || hkv < 1 || hq % hkv || I < 1) return 1;
    float *residual = scratch, *normed = residual + M * H, *qkv = normed + M * H;
    float *attn = qkv + M * qkv_width, *mlp = attn + M * attn_width;
    /* With adapters: the MLP's rows are `padded` wide, and the raw gate/up product and
     * the shrink's output follow. */
    const int64_t padded = (I + 7) / 8 * 8;
    float *raw = mlp + M * padded, *y = raw + 2 * M * padded;
    const int64_t qkv_offsets[3] = {0, hq * D, (hq + hkv) * D}, qkv_widths[3] = {hq * D, hkv * D, hkv * D};
    const int64_t no_offset[1] = {0}, hidden_width[1] = {H};
    if (lora && (lora->rank < 1 || lora->num_slots < 1)) return 1;
    int rc = 0;
    memcpy(residual, hidden, (size_t)(M * H) * sizeof(float));
    for (int64_t l = 0; l < num_layers && !rc; l++) {
        const stack_layer *w = &layers[l];
        /* The first layer normalises the embeddings; later ones add the previous
         * layer's MLP output into the running sum first. */
        rc = rms_norm_f32(l ? hidden : residual, H, l ? residual : NULL, H, w->input_norm, normed, H,
                          M, H, s->eps, threads);
        const stack_lora_layer *a = lora ? &lora->layers[l] : NULL;
        if (!rc) rc = product(&w->qkv, normed, H, qkv, qkv_width, M, qkv_width, H, threads);
        if (!rc && a)
            rc = lora_group(lora, &a->qkv, 3, normed, H, H, qkv, qkv_width, qkv_offsets, qkv_widths, M, y,
                            threads);
        if (!rc) rc = store_kv(pool, l, qkv, qkv_width, M, (int)hq, (int)hkv, (int)D, cos_sin, slots, threads);
        if (!rc)
            rc = attend_kv(pool, l, qkv, qkv_width, D, block_tables, table_stride, table_width, context_lens,
                           attn, attn_width, M, (int)hq, (int)hkv, s->scale, threads);
        if (!rc) rc = product(&w->o, attn, attn_width, hidden, H, M, H, attn_width, threads);
        if (!rc && a)
            rc = lora_group(lora, &a->o, 1, attn, attn_width, attn_width, hidden, H, no_offset, hidden_width,
                            M, y, threads);
        if (!rc) rc = rms_norm_f32(hidden, H, residual, H, w->post_norm, normed, H, M, H, s->eps, threads);
        const int64_t mlp_stride = a ? padded : I;
        if (!rc && a)
            rc = lora_swiglu(&w->gate_up, lora, &a->gate_up, normed, H, mlp, raw, y, padded, M, I, H,
                             threads);
        else if (!rc)
            rc = swiglu(&w->gate_up, normed, H, mlp, I, M, I, H, threads);
        if (!rc) rc = product(&w->down, mlp, mlp_stride, hidden, H, M, H, I, threads);
        if (!rc && a)
            rc = lora_group(lora, &a->down, 1, mlp, mlp_stride, I, hidden, H, no_offset, hidden_width, M, y,
                            threads);
    }
    if (!rc) {
        rc = rms_norm_f32(num_layers ? hidden : residual, H, num_layers ? residual : NULL, H, final_norm,
                          normed, H, M, H, s->eps, threads);
        memcpy(hidden, normed, (size_t)(M * H) * sizeof(float));
    }
    return rc;
}
