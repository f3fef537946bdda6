/* One-pass AdamW for the host optimizer lane.
 *
 * Why: torch's fused CPU AdamW wants the gradient and the moments in the parameter's dtype and
 * writes nothing else, so with bf16 host gradients and a bf16 working copy the update took
 * three passes (widen the gradient, the kernel, refresh the copy). Each pass is memory-bound.
 * This kernel reads the fp32 master, the moments and the (bf16 or fp32) gradient once and
 * writes the master, the moments and the bf16 working copy once: 28 bytes per parameter with
 * fp32 moments, the same as torch's kernel on an fp32 gradient, plus the read-for-ownership of
 * the working copy's lines. (Non-temporal stores for the copy, which avoid that, measured no
 * better on one core of a 2-core VM, and worse where the buffers partly fit in L3: not used.)
 *
 * Arithmetic: the order of torch's vectorized fused AdamW (ATen FusedAdamKernel.cpp, ADAMW
 * mode), scalars rounded to float as it does. Built with -ffp-contract=off, so the only
 * fused multiply-adds are the explicit fmaf calls below, placed where torch's build of its
 * kernel has them. On fp32 states the result equals torch._fused_adamw_ on the widened
 * gradient bit for bit in its vectorized body (its scalar tail, the last n % 16 elements,
 * has no FMA: within 1 ulp there). bf16 moments are read as fp32, updated in fp32 and stored
 * rounded to nearest even; the parameter update uses the unrounded fp32 values.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Step constants, computed by the caller in double and rounded to float, as torch does. */
typedef struct {
  float decay;          /* 1 - lr * weight_decay (decoupled decay, applied first) */
  float lerp_w;         /* 1 - beta1: exp_avg moves this far towards the gradient */
  float beta2;
  float one_m_beta2;    /* 1 - beta2 */
  float bc2_sqrt;       /* sqrt(1 - beta2^step) */
  float eps;
  float neg_step_size;  /* -lr / (1 - beta1^step) */
  float grad_scale;     /* the gradient is divided by it when `scaled` (global-norm clipping) */
  int32_t scaled;
} horizon_adamw_hyper;

static inline float bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even, NaN -> 0x7FC0: c10::BFloat16's scalar conversion (torch's vectorized
 * one writes NaN as 0xFFFF; both are NaN). */
static inline uint16_t bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0u : r;
}

#define F32_LOAD(x) (x)
#define F32_STORE(x) (x)

/* One span of k elements: the whole update, element by element (the compiler vectorizes it).
 * GT/GLOAD: gradient type and widening; ST/SLOAD/SSTORE: moment type and conversions; WC: 1
 * to write the working copy to `out` (bf16). */
#define ADAMW_SPAN(NAME, GT, GLOAD, ST, SLOAD, SSTORE, WC)                                       \
  static void NAME(float* restrict p, const GT* restrict g, ST* restrict m, ST* restrict v,      \
                   uint16_t* restrict out, int64_t k, const horizon_adamw_hyper* h) {            \
    const float decay = h->decay, w = h->lerp_w, w1 = h->lerp_w - 1.0f, b2 = h->beta2;           \
    const float c2 = h->one_m_beta2, bc2s = h->bc2_sqrt, eps = h->eps, nss = h->neg_step_size;   \
    const float scale = h->grad_scale;                                                          \
    const int scaled = h->scaled, small = fabsf(w) < 0.5f;                                      \
    for (int64_t i = 0; i < k; i++) {                                                           \
      float gi = GLOAD(g[i]);                                                                   \
      if (scaled) gi = gi / scale;                                                              \
      float pi = p[i] * decay;                                                                  \
      float mi = SLOAD(m[i]);                                                                   \
      /* exp_avg.lerp_(grad, 1 - beta1), torch's two-sided lerp */                              \
      mi = small ? fmaf(w, gi - mi, mi) : fmaf(w1, gi - mi, gi);                                \
      float vi = fmaf(c2 * gi, gi, SLOAD(v[i]) * b2);                                           \
      float den = sqrtf(vi) / bc2s + eps;                                                       \
      pi = pi + (nss * mi) / den;                                                               \
      m[i] = SSTORE(mi);                                                                        \
      v[i] = SSTORE(vi);                                                                        \
      p[i] = pi;                                                                                \
      if (WC) out[i] = bf16_round(pi);                                                          \
    }                                                                                           \
  }

ADAMW_SPAN(span_gf_sf_w0, float, F32_LOAD, float, F32_LOAD, F32_STORE, 0)
ADAMW_SPAN(span_gf_sf_w1, float, F32_LOAD, float, F32_LOAD, F32_STORE, 1)
ADAMW_SPAN(span_gb_sf_w0, uint16_t, bf16_load, float, F32_LOAD, F32_STORE, 0)
ADAMW_SPAN(span_gb_sf_w1, uint16_t, bf16_load, float, F32_LOAD, F32_STORE, 1)
ADAMW_SPAN(span_gf_sb_w0, float, F32_LOAD, uint16_t, bf16_load, bf16_round, 0)
ADAMW_SPAN(span_gf_sb_w1, float, F32_LOAD, uint16_t, bf16_load, bf16_round, 1)
ADAMW_SPAN(span_gb_sb_w0, uint16_t, bf16_load, uint16_t, bf16_load, bf16_round, 0)
ADAMW_SPAN(span_gb_sb_w1, uint16_t, bf16_load, uint16_t, bf16_load, bf16_round, 1)

typedef void (*span_fn)(float*, const void*, void*, void*, uint16_t*, int64_t, const horizon_adamw_hyper*);

/* Elements per block: a thread's unit of work (8 KiB of each fp32 stream). */
#define BLOCK 2048

/* p: fp32 (n,); g: fp32 or bf16 (n,); m, v: fp32 or bf16 (n,); wc: bf16 (n,) or NULL.
 * n_threads: OpenMP threads (the calling lane's). Returns 0, or -1 on a bad argument. */
int horizon_adamw(float* p, const void* g, int32_t g_bf16, void* m, void* v, int32_t s_bf16,
                  uint16_t* wc, int64_t n, const horizon_adamw_hyper* h, int32_t n_threads) {
  static const span_fn spans[8] = {
      (span_fn)span_gf_sf_w0, (span_fn)span_gf_sf_w1, (span_fn)span_gb_sf_w0, (span_fn)span_gb_sf_w1,
      (span_fn)span_gf_sb_w0, (span_fn)span_gf_sb_w1, (span_fn)span_gb_sb_w0, (span_fn)span_gb_sb_w1};
  if (n < 0 || !p || !g || !m || !v || !h) return -1;
  const span_fn span = spans[(s_bf16 ? 4 : 0) + (g_bf16 ? 2 : 0) + (wc ? 1 : 0)];
  const size_t gsz = g_bf16 ? 2 : 4, ssz = s_bf16 ? 2 : 4;
  const int64_t n_blocks = (n + BLOCK - 1) / BLOCK;
  const int nt = n_threads > 0 ? n_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n_blocks > 1)
  for (int64_t b = 0; b < n_blocks; b++) {
    const int64_t i0 = b * BLOCK, k = n - i0 < BLOCK ? n - i0 : BLOCK;
    const void* gb = (const char*)g + i0 * gsz;
    void* mb = (char*)m + i0 * ssz;
    void* vb = (char*)v + i0 * ssz;
    span(p + i0, gb, mb, vb, wc ? wc + i0 : NULL, k, h);
  }
  return 0;
}
