/* The C kernels' exported functions that another kernel calls (decode_stack.c calls
 * each layer's kernels in one library): declared once here, and included by the files
 * that define them so that the compiler checks the two agree. */
#ifndef CHATSITE_KERNELS_H
#define CHATSITE_KERNELS_H

#include <stdint.h>

int quant_linear_f32(const float *x, int64_t xs, const uint8_t *wq, int fmt, const float *bias,
                     float *y, int64_t ys, int64_t M, int64_t N, int64_t K, int silu_pairs,
                     int num_threads);
int linear_packed_f32(const float *x, int64_t xs, const float *wp, const float *bias, float *y,
                      int64_t ys, int64_t M, int64_t N, int64_t K, int num_threads);
int gate_up_silu_f32(const float *x, int64_t xs, const float *wp, float *y, int64_t ys, int64_t M,
                     int64_t N, int64_t K, int num_threads);
int rms_norm_f32(const float *x, int64_t xs, float *residual, int64_t rs, const float *weight,
                 float *out, int64_t os, int64_t M, int64_t N, float eps, int num_threads);
/* K/V caches of float (_f32) or of IEEE float16 held as uint16_t bits (_f16kv); every
 * other tensor is fp32, and strides count elements of their own tensor. */
int rotary_store_f32(float *qkv, int64_t qs, int64_t T, int hq, int hkv, int D,
                     const float *cos_sin, const int64_t *slots, float *k_cache, int64_t kb,
                     int64_t kp, int64_t kh, float *v_cache, int64_t vb, int64_t vp, int64_t vh,
                     int64_t num_blocks, int block_size, int num_threads);
int rotary_store_f16kv(float *qkv, int64_t qs, int64_t T, int hq, int hkv, int D,
                       const float *cos_sin, const int64_t *slots, uint16_t *k_cache, int64_t kb,
                       int64_t kp, int64_t kh, uint16_t *v_cache, int64_t vb, int64_t vp, int64_t vh,
                       int64_t num_blocks, int block_size, int num_threads);
int paged_decode_attention(const float *query, int64_t q_seq_stride, int64_t q_head_stride,
                           const void *k_cache, int64_t k_block_stride, int64_t k_pos_stride,
                           int64_t k_head_stride, const void *v_cache, int64_t v_block_stride,
                           int64_t v_pos_stride, int64_t v_head_stride, int num_blocks,
                           const int32_t *block_tables, int64_t table_stride, int table_width,
                           const int32_t *context_lens, float *out, int64_t out_seq_stride,
                           int64_t out_head_stride, int num_seqs, int q_heads, int kv_heads, int head_dim,
                           int block_size, float scale, int window, float softcap, const float *sinks,
                           int kv16, int num_threads);
int lora_shrink_f32(const float *x, int64_t xs, const float *a, int64_t S, int64_t R, int64_t K,
                    const int32_t *slots, int64_t T, float *y, int64_t ys, int num_threads);
int lora_expand_f32(const float *y, int64_t ys, const float *b, int64_t S, int64_t N, int64_t R,
                    const int32_t *slots, const float *scales, int64_t T, float *out, int64_t os,
                    int num_threads);
int lora_group_f32(const float *x, int64_t xs, int64_t K, const float *a, int64_t S, int64_t R, int n,
                   const float *const *b, const int64_t *widths, float *const *outs, int64_t os,
                   const int32_t *slots, const float *scales, int64_t T, float *y, int num_threads);
int lora_swiglu_f32(const float *x, int64_t xs, int64_t K, const float *a, int64_t S, int64_t R,
                    const float *const *b, int64_t inter, float *raw, float *out, int64_t os,
                    const int32_t *slots, const float *scales, int64_t T, float *y, int num_threads);

#endif
