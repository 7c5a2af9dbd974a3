/* The attention of one decode step: one query per (row, head) over that row's cached keys.
 *
 *   out[b, h, :] = softmax_t(q[b, h, :] · k[b, g, t, :] · scale + bias[b, t]) · v[b, g, t, :]
 *   for t < T, with g = h / (H / KV) (grouped-query attention: H / KV heads share a KV head)
 *
 * q and out are [B, H, D] and contiguous; k, v and bias are read through their strides (in
 * floats), so the stream's KV buffers (time slots with spare room) are read in place. Float32
 * throughout; the softmax subtracts each row's maximum. scratch holds T floats.
 * Built by dapo_async/engines/cpu_attention.py (its docstring says how and why). */
#include <float.h>
#include <math.h>
#include <stdint.h>

static inline __attribute__((always_inline)) void one_head(
    const float *restrict q, const float *restrict k, const float *restrict v,
    const float *restrict bias, float *restrict out, float *restrict scratch, int64_t T,
    const int64_t D, int64_t k_t, int64_t v_t, float scale) {
    float qs[D], acc[D];
    for (int64_t d = 0; d < D; d++) qs[d] = q[d] * scale;
    float top = -FLT_MAX;
    for (int64_t t = 0; t < T; t++) {
        const float *kr = k + t * k_t;
        float s = 0.f;
        for (int64_t d = 0; d < D; d++) s += qs[d] * kr[d];
        if (bias) s += bias[t];
        scratch[t] = s;
        top = s > top ? s : top;
    }
    float total = 0.f;
    for (int64_t t = 0; t < T; t++) {
        float e = expf(scratch[t] - top);
        scratch[t] = e;
        total += e;
    }
    for (int64_t d = 0; d < D; d++) acc[d] = 0.f;
    for (int64_t t = 0; t < T; t++) {
        const float *vr = v + t * v_t;
        float p = scratch[t];
        for (int64_t d = 0; d < D; d++) acc[d] += p * vr[d];
    }
    float inv = 1.f / total;
    for (int64_t d = 0; d < D; d++) out[d] = acc[d] * inv;
}

/* the head size as a compile-time constant where it is a common one: the loops over it unroll
 * and vectorise */
/* The first slot of a row's bias that is not masked (-FLT_MAX, the stream's padding), 0 if
 * every slot is: a row that joined a running batch is left-padded to its length, and skipping
 * the padding is exact (each masked slot's exp underflows to 0 against any unmasked one). */
static inline int64_t first_unmasked(const float *bias, int64_t T) {
    for (int64_t t = 0; t < T; t++)
        if (bias[t] != -FLT_MAX) return t;
    return 0;
}

#define EVERY_HEAD(D_CONST)                                                                    \
    for (int64_t b = 0; b < B; b++) {                                                          \
        const float *bias_b0 = bias + b * bias_b;                                              \
        int64_t t0 = first_unmasked(bias_b0, T);                                               \
        for (int64_t h = 0; h < H; h++) {                                                      \
            int64_t g = h / (H / KV);                                                          \
            one_head(q + (b * H + h) * D, k + b * k_b + g * k_h + t0 * k_t,                    \
                     v + b * v_b + g * v_h + t0 * v_t, bias_b0 + t0, out + (b * H + h) * D,   \
                     scratch, T - t0, D_CONST, k_t, v_t, scale);                               \
        }                                                                                      \
    }

void decode_attention(const float *q, const float *k, const float *v, const float *bias,
                      float *out, float *scratch, int64_t B, int64_t H, int64_t KV, int64_t T,
                      int64_t D, int64_t k_b, int64_t k_h, int64_t k_t, int64_t v_b,
                      int64_t v_h, int64_t v_t, int64_t bias_b, float scale) {
    switch (D) {
    case 32: EVERY_HEAD(32) break;
    case 64: EVERY_HEAD(64) break;
    case 128: EVERY_HEAD(128) break;
    default: EVERY_HEAD(D) break;
    }
}

/* The same over a slot cache (``engines/slot_kv.py``): row b reads slot slot[b] of k and v
 * ([S, KV, T_max, D], read through their strides) over its own first len[b] time slots, so no
 * row attends over padding or another row's length. scratch holds max(len) floats. */
void decode_attention_slots(const float *q, const float *k, const float *v,
                            const int64_t *slot, const int64_t *len, float *out,
                            float *scratch, int64_t B, int64_t H, int64_t KV, int64_t D,
                            int64_t k_s, int64_t k_h, int64_t k_t, int64_t v_s, int64_t v_h,
                            int64_t v_t, float scale) {
#define SLOT_HEADS(D_CONST)                                                                    \
    for (int64_t b = 0; b < B; b++)                                                            \
        for (int64_t h = 0; h < H; h++) {                                                      \
            int64_t g = h / (H / KV);                                                          \
            one_head(q + (b * H + h) * D, k + slot[b] * k_s + g * k_h,                         \
                     v + slot[b] * v_s + g * v_h, 0, out + (b * H + h) * D, scratch, len[b],   \
                     D_CONST, k_t, v_t, scale);                                                \
        }
    switch (D) {
    case 32: SLOT_HEADS(32) break;
    case 64: SLOT_HEADS(64) break;
    case 128: SLOT_HEADS(128) break;
    default: SLOT_HEADS(D) break;
    }
}
