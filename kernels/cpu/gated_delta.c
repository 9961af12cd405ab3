/* The gated delta rule of a Gated DeltaNet layer over a packed step, fp32, in C.
 *
 * Built by kernels/cpu/build.py, called from kernels/cpu/gated_delta.py (GNU C, no torch
 * headers; gcc -O3 -fopenmp, never -ffast-math). The PyTorch reference is
 * kernels/gated_delta_reference.py (gated_delta_varlen).
 *
 * Sequence b owns rows [query_start_loc[b], query_start_loc[b+1]) of q, k [T, H, Dk],
 * v, out [T, H, Dv] and g, beta [T, H]; its state is pool[slots[b]] [H, Dk, Dv], read
 * (zeroed first where has_initial[b] is 0) and left holding the state after its last
 * row. q and k come L2-normalised, q scaled, both repeated to the value heads. Per
 * token, with S one head's [Dk, Dv] state:
 *
 *     S <- exp(g) S;   S <- S + k (beta (v - S^T k))^T;   out = S^T q
 *
 * Why one kernel for decode and prefill: each (sequence, head) pair is an independent
 * scan, run by one thread token after token with its state (Dk x Dv floats, 64 KiB at
 * 128 x 128) held in that core's cache for the whole span, read twice and written once
 * per token. A decode step is the same scan of one token. The inner loops run along Dv,
 * contiguous in S, v and out, and vectorise without reassociating any sum.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* One head of one sequence over `tokens` rows. `remembered` is Dv floats of scratch. */
static void scan_head(const float *restrict q, const float *restrict k, const float *restrict v,
                      const float *restrict g, const float *restrict beta, float *restrict out,
                      float *restrict state, int64_t tokens, int64_t qk_row, int64_t v_row,
                      int64_t gate_row, int dk, int dv, float *restrict remembered) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *qt = q + t * qk_row, *kt = k + t * qk_row, *vt = v + t * v_row;
        float *ot = out + t * v_row;
        const float decay = expf(g[t * gate_row]);
        const float rate = beta[t * gate_row];
        for (int j = 0; j < dv; j++) remembered[j] = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float ki = kt[i];
            const float *row = state + (int64_t)i * dv;
            for (int j = 0; j < dv; j++) remembered[j] += row[j] * ki;
        }
        /* The decayed state's prediction of v, and the correction written back. */
        for (int j = 0; j < dv; j++) remembered[j] = rate * (vt[j] - decay * remembered[j]);
        for (int j = 0; j < dv; j++) ot[j] = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float ki = kt[i], qi = qt[i];
            float *row = state + (int64_t)i * dv;
            for (int j = 0; j < dv; j++) {
                const float s = row[j] * decay + ki * remembered[j];
                row[j] = s;
                ot[j] += s * qi;
            }
        }
    }
}

/* Returns 0, 1 for bad sizes or spans, 3 for a slot outside the pool. */
int gated_delta_varlen_f32(const float *q, const float *k, const float *v, const float *g,
                           const float *beta, float *out, float *pool, int64_t num_slots,
                           const int64_t *slots, const uint8_t *has_initial,
                           const int32_t *query_start_loc, int num_seqs, int heads, int dk, int dv,
                           int num_threads) {
    if (num_seqs < 0 || heads < 1 || dk < 1 || dv < 1 || dv > 4096) return 1;
    for (int b = 0; b < num_seqs; b++) {
        if (slots[b] < 0 || slots[b] >= num_slots) return 3;
        if (query_start_loc[b + 1] < query_start_loc[b] || query_start_loc[b] < 0) return 1;
    }
    const int64_t qk_row = (int64_t)heads * dk, v_row = (int64_t)heads * dv;
    const int64_t head_state = (int64_t)dk * dv;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(num_threads)
    for (int b = 0; b < num_seqs; b++) {
        for (int h = 0; h < heads; h++) {
            const int64_t start = query_start_loc[b], tokens = query_start_loc[b + 1] - start;
            if (tokens == 0) continue;
            float *state = pool + (slots[b] * heads + h) * head_state;
            if (!has_initial[b]) memset(state, 0, (size_t)head_state * sizeof(float));
            float remembered[dv];
            scan_head(q + start * qk_row + (int64_t)h * dk, k + start * qk_row + (int64_t)h * dk,
                      v + start * v_row + (int64_t)h * dv, g + start * heads + h,
                      beta + start * heads + h, out + start * v_row + (int64_t)h * dv, state,
                      tokens, qk_row, v_row, heads, dk, dv, remembered);
        }
    }
    return 0;
}
