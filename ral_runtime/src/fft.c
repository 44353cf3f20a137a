/* FFTs for StableHLO's `fft` (FFT, IFFT, RFFT, IRFFT over the last 1-3 dims, any lengths).
 *
 * One-dimensional complex transforms in double precision (for float data too): a Stockham
 * autosort FFT over the length's factors (butterflies of 4, 2, 3 and 5, and a plain DFT for
 * other small primes), and for lengths with a prime factor above 32 Bluestein's algorithm (the
 * transform as a convolution of twice the length, done with a smooth-length FFT). Plans (factors
 * and twiddles) are built once per length and kept for the process: the lengths are attributes of
 * the program, so there are few. A transform over a dim that is not the last one gathers lines
 * into contiguous buffers, a few neighbouring ones at a time (they share cache lines). A real
 * transform of even length n is a complex one of n/2 points (the even samples as real parts, the
 * odd ones as imaginary parts) and a pass that separates the two; of odd length, the complex
 * transform of all n points. Lines are split over the RAL's thread pool. */
#include "ral/ral.h"
#include "ral_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  double re, im;
} cplx;

static inline cplx cmul(cplx a, cplx b) { return (cplx){a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
static inline cplx cadd(cplx a, cplx b) { return (cplx){a.re + b.re, a.im + b.im}; }
static inline cplx csub(cplx a, cplx b) { return (cplx){a.re - b.re, a.im - b.im}; }

#define MAX_FACTORS 64
#define MAX_DIRECT_PRIME 32 /* larger prime factors: Bluestein */

/* e^(-2 pi i k / n), the angle reduced exactly first */
static cplx unit_root(int64_t k, int64_t n) {
  k %= n;
  if (k < 0) k += n;
  double a = -2.0 * M_PI * (double)k / (double)n;
  return (cplx){cos(a), sin(a)};
}

typedef struct fft_plan {
  int64_t n;
  int num_factors;
  int64_t factors[MAX_FACTORS];
  cplx *twiddles; /* per stage (stage_twiddles), stage after stage */
  cplx *half;     /* e^(-pi i k / n), k < n: the real transform of 2n points through this plan (NULL until one asks) */
  /* Bluestein (when a factor is too large for the plain DFT) */
  struct fft_plan *conv; /* the plan of the convolution's length */
  cplx *chirp;           /* e^(-pi i j^2 / n), j < n */
  cplx *kernel;          /* the FFT of the conjugate chirp, wrapped to the convolution's length */
  struct fft_plan *next;
} fft_plan;

static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static fft_plan *plans;

static int factorize(int64_t n, int64_t *factors) {
  int count = 0;
  while (n % 4 == 0) factors[count++] = 4, n /= 4;
  if (n % 2 == 0) factors[count++] = 2, n /= 2;
  for (int64_t p = 3; p * p <= n; p += 2)
    while (n % p == 0) factors[count++] = p, n /= p;
  if (n > 1) factors[count++] = n;
  return count;
}

/* The smallest length >= n whose factors are 2, 3 and 5 */
static int64_t smooth_length(int64_t n) {
  int64_t best = INT64_MAX;
  for (int64_t a = 1; a < 2 * n; a *= 2)
    for (int64_t b = a; b < 2 * n; b *= 3)
      for (int64_t c = b; c < 2 * n; c *= 5)
        if (c >= n && c < best) best = c;
  return best;
}

static void transform(const fft_plan *plan, cplx *x, cplx *work);

/* The twiddles of a stage of radix r over `len`-point subproblems: (r - 1) per subproblem
 * position, then, for a radix without a butterfly of its own (a plain DFT), the r roots of r. */
static int plain_dft(int64_t r) { return r != 2 && r != 3 && r != 4 && r != 5; }
static int64_t stage_twiddles(int64_t r, int64_t len) { return (r - 1) * (len / r) + (plain_dft(r) ? r : 0); }

static void plan_free(fft_plan *p) {
  if (!p) return;
  free(p->twiddles);
  free(p->half);
  free(p->chirp);
  free(p->kernel);
  plan_free(p->conv);
  free(p);
}

static fft_plan *plan_build(int64_t n) {
  fft_plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  p->num_factors = factorize(n, p->factors);
  int64_t largest = p->num_factors ? p->factors[p->num_factors - 1] : 1;
  if (largest > MAX_DIRECT_PRIME) {
    int64_t m = smooth_length(2 * n - 1);
    if (m > INT64_MAX / (int64_t)sizeof(cplx)) { /* no such length fits in memory */
      plan_free(p);
      return NULL;
    }
    p->num_factors = 0;
    p->conv = plan_build(m);
    p->chirp = malloc(sizeof(cplx) * (size_t)n);
    p->kernel = calloc((size_t)m, sizeof(cplx));
    cplx *work = malloc(sizeof(cplx) * (size_t)m);
    if (!p->conv || !p->chirp || !p->kernel || !work) {
      free(work);
      plan_free(p);
      return NULL;
    }
    for (int64_t j = 0; j < n; j++) p->chirp[j] = unit_root((j * j) % (2 * n), 2 * n);
    for (int64_t j = 0; j < n; j++) {
      cplx c = {p->chirp[j].re, -p->chirp[j].im};
      p->kernel[j] = c;
      if (j) p->kernel[m - j] = c;
    }
    transform(p->conv, p->kernel, work);
    free(work);
    return p;
  }
  int64_t total = 0, len = n;
  for (int f = 0; f < p->num_factors; f++) {
    total += stage_twiddles(p->factors[f], len);
    len /= p->factors[f];
  }
  p->twiddles = malloc(sizeof(cplx) * (size_t)(total > 0 ? total : 1));
  if (!p->twiddles) {
    plan_free(p);
    return NULL;
  }
  cplx *w = p->twiddles;
  len = n;
  for (int f = 0; f < p->num_factors; f++) {
    int64_t r = p->factors[f], m = len / r;
    for (int64_t j = 0; j < m; j++)
      for (int64_t u = 1; u < r; u++) *w++ = unit_root(j * u, len);
    for (int64_t k = 0; plain_dft(r) && k < r; k++) *w++ = unit_root(k, r);
    len = m;
  }
  return p;
}

/* The plan of length n, built at its first use, with the twiddles of the real transform of 2n
 * points when `real` (NULL: out of memory). */
static const fft_plan *plan_for(int64_t n, int real) {
  pthread_mutex_lock(&plans_lock);
  fft_plan *p = plans;
  while (p && p->n != n) p = p->next;
  if (!p && (p = plan_build(n))) {
    p->next = plans;
    plans = p;
  }
  if (p && real && !p->half && (p->half = malloc(sizeof(cplx) * (size_t)(n > 0 ? n : 1))))
    for (int64_t k = 0; k < n; k++) p->half[k] = unit_root(k, 2 * n);
  pthread_mutex_unlock(&plans_lock);
  return p && (!real || p->half) ? p : NULL;
}

/* One Stockham stage of radix r over `len`-point subproblems at stride s: x -> y. */
static void stage(int64_t r, int64_t len, int64_t s, const cplx *x, cplx *y, const cplx *tw) {
  int64_t m = len / r;
  if (r == 2) {
    for (int64_t j = 0; j < m; j++) {
      cplx w = tw[j];
      for (int64_t q = 0; q < s; q++) {
        cplx a = x[q + s * j], b = x[q + s * (j + m)];
        y[q + s * 2 * j] = cadd(a, b);
        y[q + s * (2 * j + 1)] = cmul(csub(a, b), w);
      }
    }
  } else if (r == 4) {
    for (int64_t j = 0; j < m; j++) {
      cplx w1 = tw[3 * j], w2 = tw[3 * j + 1], w3 = tw[3 * j + 2];
      for (int64_t q = 0; q < s; q++) {
        cplx a0 = x[q + s * j], a1 = x[q + s * (j + m)], a2 = x[q + s * (j + 2 * m)], a3 = x[q + s * (j + 3 * m)];
        cplx t0 = cadd(a0, a2), t1 = csub(a0, a2), t2 = cadd(a1, a3), t3 = csub(a1, a3);
        cplx t3i = {t3.im, -t3.re}; /* -i t3 */
        y[q + s * 4 * j] = cadd(t0, t2);
        y[q + s * (4 * j + 1)] = cmul(cadd(t1, t3i), w1);
        y[q + s * (4 * j + 2)] = cmul(csub(t0, t2), w2);
        y[q + s * (4 * j + 3)] = cmul(csub(t1, t3i), w3);
      }
    }
  } else if (r == 3) {
    const double c = -0.5, d = -0.86602540378443864676; /* e^(-2 pi i / 3) */
    for (int64_t j = 0; j < m; j++) {
      cplx w1 = tw[2 * j], w2 = tw[2 * j + 1];
      for (int64_t q = 0; q < s; q++) {
        cplx a0 = x[q + s * j], a1 = x[q + s * (j + m)], a2 = x[q + s * (j + 2 * m)];
        cplx t = cadd(a1, a2), u = csub(a1, a2);
        cplx base = {a0.re + c * t.re, a0.im + c * t.im}, rot = {-d * u.im, d * u.re};
        y[q + s * 3 * j] = cadd(a0, t);
        y[q + s * (3 * j + 1)] = cmul(cadd(base, rot), w1);
        y[q + s * (3 * j + 2)] = cmul(csub(base, rot), w2);
      }
    }
  } else if (r == 5) {
    const double c1 = 0.30901699437494742410, c2 = -0.80901699437494742410; /* cos(2 pi / 5), cos(4 pi / 5) */
    const double s1 = 0.95105651629515357212, s2 = 0.58778525229247312917;  /* sin(2 pi / 5), sin(4 pi / 5) */
    for (int64_t j = 0; j < m; j++) {
      const cplx *w = tw + 4 * j;
      for (int64_t q = 0; q < s; q++) {
        cplx a0 = x[q + s * j], a1 = x[q + s * (j + m)], a2 = x[q + s * (j + 2 * m)], a3 = x[q + s * (j + 3 * m)],
             a4 = x[q + s * (j + 4 * m)];
        cplx t1 = cadd(a1, a4), t2 = cadd(a2, a3), t3 = csub(a1, a4), t4 = csub(a2, a3);
        cplx b1 = {a0.re + c1 * t1.re + c2 * t2.re, a0.im + c1 * t1.im + c2 * t2.im};
        cplx b2 = {a0.re + c2 * t1.re + c1 * t2.re, a0.im + c2 * t1.im + c1 * t2.im};
        cplx d1 = {s1 * t3.re + s2 * t4.re, s1 * t3.im + s2 * t4.im}, d2 = {s2 * t3.re - s1 * t4.re, s2 * t3.im - s1 * t4.im};
        cplx nd1 = {d1.im, -d1.re}, nd2 = {d2.im, -d2.re}; /* -i d */
        y[q + s * 5 * j] = cadd(a0, cadd(t1, t2));
        y[q + s * (5 * j + 1)] = cmul(cadd(b1, nd1), w[0]);
        y[q + s * (5 * j + 2)] = cmul(cadd(b2, nd2), w[1]);
        y[q + s * (5 * j + 3)] = cmul(csub(b2, nd2), w[2]);
        y[q + s * (5 * j + 4)] = cmul(csub(b1, nd1), w[3]);
      }
    }
  } else {
    /* a plain DFT of r points (other small primes), the roots after the stage's twiddles */
    const cplx *roots = tw + (r - 1) * m;
    for (int64_t j = 0; j < m; j++) {
      const cplx *w = tw + (r - 1) * j;
      for (int64_t q = 0; q < s; q++) {
        cplx a[MAX_DIRECT_PRIME + 1];
        for (int64_t k = 0; k < r; k++) a[k] = x[q + s * (j + k * m)];
        for (int64_t u = 0; u < r; u++) {
          cplx sum = a[0];
          for (int64_t k = 1; k < r; k++) sum = cadd(sum, cmul(a[k], roots[(k * u) % r]));
          y[q + s * (r * j + u)] = u ? cmul(sum, w[u - 1]) : sum;
        }
      }
    }
  }
}

/* x <- DFT(x) in place; `work`: n points (Bluestein: twice the convolution's length). */
static void transform(const fft_plan *plan, cplx *x, cplx *work) {
  int64_t n = plan->n;
  if (plan->conv) {
    int64_t m = plan->conv->n;
    cplx *a = work, *inner = work + m;
    for (int64_t j = 0; j < n; j++) a[j] = cmul(x[j], plan->chirp[j]);
    memset(a + n, 0, sizeof(cplx) * (size_t)(m - n));
    transform(plan->conv, a, inner);
    for (int64_t j = 0; j < m; j++) { /* the inverse by conjugation: conj(DFT(conj(A K))) / m */
      cplx v = cmul(a[j], plan->kernel[j]);
      a[j] = (cplx){v.re, -v.im};
    }
    transform(plan->conv, a, inner);
    for (int64_t k = 0; k < n; k++) x[k] = cmul((cplx){a[k].re / (double)m, -a[k].im / (double)m}, plan->chirp[k]);
    return;
  }
  cplx *from = x, *to = work;
  const cplx *tw = plan->twiddles;
  int64_t len = n, s = 1;
  for (int f = 0; f < plan->num_factors; f++) {
    int64_t r = plan->factors[f];
    stage(r, len, s, from, to, tw);
    tw += stage_twiddles(r, len);
    len /= r;
    s *= r;
    cplx *t = from;
    from = to;
    to = t;
  }
  if (from != x) memcpy(x, from, sizeof(cplx) * (size_t)n);
}

/* x <- the inverse DFT of x (scaled by 1 / n), by conjugation: conj(DFT(conj(x))) / n. */
static void inverse_transform(const fft_plan *plan, cplx *x, cplx *work) {
  int64_t n = plan->n;
  for (int64_t k = 0; k < n; k++) x[k].im = -x[k].im;
  transform(plan, x, work);
  for (int64_t k = 0; k < n; k++) x[k] = (cplx){x[k].re / (double)n, -x[k].im / (double)n};
}

/* The work buffer `transform` needs for a plan, in points. */
static int64_t work_points(const fft_plan *plan) { return plan->conv ? 2 * plan->conv->n + work_points(plan->conv) : plan->n; }

/* ------------------------------------------------------------------------------------------ */
/* lines of the data                                                                          */

enum { FFT = 0, IFFT = 1, RFFT = 2, IRFFT = 3 };

typedef struct {
  int kind, is_double;
  const fft_plan *plan;
  int64_t len;          /* the transform's length */
  int64_t in_len;       /* points of a line in the input (RFFT: n reals; IRFFT: n/2+1) */
  int64_t out_len;      /* points of a line in the output (RFFT: n/2+1; IRFFT: n reals) */
  int64_t inner;        /* stride between a line's points (elements of the dims after the axis) */
  const void *in;
  void *out;
} lines_job;

static cplx load(const lines_job *g, const void *base, int64_t i, int is_real) {
  if (g->is_double) {
    const double *d = base;
    return is_real ? (cplx){d[i], 0} : (cplx){d[2 * i], d[2 * i + 1]};
  }
  const float *f = base;
  return is_real ? (cplx){f[i], 0} : (cplx){f[2 * i], f[2 * i + 1]};
}

static void store(const lines_job *g, void *base, int64_t i, cplx v, int is_real) {
  if (g->is_double) {
    double *d = base;
    if (is_real)
      d[i] = v.re;
    else
      d[2 * i] = v.re, d[2 * i + 1] = v.im;
  } else {
    float *f = base;
    if (is_real)
      f[i] = (float)v.re;
    else
      f[2 * i] = (float)v.re, f[2 * i + 1] = (float)v.im;
  }
}

#define GROUP 8 /* neighbouring lines gathered together (one cache line of each point's neighbours) */

/* Lines [lo, hi): line l is the `inner`-strided line at outer index l / inner, inner index
 * l % inner; lines next to each other in the inner dims are gathered and scattered together. */
static void run_lines(void *data, int64_t lo, int64_t hi) {
  const lines_job *g = data;
  ral_context *ctx = current_context();
  int64_t n = g->len;
  cplx *lines = ral_alloc(ctx, sizeof(cplx) * (size_t)(GROUP * n + work_points(g->plan)));
  if (!lines) return;
  cplx *work = lines + GROUP * n;
  int real_in = g->kind == RFFT, real_out = g->kind == IRFFT, inverse = g->kind == IFFT || g->kind == IRFFT;
  for (int64_t l = lo; l < hi;) {
    int64_t outer = l / g->inner, first = l % g->inner;
    int64_t count = g->inner - first < GROUP ? g->inner - first : GROUP;
    if (count > hi - l) count = hi - l;
    int64_t in_base = outer * g->in_len * g->inner + first, out_base = outer * g->out_len * g->inner + first;
    int64_t loaded = g->kind == IRFFT ? (g->in_len < n ? g->in_len : n) : n;
    for (int64_t k = 0; k < loaded; k++)
      for (int64_t c = 0; c < count; c++) lines[c * n + k] = load(g, g->in, in_base + k * g->inner + c, real_in);
    for (int64_t c = 0; c < count; c++) {
      cplx *line = lines + c * n;
      for (int64_t k = loaded; k < n; k++) line[k] = (cplx){line[n - k].re, -line[n - k].im}; /* IRFFT: the Hermitian half */
      if (inverse)
        inverse_transform(g->plan, line, work);
      else
        transform(g->plan, line, work);
    }
    for (int64_t k = 0; k < g->out_len; k++)
      for (int64_t c = 0; c < count; c++) store(g, g->out, out_base + k * g->inner + c, lines[c * n + k], real_out);
    l += count;
  }
  context_free(ctx, lines);
}

/* Real transforms of even length n = 2m along the last dim (lines [lo, hi), contiguous), through
 * the plan of m points: z = x[0::2] + i x[1::2], Z its transform, and X_k = E_k + w^k O_k for
 * w = e^(-2 pi i / n), with E_k = (Z_k + conj Z_(m-k)) / 2 and O_k = -i (Z_k - conj Z_(m-k)) / 2
 * (the transforms of the even and odd samples); IRFFT the other way round (imaginary parts of
 * X_0 and X_m ignored, as numpy and XLA do). k and m - k are computed together, in place. */
static void run_real_lines(void *data, int64_t lo, int64_t hi) {
  const lines_job *g = data;
  ral_context *ctx = current_context();
  int64_t n = g->len, m = n / 2;
  cplx *line = ral_alloc(ctx, sizeof(cplx) * (size_t)(m + 1 + work_points(g->plan)));
  if (!line) return;
  cplx *work = line + m + 1;
  const cplx *w = g->plan->half;
  for (int64_t l = lo; l < hi; l++) {
    if (g->kind == RFFT) {
      for (int64_t j = 0; j < m; j++)
        line[j] = (cplx){load(g, g->in, l * n + 2 * j, 1).re, load(g, g->in, l * n + 2 * j + 1, 1).re};
      transform(g->plan, line, work);
      line[m] = line[0];
      for (int64_t k = 0; k <= m / 2; k++) {
        int64_t j = m - k;
        cplx zk = line[k], zj = line[j], wk = w[k], wj = j < m ? w[j] : (cplx){-1, 0};
        cplx e = {(zk.re + zj.re) / 2, (zk.im - zj.im) / 2}, o = {(zk.im + zj.im) / 2, -(zk.re - zj.re) / 2};
        line[k] = cadd(e, cmul(wk, o));
        line[j] = cadd((cplx){e.re, -e.im}, cmul(wj, (cplx){o.re, -o.im}));
      }
      for (int64_t k = 0; k <= m; k++) store(g, g->out, l * (m + 1) + k, line[k], 0);
    } else {
      for (int64_t k = 0; k <= m; k++) line[k] = load(g, g->in, l * (m + 1) + k, 0);
      line[0].im = line[m].im = 0;
      for (int64_t k = 0; k <= m / 2; k++) {
        int64_t j = m - k;
        cplx xk = line[k], xj = line[j], wk = w[k], wj = j < m ? w[j] : (cplx){-1, 0};
        cplx e = {(xk.re + xj.re) / 2, (xk.im - xj.im) / 2};
        cplx dk = {(xk.re - xj.re) / 2, (xk.im + xj.im) / 2}, dj = {(xj.re - xk.re) / 2, (xj.im + xk.im) / 2};
        cplx ok = cmul(dk, (cplx){wk.re, -wk.im}), oj = cmul(dj, (cplx){wj.re, -wj.im});
        line[k] = (cplx){e.re - ok.im, e.im + ok.re};  /* E + i O */
        line[j] = (cplx){e.re - oj.im, -e.im + oj.re};
      }
      inverse_transform(g->plan, line, work);
      for (int64_t j = 0; j < m; j++) {
        store(g, g->out, l * n + 2 * j, (cplx){line[j].re, 0}, 1);
        store(g, g->out, l * n + 2 * j + 1, (cplx){line[j].im, 0}, 1);
      }
    }
  }
  context_free(ctx, line);
}

/* One transform along one axis of [outer, len, inner] (input and output may be the same buffer
 * for complex transforms: each line is read whole before it is written). */
static void along_axis(int kind, int is_double, int64_t outer, int64_t len, int64_t inner, const void *in, void *out) {
  ral_context *ctx = current_context();
  int half = (kind == RFFT || kind == IRFFT) && len % 2 == 0 && len >= 2; /* lines along the last dim (inner is 1) */
  const fft_plan *plan = half ? plan_for(len / 2, 1) : plan_for(len, 0);
  if (!plan) {
    char message[96];
    snprintf(message, sizeof message, "fft: out of memory planning a transform of %lld points", (long long)len);
    ral_context_fail(ctx, RAL_ERR_OUT_OF_MEMORY, message);
    context_exit(ctx);
    return;
  }
  lines_job g = {kind, is_double, plan, len, kind == IRFFT ? len / 2 + 1 : len, kind == RFFT ? len / 2 + 1 : len, inner, in, out};
  int64_t count = outer * inner;
  disc_ral_parallel_for(half ? run_real_lines : run_lines, &g, count, count * len * 8);
}

void disc_ral_fft(int64_t kind, int64_t is_double, int64_t batch, int64_t rank, int64_t n0, int64_t n1, int64_t n2,
                  const void *in, void *out) {
  ral_context *ctx = current_context();
  int64_t n[3] = {n0, n1, n2};
  if (kind < FFT || kind > IRFFT || rank < 1 || rank > 3 || batch < 0 || n0 < 0 || n1 < 0 || n2 < 0) {
    ral_context_fail(ctx, RAL_ERR_INVALID_ARGUMENT, "fft: invalid kind, rank or sizes");
    context_exit(ctx);
    return;
  }
  int64_t points = batch, out_points = batch;
  for (int i = 0; i < rank; i++) {
    points *= i == rank - 1 && kind == IRFFT ? n[i] / 2 + 1 : n[i];
    out_points *= i == rank - 1 && kind == RFFT ? n[i] / 2 + 1 : n[i];
  }
  if (points == 0 || out_points == 0) return;
  /* the last dim: the real transform (or, complex, the first of the axes); then the others, in
   * place on the output (IRFFT: the others first, on a complex copy, then the last) */
  size_t complex_size = is_double ? 16 : 8;
  int64_t last = n[rank - 1], half = last / 2 + 1;
  if (kind == IRFFT) {
    void *tmp = ral_alloc(ctx, complex_size * (size_t)points);
    if (!tmp) return;
    memcpy(tmp, in, complex_size * (size_t)points);
    int64_t inner = half;
    for (int axis = rank - 2; axis >= 0; axis--) {
      along_axis(IFFT, (int)is_double, points / (inner * n[axis]), n[axis], inner, tmp, tmp);
      inner *= n[axis];
    }
    along_axis(IRFFT, (int)is_double, points / half, last, 1, tmp, out);
    context_free(ctx, tmp);
    return;
  }
  along_axis((int)kind, (int)is_double, points / last, last, 1, in, out);
  int64_t inner = kind == RFFT ? half : last;
  for (int axis = rank - 2; axis >= 0; axis--) {
    along_axis(kind == IFFT ? IFFT : FFT, (int)is_double, out_points / (inner * n[axis]), n[axis], inner, out, out);
    inner *= n[axis];
  }
}
