/* One-pass AdamW for the host optimizer lane.
 *
 * Why: torch's fused CPU AdamW wants the gradient and the moments in the parameter's dtype and
 * writes nothing else, so with bf16 host gradients and a bf16 working copy the update took
 * three passes (widen the gradient, the kernel, refresh the copy). Each pass is memory-bound.
 * This kernel reads the fp32 master, the moments and the (bf16 or fp32) gradient once and
 * writes the master, the moments and the bf16 working copy once: 28 bytes per parameter with
 * fp32 moments, the same as torch's kernel on an fp32 gradient. The working copy is written
 * with non-temporal (streaming) stores where the build has AVX-512: a plain store first reads
 * each line it writes (read-for-ownership, 2 more bytes per parameter), and nothing reads the
 * copy again before the next step's weight load, long after the sweep over the model has
 * evicted it. On one core of a 2-core Zen 4 VM, with the store on huge pages (hugepages.py),
 * the schedule's optimizer ops ran at 0.92-1.10x torch's kernel on ready fp32 gradients,
 * median 0.99 (17 runs of benchmarks/exec_vs_autograd.py), against 0.79-0.94x, median 0.91,
 * with plain stores (11 runs); on 4 KiB pages streaming gained little (0.92-0.95x, 3 runs;
 * plain stores there: 0.85-0.96x, median 0.90, 8 runs). In cache, where the copy could have
 * been read back from L3, streaming costs ~3% (scratch microbenchmark). Software prefetch
 * measured no better: not used.
 *
 * Where the time goes: on one core the update is bound by the FP divider as much as by memory
 * (two divisions and a square root per element), so each extra vector op shows. Hence:
 * - clipping multiplies the gradient by the clip coefficient, as clip_grad_norm_ does before
 *   the optimizer step; torch's kernel, given grad_scale, divides instead (a third division);
 * - the working copy is rounded in sub-blocks of WC_SUB elements right after the update wrote
 *   them (still in L1), with the AVX512-BF16 conversion instruction where the build has it
 *   (one instruction per 32 values instead of ~10 integer ops per 16).
 *
 * Arithmetic: the order of torch's vectorized fused AdamW (ATen FusedAdamKernel.cpp, ADAMW
 * mode) on the clipped gradient, scalars rounded to float as it does. Built with
 * -ffp-contract=off, so the only fused multiply-adds are the explicit fmaf calls below, placed
 * where torch's build of its kernel has them. On fp32 states the result equals
 * torch._fused_adamw_ on the widened gradient times the coefficient bit for bit in its
 * vectorized body (its scalar tail, the last n % 16 elements, has no FMA: within 1 ulp there).
 * bf16 moments are read as fp32, updated in fp32 and stored rounded to nearest even; the
 * parameter update uses the unrounded fp32 values. The working copy is the master rounded to
 * nearest even, subnormals kept, as torch's .to(bfloat16); a NaN stays a NaN (its bits differ
 * from torch's, which differ between torch's own scalar and vector code).
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
  float grad_coef;      /* the gradient is multiplied by it: the clip coefficient, 1 unclipped */
  uint64_t sr_seed;     /* a bf16 master: 0 rounds to nearest even, else stochastically (below) */
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

/* The working copy is written WC_SUB elements at a time, right after the update wrote their
 * master: 1 KiB of fp32, read back from L1. (512 measured slower, 128 the same.) */
#define WC_SUB 256

/* 1: the working copy's vector stores are non-temporal (see the top); 0 (-DWC_STREAM=0): plain
 * stores, for A/B measurements. */
#ifndef WC_STREAM
#define WC_STREAM 1
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
/* out[i] = bf16_round(p[i]) with vcvtne2ps2bf16. That instruction flushes subnormal inputs to
 * zero, which .to(bfloat16) does not: a group of 32 holding one is rounded the scalar way.
 * Streaming stores need 64-byte alignment: elements before the first line boundary are
 * rounded the scalar way too (none when `out` is line-aligned, as the host store's are). The
 * caller fences each thread's streaming stores (STREAM_FENCE) before the kernel returns. */
static void wc_store(const float* restrict p, uint16_t* restrict out, int64_t k) {
  const __m512i expo = _mm512_set1_epi32(0x7f800000), mant = _mm512_set1_epi32(0x007fffff);
  int64_t i = 0;
#if WC_STREAM
  for (; i < k && ((uintptr_t)(out + i) & 63); i++) out[i] = bf16_round(p[i]);  /* to a line */
#endif
  for (; i + 32 <= k; i += 32) {
    const __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(p + i + 16);
    const __m512i ai = _mm512_castps_si512(a), bi = _mm512_castps_si512(b);
    const __mmask16 sub = (_mm512_testn_epi32_mask(ai, expo) & _mm512_test_epi32_mask(ai, mant)) |
                          (_mm512_testn_epi32_mask(bi, expo) & _mm512_test_epi32_mask(bi, mant));
    if (__builtin_expect(sub != 0, 0)) {
      for (int64_t t = i; t < i + 32; t++) out[t] = bf16_round(p[t]);
    } else {
#if WC_STREAM
      _mm512_stream_si512((void*)(out + i), (__m512i)_mm512_cvtne2ps_pbh(b, a));
#else
      _mm512_storeu_si512((void*)(out + i), (__m512i)_mm512_cvtne2ps_pbh(b, a));
#endif
    }
  }
  for (; i < k; i++) out[i] = bf16_round(p[i]);
}
#define STREAM_FENCE() do { if (WC_STREAM) _mm_sfence(); } while (0)
#else
#define STREAM_FENCE() do { } while (0)
static void wc_store(const float* restrict p, uint16_t* restrict out, int64_t k) {
  for (int64_t i = 0; i < k; i++) out[i] = bf16_round(p[i]);  /* the compiler vectorizes it */
}
#endif

#define F32_LOAD(x) (x)
#define F32_STORE(x) (x)

/* The update of one element, in torch's order: pi (the master, fp32), gi (the widened
 * gradient), mi and vi (the moments, fp32) are updated in place. Every span below runs this one
 * macro, so the three master layouts compute the same bits. */
#define ADAMW_ELEM(pi, gi, mi, vi)                                                               \
  do {                                                                                          \
    (pi) = (pi) * decay;                                                                        \
    /* exp_avg.lerp_(grad, 1 - beta1), torch's two-sided lerp */                                \
    (mi) = small ? fmaf(w, (gi) - (mi), (mi)) : fmaf(w1, (gi) - (mi), (gi));                    \
    (vi) = fmaf(c2 * (gi), (gi), (vi) * b2);                                                    \
    const float den_ = sqrtf(vi) / bc2s + eps;                                                  \
    (pi) = (pi) + (nss * (mi)) / den_;                                                          \
  } while (0)

#define ADAMW_CONSTS                                                                            \
  const float decay = h->decay, w = h->lerp_w, w1 = h->lerp_w - 1.0f, b2 = h->beta2;             \
  const float c2 = h->one_m_beta2, bc2s = h->bc2_sqrt, eps = h->eps, nss = h->neg_step_size;     \
  const float coef = h->grad_coef;                                                              \
  const int small = fabsf(w) < 0.5f

/* One span of k elements of an fp32 master: the whole update, element by element (the
 * compiler vectorizes it). GT/GLOAD: gradient type and widening; ST/SLOAD/SSTORE: moment type
 * and conversions; WC: 1 to write the working copy to `out` (bf16), a sub-block at a time. */
#define ADAMW_SPAN(NAME, GT, GLOAD, ST, SLOAD, SSTORE, WC)                                       \
  static void NAME(void* restrict p_, void* restrict out_, const GT* restrict g, ST* restrict m, \
                   ST* restrict v, int64_t k, int64_t i0, const horizon_adamw_hyper* h) {       \
    float* restrict p = p_;                                                                     \
    uint16_t* restrict out = out_;                                                              \
    (void)i0;                                                                                   \
    ADAMW_CONSTS;                                                                               \
    const int64_t sub = WC ? WC_SUB : k;                                                        \
    for (int64_t j = 0; j < k; j += sub) {                                                      \
      const int64_t end = k - j < sub ? k : j + sub;                                            \
      for (int64_t i = j; i < end; i++) {                                                       \
        const float gi = GLOAD(g[i]) * coef;                                                    \
        float pi = p[i], mi = SLOAD(m[i]), vi = SLOAD(v[i]);                                    \
        ADAMW_ELEM(pi, gi, mi, vi);                                                             \
        m[i] = SSTORE(mi);                                                                      \
        v[i] = SSTORE(vi);                                                                      \
        p[i] = pi;                                                                              \
      }                                                                                         \
      if (WC) wc_store(p + j, out + j, end - j);                                                \
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

/* ---- The split master ----------------------------------------------------------------------
 * The fp32 master x (bits u = H:L, two 16-bit halves) is kept as two 16-bit arrays:
 *   hi = the bf16 nearest x, ties away from zero: (u + 0x8000) >> 16, i.e. H, or H + 1 when
 *        L >= 0x8000 (bit patterns are sign-magnitude: H + 1 is one bf16 ulp further from 0);
 *   lo = L read as a signed 16-bit number.
 * Then (hi << 16) + lo == u exactly (mod 2^32): when L >= 0x8000, hi is H + 1 and lo is
 * L - 65536. hi is what the loads stream (the working copy), so the exact fp32 master costs 4
 * bytes with the working copy included, and the update moves 26 bytes per parameter (bf16
 * gradient, fp32 moments) instead of 28.
 * Why not round-half-even like .to(bfloat16): on an exact tie (L == 0x8000) it keeps H when H
 * is even, and then lo would have to be +32768, one value more than 16 bits hold (RNE needs
 * residuals -32768..32768: 65,537 values). So hi differs from .to(bfloat16) exactly on ties
 * with even H: 32,640 of the 2^32 patterns (one in 131,584), each by one bf16 ulp, away from 0.
 * NaN (exponent all ones, mantissa not 0): hi is the quiet NaN 0x7fc0 with x's sign (the
 * rounding could turn a NaN into an infinity); lo keeps L, so the joined value is still a NaN
 * (its payload may differ). Infinities, subnormals and -0 round trip exactly. */
static inline uint16_t split_hi(uint32_t u) {
  const uint16_t r = (uint16_t)((u + 0x8000u) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u) : r;
}

static inline float join_f32(uint16_t hi, int16_t lo) {
  const uint32_t u = ((uint32_t)hi << 16) + (uint32_t)(int32_t)lo;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void split_store(float f, uint16_t* hi, int16_t* lo) {
  uint32_t u;
  memcpy(&u, &f, 4);
  *hi = split_hi(u);
  *lo = (int16_t)(uint16_t)u;
}

/* One span of a split master: hi (bf16 bits) and lo (int16) read and written in place. */
#define ADAMW_SPLIT_SPAN(NAME, GT, GLOAD, ST, SLOAD, SSTORE)                                     \
  static void NAME(void* restrict hi_, void* restrict lo_, const GT* restrict g, ST* restrict m, \
                   ST* restrict v, int64_t k, int64_t i0, const horizon_adamw_hyper* h) {       \
    uint16_t* restrict hi = hi_;                                                                \
    int16_t* restrict lo = lo_;                                                                 \
    (void)i0;                                                                                   \
    ADAMW_CONSTS;                                                                               \
    for (int64_t i = 0; i < k; i++) {                                                           \
      const float gi = GLOAD(g[i]) * coef;                                                      \
      float pi = join_f32(hi[i], lo[i]), mi = SLOAD(m[i]), vi = SLOAD(v[i]);                    \
      ADAMW_ELEM(pi, gi, mi, vi);                                                               \
      m[i] = SSTORE(mi);                                                                        \
      v[i] = SSTORE(vi);                                                                        \
      split_store(pi, hi + i, lo + i);                                                          \
    }                                                                                           \
  }

ADAMW_SPLIT_SPAN(split_gf_sf, float, F32_LOAD, float, F32_LOAD, F32_STORE)
ADAMW_SPLIT_SPAN(split_gb_sf, uint16_t, bf16_load, float, F32_LOAD, F32_STORE)
ADAMW_SPLIT_SPAN(split_gf_sb, float, F32_LOAD, uint16_t, bf16_load, bf16_round)
ADAMW_SPLIT_SPAN(split_gb_sb, uint16_t, bf16_load, uint16_t, bf16_load, bf16_round)

/* ---- A bf16 master (no fp32 master: the seed code's policy) ----------------------------------
 * The weight is read as fp32, updated in fp32 and stored in bf16:
 * - to nearest even (sr_seed 0): an update smaller than half a bf16 ulp of the weight is lost;
 * - stochastically (sr_seed != 0): with the updated value's bits H:L, the stored value is H + 1
 *   (one ulp away from zero) with probability L / 65536, else H: r, 16 uniform bits, added to
 *   the low half carries into the high half exactly when r >= 65536 - L. Between the bf16
 *   values a = H and b = H + 1 the fp32 values are evenly spaced (b - a) / 65536 apart (also
 *   when b starts the next binade), so x = a + (L / 65536)(b - a) and the expected stored value
 *   is x exactly: no update is lost on average. r comes from a counter-based hash of the seed
 *   and the element's index (SplitMix64's finaliser), so a run is reproducible and a resumed one
 *   draws what the uninterrupted one would. NaN stays NaN (0x7fc0). */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint16_t bf16_round_sr(float f, uint32_t r16) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint16_t s = (uint16_t)((u + r16) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0u : s;
}

static inline uint32_t sr_bits(uint64_t seed, int64_t i) {
  return (uint32_t)(mix64(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull) >> 48);
}

#define ADAMW_BF16_SPAN(NAME, GT, GLOAD, ST, SLOAD, SSTORE)                                      \
  static void NAME(void* restrict p_, void* restrict unused, const GT* restrict g, ST* restrict m, \
                   ST* restrict v, int64_t k, int64_t i0, const horizon_adamw_hyper* h) {       \
    uint16_t* restrict p = p_;                                                                  \
    const uint64_t seed = h->sr_seed;                                                           \
    (void)unused;                                                                               \
    ADAMW_CONSTS;                                                                               \
    for (int64_t i = 0; i < k; i++) {                                                           \
      const float gi = GLOAD(g[i]) * coef;                                                      \
      float pi = bf16_load(p[i]), mi = SLOAD(m[i]), vi = SLOAD(v[i]);                           \
      ADAMW_ELEM(pi, gi, mi, vi);                                                               \
      m[i] = SSTORE(mi);                                                                        \
      v[i] = SSTORE(vi);                                                                        \
      p[i] = seed ? bf16_round_sr(pi, sr_bits(seed, i0 + i)) : bf16_round(pi);                  \
    }                                                                                           \
  }

ADAMW_BF16_SPAN(bf16_gf_sf, float, F32_LOAD, float, F32_LOAD, F32_STORE)
ADAMW_BF16_SPAN(bf16_gb_sf, uint16_t, bf16_load, float, F32_LOAD, F32_STORE)
ADAMW_BF16_SPAN(bf16_gf_sb, float, F32_LOAD, uint16_t, bf16_load, bf16_round)
ADAMW_BF16_SPAN(bf16_gb_sb, uint16_t, bf16_load, uint16_t, bf16_load, bf16_round)

typedef void (*span_fn)(void*, void*, const void*, void*, void*, int64_t, int64_t, const horizon_adamw_hyper*);

/* Elements per block: a thread's unit of work (8 KiB of each fp32 stream). */
#define BLOCK 2048

/* Runs `span` over n elements in blocks, on n_threads OpenMP threads. p and p2 advance by psz
 * and p2sz bytes per element (p2 may be NULL), g by gsz, m and v by ssz. */
static void run_blocks(span_fn span, void* p, size_t psz, void* p2, size_t p2sz, const void* g, size_t gsz,
                       void* m, void* v, size_t ssz, int64_t n, const horizon_adamw_hyper* h, int32_t n_threads) {
  const int64_t n_blocks = (n + BLOCK - 1) / BLOCK;
  const int nt = n_threads > 0 ? n_threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1 && n_blocks > 1)
  {
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < n_blocks; b++) {
      const int64_t i0 = b * BLOCK, k = n - i0 < BLOCK ? n - i0 : BLOCK;
      span((char*)p + i0 * psz, p2 ? (char*)p2 + i0 * p2sz : NULL, (const char*)g + i0 * gsz,
           (char*)m + i0 * ssz, (char*)v + i0 * ssz, k, i0, h);
    }
    STREAM_FENCE();  /* each thread's streaming stores are visible before the call returns */
  }
}

/* p: fp32 (n,); g: fp32 or bf16 (n,); m, v: fp32 or bf16 (n,); wc: bf16 (n,) or NULL.
 * n_threads: OpenMP threads (the calling lane's). Returns 0, or -1 on a bad argument. */
int horizon_adamw(float* p, const void* g, int32_t g_bf16, void* m, void* v, int32_t s_bf16,
                  uint16_t* wc, int64_t n, const horizon_adamw_hyper* h, int32_t n_threads) {
  static const span_fn spans[8] = {
      (span_fn)span_gf_sf_w0, (span_fn)span_gf_sf_w1, (span_fn)span_gb_sf_w0, (span_fn)span_gb_sf_w1,
      (span_fn)span_gf_sb_w0, (span_fn)span_gf_sb_w1, (span_fn)span_gb_sb_w0, (span_fn)span_gb_sb_w1};
  if (n < 0 || !p || !g || !m || !v || !h) return -1;
  run_blocks(spans[(s_bf16 ? 4 : 0) + (g_bf16 ? 2 : 0) + (wc ? 1 : 0)], p, 4, wc, 2, g, g_bf16 ? 2 : 4,
             m, v, s_bf16 ? 2 : 4, n, h, n_threads);
  return 0;
}

/* The split master (hi: bf16 bits, lo: int16; see above) updated in place; otherwise as
 * horizon_adamw. The updated hi is the working copy. */
int horizon_adamw_split(uint16_t* hi, int16_t* lo, const void* g, int32_t g_bf16, void* m, void* v,
                        int32_t s_bf16, int64_t n, const horizon_adamw_hyper* h, int32_t n_threads) {
  static const span_fn spans[4] = {(span_fn)split_gf_sf, (span_fn)split_gb_sf, (span_fn)split_gf_sb,
                                   (span_fn)split_gb_sb};
  if (n < 0 || !hi || !lo || !g || !m || !v || !h) return -1;
  run_blocks(spans[(s_bf16 ? 2 : 0) + (g_bf16 ? 1 : 0)], hi, 2, lo, 2, g, g_bf16 ? 2 : 4, m, v, s_bf16 ? 2 : 4,
             n, h, n_threads);
  return 0;
}

/* A bf16 master p (n,) updated in place (moments fp32 or bf16); otherwise as horizon_adamw. */
int horizon_adamw_bf16(uint16_t* p, const void* g, int32_t g_bf16, void* m, void* v, int32_t s_bf16, int64_t n,
                       const horizon_adamw_hyper* h, int32_t n_threads) {
  static const span_fn spans[4] = {(span_fn)bf16_gf_sf, (span_fn)bf16_gb_sf, (span_fn)bf16_gf_sb,
                                   (span_fn)bf16_gb_sb};
  if (n < 0 || !p || !g || !m || !v || !h) return -1;
  run_blocks(spans[(s_bf16 ? 2 : 0) + (g_bf16 ? 1 : 0)], p, 2, NULL, 0, g, g_bf16 ? 2 : 4, m, v, s_bf16 ? 2 : 4,
             n, h, n_threads);
  return 0;
}

/* x (n,) fp32 -> its split (hi, lo), and back. Bulk conversions for initialisation,
 * checkpoints and exports (the optimizer splits inline). */
int horizon_split(const float* x, uint16_t* hi, int16_t* lo, int64_t n, int32_t n_threads) {
  if (n < 0 || !x || !hi || !lo) return -1;
  const int nt = n_threads > 0 ? n_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n > (1 << 20))
  for (int64_t i = 0; i < n; i++) split_store(x[i], hi + i, lo + i);
  return 0;
}

/* out[i] = x[i] rounded stochastically to bf16 with the 16 bits r[i] (bf16_round_sr): the
 * kernel's rounding with its random bits given, for tests that enumerate all of them. */
int horizon_round_sr(const float* x, const uint16_t* r, uint16_t* out, int64_t n) {
  if (n < 0 || !x || !r || !out) return -1;
  for (int64_t i = 0; i < n; i++) out[i] = bf16_round_sr(x[i], r[i]);
  return 0;
}

/* out[i] = the 16 random bits the kernel draws for element i under `seed` (sr_bits). */
int horizon_sr_bits(uint64_t seed, uint16_t* out, int64_t n) {
  if (n < 0 || !out) return -1;
  for (int64_t i = 0; i < n; i++) out[i] = (uint16_t)sr_bits(seed, i);
  return 0;
}

int horizon_join(const uint16_t* hi, const int16_t* lo, float* x, int64_t n, int32_t n_threads) {
  if (n < 0 || !x || !hi || !lo) return -1;
  const int nt = n_threads > 0 ? n_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n > (1 << 20))
  for (int64_t i = 0; i < n; i++) x[i] = join_f32(hi[i], lo[i]);
  return 0;
}
