/* Dense linear algebra for the LAPACK custom calls JAX emits on the CPU (LU, Cholesky, QR and its
 * Q, symmetric / Hermitian eigendecomposition, SVD, general eigendecomposition, triangular
 * solves), through the LAPACK of the BLAS the runtime loaded (MKL's or OpenBLAS's: Fortran
 * entries with 32-bit integers, looked up by name at the call).
 *
 * The generated code passes row-major matrices (the logical layout); LAPACK reads column-major
 * ones, so each matrix is transposed into scratch memory of its chunk, computed on there, and its
 * results transposed back. The matrices of a batch are split over the RAL's thread pool. A LAPACK
 * argument error (info < 0) fails the call; a numerical one (info > 0: singular, not positive
 * definite, no convergence) is the routine's `info` result, as in JAX. */
#include "ral/ral.h"
#include "ral_internal.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int lapack_int;

typedef struct {
  int routine, type;
  char c[4]; /* the routine's character arguments, from `flags` */
  int64_t m, n, p, q;
  const char *a, *b; /* inputs, row-major */
  char *r[5];        /* results */
  void *fn;          /* the LAPACK / BLAS entry */
  char name[16];
} lapack_job;

static size_t elem_size(int type) { return (size_t)4 << (type == DISC_LAPACK_C128 ? 2 : type == DISC_LAPACK_F32 ? 0 : 1); }
static size_t real_size(int type) { return type == DISC_LAPACK_F64 || type == DISC_LAPACK_C128 ? 8 : 4; }
static int is_complex(int type) { return type == DISC_LAPACK_C64 || type == DISC_LAPACK_C128; }
static lapack_int ld(int64_t rows) { return rows > 1 ? (lapack_int)rows : 1; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* 1 and -1 in the job's type (a complex one's imaginary part 0), for alpha and beta */
static const double one_d[2] = {1, 0}, minus_one_d[2] = {-1, 0};
static const float one_f[2] = {1, 0}, minus_one_f[2] = {-1, 0};
static const void *one(int type) { return real_size(type) == 8 ? (const void *)one_d : one_f; }
static const void *minus_one(int type) { return real_size(type) == 8 ? (const void *)minus_one_d : minus_one_f; }

/* The BLAS / LAPACK entry of `routine` ("getrf") for `type`, its name ("sgetrf_") in `name`. */
static void *lapack_entry(ral_runtime *rt, int type, const char *routine, char name[16]) {
  snprintf(name, 16, "%c%s_", "sdcz"[type], routine);
  return runtime_blas_symbol(rt, name);
}

/* dst (cols x rows, row-major: src's column-major form) from src (rows x cols, row-major); also
 * back, with rows and cols swapped. In tiles of TILE x TILE, each written row by row (measured on
 * 1024 x 1024 floats: 1.9 ms, 3.5 ms with tiles of 32 read row by row), elements copied as the
 * integers of their size. */
#define TILE 8
#define TRANSPOSE_AS(T)                                                                                                        \
  for (int64_t i0 = 0; i0 < rows; i0 += TILE)                                                                                  \
    for (int64_t j0 = 0; j0 < cols; j0 += TILE) {                                                                              \
      int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;                             \
      for (int64_t j = j0; j < j1; j++)                                                                                        \
        for (int64_t i = i0; i < i1; i++) ((T *)dst)[j * rows + i] = ((const T *)src)[i * cols + j];                          \
    }
typedef struct {
  uint64_t lo, hi;
} bytes16;
static void transpose(char *dst, const char *src, int64_t rows, int64_t cols, size_t elem) {
  if (elem == 4) {
    TRANSPOSE_AS(uint32_t)
  } else if (elem == 8) {
    TRANSPOSE_AS(uint64_t)
  } else {
    TRANSPOSE_AS(bytes16)
  }
}

static void lapack_fail(const lapack_job *g, ral_status status, const char *what, int64_t value) {
  char message[200];
  snprintf(message, sizeof message, "lapack: %s %s%lld", g->name, what, (long long)value);
  ral_context *ctx = current_context();
  ral_context_fail(ctx, status, message);
  context_exit(ctx);
}

static void check_info(const lapack_job *g, lapack_int info) {
  if (info < 0) lapack_fail(g, RAL_ERR_INTERNAL, "rejected its argument number ", -info);
}

/* A workspace size from a LAPACK query (its first element, a real or complex number; a float one
 * rounded up, as LAPACK's own callers do: above 2^24 a float may fall short of the integer). */
static lapack_int query_size(const lapack_job *g, const void *work) {
  double v = real_size(g->type) == 8 ? *(const double *)work : ceil(*(const float *)work * (1 + FLT_EPSILON));
  if (!(v <= INT32_MAX)) {
    lapack_fail(g, RAL_ERR_OUT_OF_MEMORY, "needs a workspace past 32-bit integers; routine ", g->routine);
    return 0;
  }
  return v < 1 ? 1 : (lapack_int)v;
}

/* The chunk's scratch memory, zeroed: `count` parts of `bytes[i]` each, 64-byte aligned. */
static char *scratch(const size_t *bytes, char **parts, int count) {
  size_t total = 0;
  for (int i = 0; i < count; i++) total += (bytes[i] + 63) & ~(size_t)63;
  char *block = ral_alloc(current_context(), total);
  if (!block) return NULL;
  memset(block, 0, total);
  for (size_t i = 0, off = 0; i < (size_t)count; off += (bytes[i] + 63) & ~(size_t)63, i++) parts[i] = block + off;
  return block;
}

typedef void (*getrf_fn)(lapack_int *, lapack_int *, void *, lapack_int *, lapack_int *, lapack_int *);
typedef void (*potrf_fn)(const char *, lapack_int *, void *, lapack_int *, lapack_int *, size_t);
typedef void (*geqrf_fn)(lapack_int *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *, lapack_int *);
typedef void (*orgqr_fn)(lapack_int *, lapack_int *, lapack_int *, void *, lapack_int *, const void *, void *, lapack_int *,
                         lapack_int *);
typedef void (*trsm_fn)(const char *, const char *, const char *, const char *, lapack_int *, lapack_int *, const void *,
                        const void *, lapack_int *, void *, lapack_int *, size_t, size_t, size_t, size_t);
typedef void (*syevd_fn)(const char *, const char *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *,
                         lapack_int *, lapack_int *, lapack_int *, size_t, size_t);
typedef void (*heevd_fn)(const char *, const char *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *, void *,
                         lapack_int *, lapack_int *, lapack_int *, lapack_int *, size_t, size_t);
typedef void (*gesdd_fn)(const char *, lapack_int *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *, void *,
                         lapack_int *, void *, lapack_int *, lapack_int *, lapack_int *, size_t);
typedef void (*cgesdd_fn)(const char *, lapack_int *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *,
                          void *, lapack_int *, void *, lapack_int *, void *, lapack_int *, lapack_int *, size_t);
typedef void (*gesvd_fn)(const char *, const char *, lapack_int *, lapack_int *, void *, lapack_int *, void *, void *,
                         lapack_int *, void *, lapack_int *, void *, lapack_int *, lapack_int *, size_t, size_t);
typedef void (*cgesvd_fn)(const char *, const char *, lapack_int *, lapack_int *, void *, lapack_int *, void *, void *,
                          lapack_int *, void *, lapack_int *, void *, lapack_int *, void *, lapack_int *, size_t, size_t);
typedef void (*geev_fn)(const char *, const char *, lapack_int *, void *, lapack_int *, void *, void *, void *, lapack_int *,
                        void *, lapack_int *, void *, lapack_int *, lapack_int *, size_t, size_t);
typedef void (*cgeev_fn)(const char *, const char *, lapack_int *, void *, lapack_int *, void *, void *, lapack_int *, void *,
                         lapack_int *, void *, lapack_int *, void *, lapack_int *, size_t, size_t);

/* LU, Cholesky, QR, Q from QR, triangular solves: one matrix each in and out (and vectors). */
static void run_factor(const lapack_job *g, int64_t lo, int64_t hi) {
  size_t e = elem_size(g->type);
  lapack_int m = (lapack_int)g->m, n = (lapack_int)g->n, k = (lapack_int)g->p, lda = ld(g->m), info = 0, lwork = 0;
  int64_t mn = g->m * g->n, kk = min64(g->m, g->n);
  double query[2] = {0};
  if (g->routine == DISC_LAPACK_GEQRF || g->routine == DISC_LAPACK_ORGQR) {
    lwork = -1;
    if (g->routine == DISC_LAPACK_GEQRF)
      ((geqrf_fn)g->fn)(&m, &n, NULL, &lda, NULL, query, &lwork, &info);
    else
      ((orgqr_fn)g->fn)(&m, &n, &k, NULL, &lda, NULL, query, &lwork, &info);
    check_info(g, info);
    lwork = query_size(g, query);
  }
  int64_t order = g->routine == DISC_LAPACK_TRSM ? (g->c[0] == 'L' ? g->m : g->n) : 0; /* a's, for trsm */
  size_t bytes[3] = {(size_t)mn * e, (size_t)lwork * e, (size_t)(order * order) * e};
  char *part[3];
  char *block = scratch(bytes, part, 3);
  if (!block) return;
  const char *in = g->routine == DISC_LAPACK_TRSM ? g->b : g->a;
  for (int64_t i = lo; i < hi; i++) {
    char *x = part[0];
    transpose(x, in + (size_t)(i * mn) * e, g->m, g->n, e);
    info = 0;
    switch (g->routine) {
    case DISC_LAPACK_GETRF:
      ((getrf_fn)g->fn)(&m, &n, x, &lda, (lapack_int *)g->r[1] + i * kk, &info);
      ((lapack_int *)g->r[2])[i] = info > 0 ? info : 0;
      break;
    case DISC_LAPACK_POTRF:
      ((potrf_fn)g->fn)(&g->c[0], &n, x, &lda, &info, 1);
      ((lapack_int *)g->r[1])[i] = info > 0 ? info : 0;
      break;
    case DISC_LAPACK_GEQRF:
      ((geqrf_fn)g->fn)(&m, &n, x, &lda, g->r[1] + (size_t)(i * kk) * e, part[1], &lwork, &info);
      break;
    case DISC_LAPACK_ORGQR:
      ((orgqr_fn)g->fn)(&m, &n, &k, x, &lda, g->b + (size_t)(i * k) * e, part[1], &lwork, &info);
      break;
    default: { /* trsm: alpha 1 */
      lapack_int lds = ld(order);
      transpose(part[2], g->a + (size_t)(i * order * order) * e, order, order, e);
      ((trsm_fn)g->fn)(&g->c[0], &g->c[1], &g->c[2], &g->c[3], &m, &n, one(g->type), part[2], &lds, x, &lda, 1, 1, 1, 1);
    }
    }
    check_info(g, info);
    transpose(g->r[0] + (size_t)(i * mn) * e, x, g->n, g->m, e);
  }
  context_free(current_context(), block);
}

/* Symmetric / Hermitian eigendecomposition (divide and conquer): vectors, values, info. */
static void run_eigh(const lapack_job *g, int64_t lo, int64_t hi) {
  size_t e = elem_size(g->type), re = real_size(g->type);
  lapack_int n = (lapack_int)g->n, lda = ld(g->n), info = 0, lwork = -1, lrwork = -1, liwork = -1, iquery = 0;
  double query[2] = {0}, rquery[2] = {0};
  if (is_complex(g->type))
    ((heevd_fn)g->fn)(&g->c[0], &g->c[1], &n, NULL, &lda, NULL, query, &lwork, rquery, &lrwork, &iquery, &liwork, &info, 1, 1);
  else
    ((syevd_fn)g->fn)(&g->c[0], &g->c[1], &n, NULL, &lda, NULL, query, &lwork, &iquery, &liwork, &info, 1, 1);
  check_info(g, info);
  lwork = query_size(g, query);
  lrwork = is_complex(g->type) ? query_size(g, rquery) : 0;
  liwork = iquery > 1 ? iquery : 1;
  int64_t nn = g->n * g->n;
  size_t bytes[4] = {(size_t)nn * e, (size_t)lwork * e, (size_t)lrwork * re, (size_t)liwork * sizeof(lapack_int)};
  char *part[4];
  char *block = scratch(bytes, part, 4);
  if (!block) return;
  for (int64_t i = lo; i < hi; i++) {
    transpose(part[0], g->a + (size_t)(i * nn) * e, g->n, g->n, e);
    char *w = g->r[1] + (size_t)(i * g->n) * re;
    info = 0;
    if (is_complex(g->type))
      ((heevd_fn)g->fn)(&g->c[0], &g->c[1], &n, part[0], &lda, w, part[1], &lwork, part[2], &lrwork, (lapack_int *)part[3],
                        &liwork, &info, 1, 1);
    else
      ((syevd_fn)g->fn)(&g->c[0], &g->c[1], &n, part[0], &lda, w, part[1], &lwork, (lapack_int *)part[3], &liwork, &info, 1, 1);
    check_info(g, info);
    transpose(g->r[0] + (size_t)(i * nn) * e, part[0], g->n, g->n, e);
    ((lapack_int *)g->r[2])[i] = info;
  }
  context_free(current_context(), block);
}

/* SVD (gesdd: divide and conquer, gesvd: QR iteration), mode c[0] 'A' (u m x m, vt n x n), 'S'
 * (u m x k, vt k x n) or 'N' (no vectors: u m x p and vt q x n stay zero): the overwritten
 * matrix, singular values, u, vt, info. */
static void run_svd(const lapack_job *g, int64_t lo, int64_t hi) {
  size_t e = elem_size(g->type), re = real_size(g->type);
  int vectors = g->c[0] != 'N', sdd = g->routine == DISC_LAPACK_GESDD, cplx = is_complex(g->type);
  int64_t k = min64(g->m, g->n), big = g->m > g->n ? g->m : g->n, mn = g->m * g->n;
  int64_t ucols = vectors ? g->p : 0, vrows = vectors ? g->q : 0;
  lapack_int m = (lapack_int)g->m, n = (lapack_int)g->n, lda = ld(g->m), ldu = ld(vectors ? g->m : 1), ldvt = ld(vrows);
  lapack_int info = 0, lwork = -1;
  double query[2] = {0};
  int64_t lrwork = !cplx ? 0 : !sdd ? 5 * k : vectors ? k * (5 * k + 7 > 2 * big + 2 * k + 1 ? 5 * k + 7 : 2 * big + 2 * k + 1) : 7 * k;
  size_t bytes[6] = {(size_t)mn * e, (size_t)(g->m * ucols) * e, (size_t)(vrows * g->n) * e, 0, (size_t)(lrwork > 0 ? lrwork : 1) * re,
                     (size_t)(8 * k) * sizeof(lapack_int)};
  char *part[6];
  /* the query needs the rwork / iwork pointers of some calls: take the scratch first, the work part after */
  char *block = scratch(bytes, part, 6);
  if (!block) return;
  if (sdd && cplx)
    ((cgesdd_fn)g->fn)(&g->c[0], &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, query, &lwork, part[4], (lapack_int *)part[5],
                       &info, 1);
  else if (sdd)
    ((gesdd_fn)g->fn)(&g->c[0], &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, query, &lwork, (lapack_int *)part[5], &info, 1);
  else if (cplx)
    ((cgesvd_fn)g->fn)(&g->c[0], &g->c[0], &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, query, &lwork, part[4], &info, 1, 1);
  else
    ((gesvd_fn)g->fn)(&g->c[0], &g->c[0], &m, &n, NULL, &lda, NULL, NULL, &ldu, NULL, &ldvt, query, &lwork, &info, 1, 1);
  check_info(g, info);
  lwork = query_size(g, query);
  char *work = ral_alloc(current_context(), (size_t)lwork * e);
  if (!work) return;
  for (int64_t i = lo; i < hi; i++) {
    transpose(part[0], g->a + (size_t)(i * mn) * e, g->m, g->n, e);
    char *s = g->r[1] + (size_t)(i * k) * re;
    info = 0;
    if (sdd && cplx)
      ((cgesdd_fn)g->fn)(&g->c[0], &m, &n, part[0], &lda, s, part[1], &ldu, part[2], &ldvt, work, &lwork, part[4],
                         (lapack_int *)part[5], &info, 1);
    else if (sdd)
      ((gesdd_fn)g->fn)(&g->c[0], &m, &n, part[0], &lda, s, part[1], &ldu, part[2], &ldvt, work, &lwork, (lapack_int *)part[5],
                        &info, 1);
    else if (cplx)
      ((cgesvd_fn)g->fn)(&g->c[0], &g->c[0], &m, &n, part[0], &lda, s, part[1], &ldu, part[2], &ldvt, work, &lwork, part[4],
                         &info, 1, 1);
    else
      ((gesvd_fn)g->fn)(&g->c[0], &g->c[0], &m, &n, part[0], &lda, s, part[1], &ldu, part[2], &ldvt, work, &lwork, &info, 1, 1);
    check_info(g, info);
    transpose(g->r[0] + (size_t)(i * mn) * e, part[0], g->n, g->m, e);
    if (vectors) {
      transpose(g->r[2] + (size_t)(i * g->m * ucols) * e, part[1], ucols, g->m, e);
      transpose(g->r[3] + (size_t)(i * vrows * g->n) * e, part[2], g->n, vrows, e);
    } else {
      memset(g->r[2] + (size_t)(i * g->m * g->p) * e, 0, (size_t)(g->m * g->p) * e);
      memset(g->r[3] + (size_t)(i * g->q * g->n) * e, 0, (size_t)(g->q * g->n) * e);
    }
    ((lapack_int *)g->r[4])[i] = info;
  }
  context_free(current_context(), work);
  context_free(current_context(), block);
}

/* Real eigenvectors as LAPACK packs them (a complex pair's real and imaginary parts in two
 * columns) into complex ones, row-major. */
static void unpack_vectors(char *out, const char *v, const char *wi, int64_t n, size_t re) {
  for (int64_t j = 0; j < n; j++) {
    double im_j = re == 8 ? ((const double *)wi)[j] : ((const float *)wi)[j];
    int pair = im_j != 0 && j + 1 < n;
    for (int64_t r = 0; r < n; r++) {
      char *o = out + (size_t)(r * n + j) * 2 * re;
      memcpy(o, v + (size_t)(j * n + r) * re, re);
      if (pair) {
        memcpy(o + re, v + (size_t)((j + 1) * n + r) * re, re);
        char *o2 = out + (size_t)(r * n + j + 1) * 2 * re;
        memcpy(o2, o, 2 * re);
        if (re == 8)
          ((double *)o2)[1] = -((double *)o2)[1];
        else
          ((float *)o2)[1] = -((float *)o2)[1];
      } else {
        memset(o + re, 0, re);
      }
    }
    j += pair;
  }
}

/* General eigendecomposition: eigenvalues (real: real and imaginary parts), left and right
 * eigenvectors (c[0], c[1]: 'V' computed, 'N' zero), info. */
static void run_eig(const lapack_job *g, int64_t lo, int64_t hi) {
  size_t e = elem_size(g->type), re = real_size(g->type), ce = 2 * re;
  int cplx = is_complex(g->type), left = g->c[0] == 'V', right = g->c[1] == 'V';
  lapack_int n = (lapack_int)g->n, lda = ld(g->n), ldvl = ld(left ? g->n : 1), ldvr = ld(right ? g->n : 1), info = 0, lwork = -1;
  int64_t nn = g->n * g->n;
  double query[2] = {0};
  size_t bytes[4] = {(size_t)nn * e, (size_t)(left ? nn : 1) * e, (size_t)(right ? nn : 1) * e, (size_t)(2 * g->n + 1) * re};
  char *part[4];
  char *block = scratch(bytes, part, 4);
  if (!block) return;
  if (cplx)
    ((cgeev_fn)g->fn)(&g->c[0], &g->c[1], &n, NULL, &lda, NULL, NULL, &ldvl, NULL, &ldvr, query, &lwork, part[3], &info, 1, 1);
  else
    ((geev_fn)g->fn)(&g->c[0], &g->c[1], &n, NULL, &lda, NULL, NULL, NULL, &ldvl, NULL, &ldvr, query, &lwork, &info, 1, 1);
  check_info(g, info);
  lwork = query_size(g, query);
  char *work = ral_alloc(current_context(), (size_t)lwork * e);
  if (!work) return;
  char *const *vectors = g->r + (cplx ? 1 : 2);
  for (int64_t i = lo; i < hi; i++) {
    transpose(part[0], g->a + (size_t)(i * nn) * e, g->n, g->n, e);
    info = 0;
    if (cplx) {
      ((cgeev_fn)g->fn)(&g->c[0], &g->c[1], &n, part[0], &lda, g->r[0] + (size_t)(i * g->n) * ce, part[1], &ldvl, part[2], &ldvr,
                        work, &lwork, part[3], &info, 1, 1);
    } else {
      ((geev_fn)g->fn)(&g->c[0], &g->c[1], &n, part[0], &lda, g->r[0] + (size_t)(i * g->n) * re,
                       g->r[1] + (size_t)(i * g->n) * re, part[1], &ldvl, part[2], &ldvr, work, &lwork, &info, 1, 1);
    }
    check_info(g, info);
    for (int side = 0; side < 2; side++) {
      char *out = vectors[side] + (size_t)(i * nn) * ce;
      if (!(side ? right : left))
        memset(out, 0, (size_t)nn * ce);
      else if (cplx)
        transpose(out, part[1 + side], g->n, g->n, ce);
      else
        unpack_vectors(out, part[1 + side], g->r[1] + (size_t)(i * g->n) * re, g->n, re);
    }
    ((lapack_int *)vectors[2])[i] = info;
  }
  context_free(current_context(), work);
  context_free(current_context(), block);
}

/* LU of one large matrix on every thread: LAPACK's own blocked algorithm, its trailing updates
 * split over the pool. Per panel of LU_PANEL columns: the panel factored (LAPACK, one thread),
 * its row interchanges applied to the columns left of it; then, per block of the columns right
 * of it (in parallel), the interchanges, the triangular solve with the panel's unit lower
 * triangle and the GEMM update of the rows below. */
#define LU_PANEL 64
#define LU_MIN 256 /* below this order a matrix is one LAPACK call (the batch is what is split) */

typedef void (*laswp_fn)(lapack_int *, void *, lapack_int *, lapack_int *, lapack_int *, const lapack_int *, lapack_int *);
typedef void (*gemm_fn)(const char *, const char *, lapack_int *, lapack_int *, lapack_int *, const void *, const void *,
                        lapack_int *, const void *, lapack_int *, const void *, void *, lapack_int *, size_t, size_t);

typedef struct {
  const lapack_job *g;
  laswp_fn laswp;
  trsm_fn trsm;
  gemm_fn gemm;
  char *x;              /* the matrix, column-major, leading dim m */
  const lapack_int *piv; /* the panel's interchanges (1-based, global rows) */
  int64_t j, jb;        /* the panel's first column and width */
} lu_step;

static void lu_update(void *data, int64_t lo, int64_t hi) {
  const lu_step *s = data;
  size_t e = elem_size(s->g->type);
  int64_t m = s->g->m, first = s->j + s->jb + lo * LU_PANEL, last = s->j + s->jb + hi * LU_PANEL;
  if (last > s->g->n) last = s->g->n;
  lapack_int cols = (lapack_int)(last - first), lda = ld(m), k1 = (lapack_int)s->j + 1, k2 = (lapack_int)(s->j + s->jb), inc = 1;
  lapack_int jb = (lapack_int)s->jb, below = (lapack_int)(m - s->j - s->jb);
  char *right = s->x + (size_t)(first * m) * e;
  s->laswp(&cols, right, &lda, &k1, &k2, s->piv, &inc);
  s->trsm("L", "L", "N", "U", &jb, &cols, one(s->g->type), s->x + (size_t)(s->j * m + s->j) * e, &lda, right + (size_t)s->j * e,
          &lda, 1, 1, 1, 1);
  if (below > 0)
    s->gemm("N", "N", &below, &cols, &jb, minus_one(s->g->type), s->x + (size_t)(s->j * m + s->j + s->jb) * e, &lda,
            right + (size_t)s->j * e, &lda, one(s->g->type), right + (size_t)(s->j + s->jb) * e, &lda, 1, 1);
}

/* Matrix i of a GETRF job by the blocked algorithm (called outside any parallel loop). */
static void getrf_blocked(const lapack_job *g, int64_t i) {
  ral_context *ctx = current_context();
  char name[16];
  lu_step s = {.g = g, .laswp = (laswp_fn)lapack_entry(ctx->rt, g->type, "laswp", name),
               .trsm = (trsm_fn)lapack_entry(ctx->rt, g->type, "trsm", name),
               .gemm = (gemm_fn)lapack_entry(ctx->rt, g->type, "gemm", name)};
  if (!s.laswp || !s.trsm || !s.gemm) {
    lapack_fail(g, RAL_ERR_UNAVAILABLE, "needs laswp, trsm and gemm, which the BLAS lacks; routine ", g->routine);
    return;
  }
  size_t e = elem_size(g->type);
  int64_t m = g->m, n = g->n, kk = min64(m, n);
  char *x = ral_alloc(ctx, (size_t)(m * n) * e);
  if (!x) return;
  transpose(x, g->a + (size_t)(i * m * n) * e, m, n, e);
  s.x = x;
  lapack_int *piv = (lapack_int *)g->r[1] + i * kk, info = 0, lda = ld(m);
  for (int64_t j = 0; j < kk; j += LU_PANEL) {
    lapack_int rows = (lapack_int)(m - j), jb = (lapack_int)min64(LU_PANEL, kk - j), panel_info = 0;
    ((getrf_fn)g->fn)(&rows, &jb, x + (size_t)(j * m + j) * e, &lda, piv + j, &panel_info);
    check_info(g, panel_info);
    if (info == 0 && panel_info > 0) info = panel_info + (lapack_int)j;
    for (int64_t r = j; r < j + jb; r++) piv[r] += (lapack_int)j;
    lapack_int k1 = (lapack_int)j + 1, k2 = (lapack_int)j + jb, inc = 1, left = (lapack_int)j;
    if (left > 0) s.laswp(&left, x, &lda, &k1, &k2, piv, &inc);
    s.piv = piv, s.j = j, s.jb = jb;
    int64_t blocks = (n - j - jb + LU_PANEL - 1) / LU_PANEL;
    disc_ral_parallel_for(lu_update, &s, blocks, blocks * LU_PANEL * (m - j) * jb);
  }
  transpose(g->r[0] + (size_t)(i * m * n) * e, x, n, m, e);
  ((lapack_int *)g->r[2])[i] = info;
  context_free(ctx, x);
}

static void lapack_chunk(void *data, int64_t lo, int64_t hi) {
  const lapack_job *g = data;
  switch (g->routine) {
  case DISC_LAPACK_SYEVD:
    run_eigh(g, lo, hi);
    break;
  case DISC_LAPACK_GESDD:
  case DISC_LAPACK_GESVD:
    run_svd(g, lo, hi);
    break;
  case DISC_LAPACK_GEEV:
    run_eig(g, lo, hi);
    break;
  default:
    run_factor(g, lo, hi);
  }
}

void disc_ral_lapack(int64_t routine, int64_t type, int64_t flags, int64_t batch, int64_t m, int64_t n, int64_t p, int64_t q,
                     const void *a, const void *b, void *r0, void *r1, void *r2, void *r3, void *r4) {
  static const char *const names[][2] = {{"getrf", "getrf"}, {"potrf", "potrf"}, {"geqrf", "geqrf"}, {"orgqr", "ungqr"},
                                         {"trsm", "trsm"},   {"syevd", "heevd"}, {"gesdd", "gesdd"}, {"gesvd", "gesvd"},
                                         {"geev", "geev"}};
  lapack_job g = {.routine = (int)routine, .type = (int)type, .m = m, .n = n, .p = p, .q = q, .a = a, .b = b,
                  .r = {r0, r1, r2, r3, r4}};
  ral_context *ctx = current_context();
  if (routine < 0 || routine > DISC_LAPACK_GEEV || type < 0 || type > DISC_LAPACK_C128) {
    ral_context_fail(ctx, RAL_ERR_INVALID_ARGUMENT, "lapack: unknown routine or type");
    context_exit(ctx);
    return;
  }
  g.fn = lapack_entry(ctx->rt, (int)type, names[routine][is_complex((int)type)], g.name);
  for (int i = 0; i < 4; i++) g.c[i] = (char)((flags >> (8 * i)) & 0xff);
  const int64_t dims[] = {batch, m, n, p, q};
  for (int i = 0; i < 5; i++)
    if (dims[i] < 0 || dims[i] > INT32_MAX) {
      lapack_fail(&g, RAL_ERR_INVALID_ARGUMENT, "cannot take a size past 32-bit integers: ", dims[i]);
      return;
    }
  if (batch == 0) return;
  if (!g.fn) {
    lapack_fail(&g, RAL_ERR_UNAVAILABLE, "is not in the BLAS the runtime loaded (DISC_BLAS), routine ", routine);
    return;
  }
  if (routine == DISC_LAPACK_GETRF && batch < ral_runtime_num_threads(ctx->rt) && min64(m, n) >= LU_MIN) {
    for (int64_t i = 0; i < batch; i++) getrf_blocked(&g, i); /* each on every thread */
    return;
  }
  double work = (double)batch * (double)m * (double)n * (double)(m > n ? m : n);
  disc_ral_parallel_for(lapack_chunk, &g, batch, work > 1e18 ? (int64_t)1e18 : (int64_t)work);
}
