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
 * Every row is a decode token (one new token per sequence, its position's K/V stored
 * at slots[m]); the caller checks that and falls back to the per-op path otherwise.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

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

/* The pool [num_blocks, 2, num_layers, block_size, kv_heads, head_dim] by its strides. */
typedef struct {
    float *base;
    int64_t block, plane, layer, pos, head;
    int64_t num_blocks, block_size;
} stack_pool;

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

/* hidden [M, H]: the embeddings in, the final norm's output out. scratch: at least
 * M * (2 H + (Hq + 2 Hkv) D + Hq D + I) floats. Returns 0, or the first failing
 * kernel's code (1 bad shape, 2 out of memory, 3 an index out of range). */
int decode_stack_f32(const stack_layer *layers, int64_t num_layers, const stack_shape *s,
                     const float *final_norm, float *hidden, int64_t M, const float *cos_sin,
                     const int64_t *slots, const stack_pool *pool, const int32_t *block_tables,
                     int64_t table_stride, int64_t table_width, const int32_t *context_lens,
                     float *scratch, int threads) {
    const int64_t H = s->hidden, D = s->head_dim, hq = s->q_heads, hkv = s->kv_heads;
    const int64_t qkv_width = (hq + 2 * hkv) * D, attn_width = hq * D, I = s->intermediate;
    if (M < 1 || num_layers < 0 || H < 1 || D < 2 || hkv < 1 || hq % hkv || I < 1) return 1;
    float *residual = scratch, *normed = residual + M * H, *qkv = normed + M * H;
    float *attn = qkv + M * qkv_width, *mlp = attn + M * attn_width;
    int rc = 0;
    memcpy(residual, hidden, (size_t)(M * H) * sizeof(float));
    for (int64_t l = 0; l < num_layers && !rc; l++) {
        const stack_layer *w = &layers[l];
        float *k_cache = pool->base + l * pool->layer, *v_cache = k_cache + pool->plane;
        /* The first layer normalises the embeddings; later ones add the previous
         * layer's MLP output into the running sum first. */
        rc = rms_norm_f32(l ? hidden : residual, H, l ? residual : NULL, H, w->input_norm, normed, H,
                          M, H, s->eps, threads);
        if (!rc) rc = product(&w->qkv, normed, H, qkv, qkv_width, M, qkv_width, H, threads);
        if (!rc)
            rc = rotary_store_f32(qkv, qkv_width, M, (int)hq, (int)hkv, (int)D, cos_sin, slots, k_cache,
                                  pool->block, pool->pos, pool->head, v_cache, pool->block, pool->pos,
                                  pool->head, pool->num_blocks, (int)pool->block_size, threads);
        if (!rc)
            rc = paged_decode_attention_f32(
                qkv, qkv_width, D, k_cache, pool->block, pool->pos, pool->head, v_cache, pool->block,
                pool->pos, pool->head, (int)pool->num_blocks, block_tables, table_stride,
                (int)table_width, context_lens, attn, attn_width, D, (int)M, (int)hq, (int)hkv, (int)D,
                (int)pool->block_size, s->scale, threads);
        if (!rc) rc = product(&w->o, attn, attn_width, hidden, H, M, H, attn_width, threads);
        if (!rc) rc = rms_norm_f32(hidden, H, residual, H, w->post_norm, normed, H, M, H, s->eps, threads);
        if (!rc) rc = swiglu(&w->gate_up, normed, H, mlp, I, M, I, H, threads);
        if (!rc) rc = product(&w->down, mlp, I, hidden, H, M, H, I, threads);
    }
    if (!rc) {
        rc = rms_norm_f32(num_layers ? hidden : residual, H, num_layers ? residual : NULL, H, final_norm,
                          normed, H, M, H, s->eps, threads);
        memcpy(hidden, normed, (size_t)(M * H) * sizeof(float));
    }
    return rc;
}
