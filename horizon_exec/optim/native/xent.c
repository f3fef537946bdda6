/* The LM head's loss and its gradient in one native pass over each row of logits.
 *
 * Why: torch computes the loss of a chunk of logits (c x V, from the head's GEMM in the compute
 * dtype) as a pipeline of whole-tensor kernels: an fp32 upcast, logsumexp (its own max, x - max
 * and exp passes), subtract, exp, scale and a cast back, each a pass over c x V values in
 * memory. On the CPU backend that pipeline took as long as the head's three GEMMs (a 32k
 * vocabulary, 2 threads: ~0.4 s of a 0.93 s head). Here each row (V values, 64 KiB in bf16)
 * is read three times while it sits in L2 and written once in place, and nothing of c x V
 * is allocated: the fp32 copy and logsumexp's x - max are gone from the head's peak.
 *
 * Arithmetic: what head.py's torch path computes, in the same order: for each row, in fp32,
 * m = max, lse = m + log(sum exp(x - m)), loss = lse - x[label]; then the gradient
 * g = (exp(x - lse) - [j == label]) * scale, rounded to the logits' dtype (bf16: to nearest
 * even, as .to(bfloat16)). A row whose label is -100 has loss 0 and g = exp(x - lse) * 0, as
 * torch's masked multiply gives (0, or NaN where x - lse is NaN). exp is Cephes' expf
 * polynomial (rel. error ~1e-7, within a few fp32 ulps of torch's Sleef exp) written so the
 * compiler vectorizes it; x - m <= 0, so below -87.3 (exp < 2^-126, lost in any fp32 sum of
 * values >= 1) it is 0. The sums run in 16 fixed partial sums: the result does not depend on
 * the vector width or the thread count. NaN anywhere in a row makes its loss NaN.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define IGNORE_LABEL (-100)

/* GCC/Clang vector extensions: 16 fp32 lanes, lowered to whatever the build's ISA has
 * (AVX-512, 2 x AVX2, SSE, or scalar code), the same arithmetic in each. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

static inline v16f splat(float v) { return (v16f){0} + v; }
static inline v16f blend(v16i mask, v16f a, v16f b) { return (v16f)(((v16i)a & mask) | ((v16i)b & ~mask)); }
static inline v16f vmax(v16f a, v16f b) { return blend(a > b, a, b); }

static inline v16f load_bf16(const uint16_t* p) {
  v16h h;
  memcpy(&h, p, sizeof h);
  return (v16f)(__builtin_convertvector(h, v16u) << 16);
}

static inline void store_bf16(uint16_t* p, v16f f) {  /* nearest even; NaN -> 0x7FC0 */
  v16u u = (v16u)f;
  v16u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  v16i nan = (v16i)((u & 0x7fffffffu) > 0x7f800000u);
  r = (v16u)(((v16i)r & ~nan) | (0x7fc0 & nan));
  v16h h = __builtin_convertvector(r, v16h);
  memcpy(p, &h, sizeof h);
}

static inline v16f load_f32(const float* p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void store_f32(float* p, v16f v) { memcpy(p, &v, sizeof v); }

/* exp(x) for x <= 0 (Cephes expf: n = floor(x / ln 2 + 1/2), r = x - n ln 2 in two parts, a
 * degree-5 polynomial, times 2^n); 0 below -87.3; NaN in, NaN out. */
static inline v16f vexp(v16f x) {
  v16f xc = blend(x < -87.0f, splat(-87.0f), x);
  v16f t = xc * 1.44269504088896341f + 0.5f;
  v16f tr = __builtin_convertvector(__builtin_convertvector(t, v16i), v16f);  /* toward zero */
  v16f n = tr - blend(t < tr, splat(1.0f), splat(0.0f));                  /* floor */
  v16f r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v16f p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.0f;
  v16f y = p * (v16f)((__builtin_convertvector(n, v16i) + 127) << 23);
  y = blend(x < -87.3f, splat(0.0f), y);
  return blend(x != x, x, y);
}

static inline float scalar_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float scalar_f32(float v) { return v; }

/* One row: its loss (0 for an ignored label), and with write != 0 its gradient in place.
 * The last V % 16 values run through the same vector code, padded with -inf (which adds
 * nothing to the max or the sum). T: the element type; LOAD, STORE: its 16-wide load and
 * store, SCALAR: one value widened. */
#define XENT_ROW(NAME, T, LOAD, STORE, SCALAR)                                                \
  static float NAME(T* restrict x, int64_t V, int64_t label, float scale, int write) {        \
    int64_t full = V - V % LANES, rest = V - full;                                            \
    v16f mx = splat(-INFINITY), nans = splat(0.0f), sm = splat(0.0f), tv = splat(-INFINITY);     \
    for (int64_t j = 0; j < full; j += LANES) {                                               \
      v16f v = LOAD(x + j);                                                                     \
      mx = vmax(v, mx);                                                                       \
      nans = blend(v != v, v, nans);                                                          \
    }                                                                                         \
    for (int64_t j = 0; j < rest; j++) tv[j] = SCALAR(x[full + j]);                           \
    mx = vmax(tv, mx);                                                                        \
    nans = blend(tv != tv, tv, nans);                                                         \
    float m = mx[0];                                                                          \
    for (int k = 1; k < LANES; k++) m = mx[k] > m ? mx[k] : m;                                \
    for (int k = 0; k < LANES; k++) m = nans[k] != nans[k] ? nans[k] : m;                     \
    for (int64_t j = 0; j < full; j += LANES) sm += vexp(LOAD(x + j) - m);                    \
    sm += vexp(tv - m);                                                                       \
    float s = sm[0];                                                                          \
    for (int k = 1; k < LANES; k++) s += sm[k];                                               \
    float lse = m + logf(s);                                                                  \
    int valid = label != IGNORE_LABEL;                                                        \
    float xl = valid ? SCALAR(x[label]) : 0.0f;                                               \
    if (write) {                                                                              \
      v16f sc = splat(valid ? scale : 0.0f);                                                    \
      for (int64_t j = 0; j < full; j += LANES) STORE(x + j, vexp(LOAD(x + j) - lse) * sc);   \
      T out[LANES];                                                                           \
      STORE(out, vexp(tv - lse) * sc);                                                        \
      for (int64_t j = 0; j < rest; j++) x[full + j] = out[j];                                \
      if (valid) {                                                                            \
        STORE(out, (vexp(splat(xl) - lse) - 1.0f) * sc);                                      \
        x[label] = out[0];                                                                    \
      }                                                                                       \
    }                                                                                         \
    return valid ? lse - xl : 0.0f;                                                           \
  }

XENT_ROW(xent_row_bf16, uint16_t, load_bf16, store_bf16, scalar_bf16)
XENT_ROW(xent_row_f32, float, load_f32, store_f32, scalar_f32)

/* logits: rows x vocab, row stride ld elements, bf16 (is_bf16) or fp32; labels: int64 per row,
 * in [0, vocab) or -100; row_loss: fp32 per row. write_grad: overwrite the logits with
 * (softmax - onehot) * scale (the loss's gradient for a loss summed over rows and multiplied
 * by scale). Returns 0, or -1 on a bad argument (a label out of range included: nothing is
 * written then). */
int horizon_xent(void* logits, int32_t is_bf16, const int64_t* labels, int64_t rows, int64_t vocab, int64_t ld,
                 float scale, int32_t write_grad, float* row_loss, int32_t n_threads) {
  if (!logits || !labels || !row_loss || rows < 0 || vocab <= 0 || ld < vocab) return -1;
  for (int64_t i = 0; i < rows; i++)
    if (labels[i] != IGNORE_LABEL && (labels[i] < 0 || labels[i] >= vocab)) return -1;
  int nt = n_threads > 0 ? n_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && rows > 1)
  for (int64_t i = 0; i < rows; i++) {
    if (is_bf16)
      row_loss[i] = xent_row_bf16((uint16_t*)logits + i * ld, vocab, labels[i], scale, write_grad);
    else
      row_loss[i] = xent_row_f32((float*)logits + i * ld, vocab, labels[i], scale, write_grad);
  }
  return 0;
}
