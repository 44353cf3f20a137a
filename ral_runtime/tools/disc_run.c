/* disc_run: runs a .disc artifact on cases stored as .npy files, with no Python in the process.
 *
 *   disc_run ARTIFACT [--blas PATH] [--threads N] CASE_DIR...
 *
 * Each CASE_DIR holds input0.npy, input1.npy, ... (one per input of the function) and
 * expected0.npy, ... (one per output). The artifact is loaded once; every case is run and each
 * output compared with its expected array: same shape and element type, floats within
 * rtol 1e-4 / atol 1e-5 (NaN equals NaN), integers and booleans exactly. One line per case;
 * the exit status is 0 when every case passed, 1 when one failed or could not run, 2 when the
 * arguments, the runtime or the artifact were wrong. The BLAS library (for GEMMs) comes from
 * --blas or $DISC_BLAS; without one, a GEMM fails with RAL_ERR_UNAVAILABLE. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ral/artifact.h"

#define RTOL 1e-4
#define ATOL 1e-5
#define MAX_RANK 64

/* ------------------------------------------------------------------------------------------ */
/* .npy files                                                                                 */

typedef struct {
  disc_dtype dtype;
  char descr[16];
  int rank;
  int64_t shape[MAX_RANK];
  int64_t numel;
  void *data; /* 64-byte aligned, owned */
  size_t bytes;
} npy_array;

static char npy_error[512];

static int npy_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int npy_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(npy_error, sizeof npy_error, fmt, ap);
  va_end(ap);
  return 0;
}

/* The element type of a numpy descr such as '<f4' or '|b1'. numpy has no bfloat16: arrays of
 * ml_dtypes.bfloat16 are saved as raw 2-byte items ('<V2'), read here as bf16. */
static disc_dtype descr_dtype(const char *descr) {
  static const struct {
    const char *code;
    disc_dtype dtype;
  } codes[] = {{"f2", DISC_F16},  {"f4", DISC_F32},  {"f8", DISC_F64},          {"b1", DISC_I1},
               {"i1", DISC_I8},   {"i2", DISC_I16},  {"i4", DISC_I32},          {"i8", DISC_I64},
               {"u1", DISC_UI8},  {"u2", DISC_UI16}, {"u4", DISC_UI32},         {"u8", DISC_UI64},
               {"c8", DISC_COMPLEX_F32}, {"c16", DISC_COMPLEX_F64}, {"V2", DISC_BF16}};
  char order = descr[0];
  if (order != '<' && order != '|' && order != '=' && order != '>') return DISC_DTYPE_INVALID;
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    if (strcmp(descr + 1, codes[i].code) != 0) continue;
    /* big-endian data only when byte order does not matter */
    if (order == '>' && disc_dtype_size(codes[i].dtype) > 1) return DISC_DTYPE_INVALID;
    return codes[i].dtype;
  }
  return DISC_DTYPE_INVALID;
}

/* A tiny reader for the header's Python dict literal:
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } */
typedef struct {
  const char *s;
  size_t n, pos;
} lit;

static void lit_space(lit *l) {
  while (l->pos < l->n && (l->s[l->pos] == ' ' || l->s[l->pos] == '\t' || l->s[l->pos] == '\n')) l->pos++;
}

static int lit_char(lit *l, char c) {
  lit_space(l);
  if (l->pos < l->n && l->s[l->pos] == c) {
    l->pos++;
    return 1;
  }
  return 0;
}

static int lit_string(lit *l, char *out, size_t out_size) {
  lit_space(l);
  if (l->pos >= l->n || (l->s[l->pos] != '\'' && l->s[l->pos] != '"')) return 0;
  char quote = l->s[l->pos++];
  size_t k = 0;
  while (l->pos < l->n && l->s[l->pos] != quote) {
    if (k + 1 >= out_size) return 0;
    out[k++] = l->s[l->pos++];
  }
  if (l->pos >= l->n) return 0;
  l->pos++;
  out[k] = '\0';
  return 1;
}

static int lit_word(lit *l, const char *word) {
  lit_space(l);
  size_t n = strlen(word);
  if (l->n - l->pos >= n && memcmp(l->s + l->pos, word, n) == 0) {
    l->pos += n;
    return 1;
  }
  return 0;
}

static int parse_npy_header(const char *text, size_t n, npy_array *a) {
  lit l = {text, n, 0};
  int have_descr = 0, have_order = 0, have_shape = 0;
  if (!lit_char(&l, '{')) return npy_fail("header is not a dict");
  while (!lit_char(&l, '}')) {
    char key[32];
    if (!lit_string(&l, key, sizeof key) || !lit_char(&l, ':')) return npy_fail("malformed header dict");
    if (strcmp(key, "descr") == 0) {
      if (!lit_string(&l, a->descr, sizeof a->descr))
        return npy_fail("descr is not a simple type string (structured dtypes are not supported)");
      a->dtype = descr_dtype(a->descr);
      if (a->dtype == DISC_DTYPE_INVALID) return npy_fail("unsupported dtype '%s'", a->descr);
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (lit_word(&l, "True")) return npy_fail("fortran_order is True: only C order is supported");
      if (!lit_word(&l, "False")) return npy_fail("fortran_order is neither True nor False");
      have_order = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (!lit_char(&l, '(')) return npy_fail("shape is not a tuple");
      a->rank = 0;
      while (!lit_char(&l, ')')) {
        lit_space(&l);
        int64_t v = 0;
        size_t start = l.pos;
        while (l.pos < l.n && l.s[l.pos] >= '0' && l.s[l.pos] <= '9') {
          if (v > (INT64_MAX - 9) / 10) return npy_fail("shape entry too large");
          v = v * 10 + (l.s[l.pos++] - '0');
        }
        if (l.pos == start) return npy_fail("malformed shape");
        lit_word(&l, "L"); /* Python 2 longs */
        if (a->rank == MAX_RANK) return npy_fail("rank above %d", MAX_RANK);
        a->shape[a->rank++] = v;
        if (!lit_char(&l, ',') && !(lit_space(&l), l.pos < l.n && l.s[l.pos] == ')'))
          return npy_fail("malformed shape");
      }
      have_shape = 1;
    } else {
      return npy_fail("unknown header key '%s'", key);
    }
    if (!lit_char(&l, ',') && !(lit_space(&l), l.pos < l.n && l.s[l.pos] == '}')) return npy_fail("malformed header dict");
  }
  if (!have_descr || !have_order || !have_shape) return npy_fail("header lacks descr, fortran_order or shape");
  return 1;
}

static void npy_free(npy_array *a) {
  free(a->data);
  a->data = NULL;
}

/* Reads a whole .npy file (format versions 1, 2 and 3). */
static int npy_load(const char *path, npy_array *a) {
  memset(a, 0, sizeof *a);
  FILE *f = fopen(path, "rb");
  if (!f) return npy_fail("cannot open: %s", strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return npy_fail("not a regular file");
  }
  size_t size = (size_t)st.st_size;
  unsigned char *file = malloc(size ? size : 1);
  int ok = file && fread(file, 1, size, f) == size;
  fclose(f);
  if (!ok) {
    free(file);
    return npy_fail("cannot read the file");
  }
  ok = 0;
  size_t header_len = 0, start = 0;
  if (size < 10 || memcmp(file, "\x93NUMPY", 6) != 0) {
    npy_fail("not a .npy file (bad magic)");
  } else if (file[6] == 1) {
    header_len = (size_t)file[8] | (size_t)file[9] << 8;
    start = 10;
    ok = 1;
  } else if (file[6] == 2 || file[6] == 3) {
    if (size < 12) {
      npy_fail("truncated header");
    } else {
      header_len = (size_t)file[8] | (size_t)file[9] << 8 | (size_t)file[10] << 16 | (size_t)file[11] << 24;
      start = 12;
      ok = 1;
    }
  } else {
    npy_fail("unsupported .npy format version %d.%d", file[6], file[7]);
  }
  if (ok && header_len > size - start) ok = npy_fail("truncated header");
  if (ok) ok = parse_npy_header((const char *)file + start, header_len, a);
  size_t elem = disc_dtype_size(a->dtype), data_at = start + header_len;
  if (ok) {
    a->numel = 1;
    for (int d = 0; d < a->rank && ok; d++) {
      if (a->shape[d] != 0 && a->numel > INT64_MAX / a->shape[d] / (int64_t)elem) ok = npy_fail("shape too large");
      a->numel *= a->shape[d];
    }
  }
  if (ok) {
    a->bytes = (size_t)a->numel * elem;
    if (a->bytes != size - data_at)
      ok = npy_fail("expected %zu bytes of data for shape and dtype '%s', the file has %zu", a->bytes, a->descr,
                    size - data_at);
  }
  if (ok) {
    a->data = aligned_alloc(64, (a->bytes + 63) / 64 * 64 + 64);
    if (!a->data)
      ok = npy_fail("out of memory");
    else
      memcpy(a->data, file + data_at, a->bytes);
  }
  free(file);
  return ok;
}

/* ------------------------------------------------------------------------------------------ */
/* comparison                                                                                 */

static float half_to_float(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  float v;
  if (exp == 0)
    v = ldexpf((float)frac, -24); /* subnormal */
  else if (exp == 31)
    v = frac ? NAN : INFINITY;
  else
    v = ldexpf((float)(frac | 0x400), exp - 25);
  return sign ? -v : v;
}

static double element(const void *data, disc_dtype dtype, int64_t i, int part) {
  const char *p = (const char *)data;
  switch (dtype) {
    case DISC_F16: return half_to_float(((const uint16_t *)p)[i]);
    case DISC_BF16: {
      uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
      float v;
      memcpy(&v, &bits, sizeof v);
      return v;
    }
    case DISC_F32: return ((const float *)p)[i];
    case DISC_F64: return ((const double *)p)[i];
    case DISC_COMPLEX_F32: return ((const float *)p)[2 * i + part];
    case DISC_COMPLEX_F64: return ((const double *)p)[2 * i + part];
    default: return 0;
  }
}

static int is_float(disc_dtype d) {
  return d == DISC_F16 || d == DISC_BF16 || d == DISC_F32 || d == DISC_F64 || d == DISC_COMPLEX_F32 ||
         d == DISC_COMPLEX_F64;
}

static int close_enough(double got, double want) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (isinf(got) || isinf(want)) return got == want;
  return fabs(got - want) <= ATOL + RTOL * fabs(want);
}

static void format_index(char *buf, size_t n, int64_t flat, int rank, const int64_t *shape) {
  int64_t idx[MAX_RANK];
  for (int d = rank - 1; d >= 0; d--) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < rank && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)idx[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

static void format_shape(char *buf, size_t n, int rank, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < rank && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

/* The raw integer value of element i, for messages. */
static long long int_element(const void *data, disc_dtype dtype, int64_t i) {
  switch (dtype) {
    case DISC_I1: return ((const uint8_t *)data)[i] != 0;
    case DISC_I8: return ((const int8_t *)data)[i];
    case DISC_I16: return ((const int16_t *)data)[i];
    case DISC_I32: return ((const int32_t *)data)[i];
    case DISC_I64: return (long long)((const int64_t *)data)[i];
    case DISC_UI8: return ((const uint8_t *)data)[i];
    case DISC_UI16: return ((const uint16_t *)data)[i];
    case DISC_UI32: return ((const uint32_t *)data)[i];
    case DISC_UI64: return (long long)((const uint64_t *)data)[i];
    default: return 0;
  }
}

/* Compares output k with its expected array; writes what differs into msg and returns 0. */
static int compare(int k, const disc_tensor_spec *spec, const void *data, int rank, const int64_t *shape,
                   const npy_array *want, char *msg, size_t n) {
  char got_shape[256], want_shape[256];
  format_shape(got_shape, sizeof got_shape, rank, shape);
  format_shape(want_shape, sizeof want_shape, want->rank, want->shape);
  if (want->dtype != spec->dtype) {
    snprintf(msg, n, "output %d ('%s') is %s, expected%d.npy holds '%s' (%s)", k, spec->name, spec->dtype_name, k,
             want->descr, disc_dtype_name(want->dtype));
    return 0;
  }
  int same = rank == want->rank;
  for (int d = 0; same && d < rank; d++) same = shape[d] == want->shape[d];
  if (!same) {
    snprintf(msg, n, "output %d ('%s'): shape %s, expected %s", k, spec->name, got_shape, want_shape);
    return 0;
  }
  int64_t bad = 0, first = -1;
  int floats = is_float(spec->dtype), parts = spec->dtype == DISC_COMPLEX_F32 || spec->dtype == DISC_COMPLEX_F64 ? 2 : 1;
  size_t elem = disc_dtype_size(spec->dtype);
  for (int64_t i = 0; i < want->numel; i++) {
    int ok = 1;
    if (floats) {
      for (int part = 0; part < parts; part++)
        ok &= close_enough(element(data, spec->dtype, i, part), element(want->data, spec->dtype, i, part));
    } else if (spec->dtype == DISC_I1) {
      ok = (((const uint8_t *)data)[i] != 0) == (((const uint8_t *)want->data)[i] != 0);
    } else {
      ok = memcmp((const char *)data + i * (int64_t)elem, (const char *)want->data + i * (int64_t)elem, elem) == 0;
    }
    if (!ok && bad++ == 0) first = i;
  }
  if (!bad) return 1;
  char where[256];
  format_index(where, sizeof where, first, rank, shape);
  if (floats)
    snprintf(msg, n,
             "output %d ('%s'): %lld of %lld elements differ (rtol %g, atol %g); first at %s: got %.9g, expected %.9g",
             k, spec->name, (long long)bad, (long long)want->numel, RTOL, ATOL, where,
             element(data, spec->dtype, first, 0), element(want->data, spec->dtype, first, 0));
  else
    snprintf(msg, n, "output %d ('%s'): %lld of %lld elements differ; first at %s: got %lld, expected %lld", k,
             spec->name, (long long)bad, (long long)want->numel, where, int_element(data, spec->dtype, first),
             int_element(want->data, spec->dtype, first));
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* cases                                                                                      */

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Runs one case; 1 when every output matched. */
static int run_case(const disc_artifact *a, disc_call *call, const char *dir) {
  int n_in = disc_artifact_num_inputs(a), n_out = disc_artifact_num_outputs(a);
  npy_array *inputs = calloc((size_t)n_in + 1, sizeof(npy_array));
  npy_array *expected = calloc((size_t)n_out + 1, sizeof(npy_array));
  char path[4096], msg[8192] = "";
  int ok = inputs && expected;
  if (!ok) snprintf(msg, sizeof msg, "out of memory");
  for (int i = 0; ok && i < n_in + n_out; i++) {
    int is_input = i < n_in, k = is_input ? i : i - n_in;
    snprintf(path, sizeof path, "%s/%s%d.npy", dir, is_input ? "input" : "expected", k);
    if (!npy_load(path, is_input ? &inputs[k] : &expected[k])) {
      snprintf(msg, sizeof msg, "%s: %s", path, npy_error);
      ok = 0;
    }
  }
  for (int extra = 0; ok && extra < 2; extra++) { /* more files than the function has inputs or outputs */
    snprintf(path, sizeof path, "%s/%s%d.npy", dir, extra ? "expected" : "input", extra ? n_out : n_in);
    if (file_exists(path)) {
      snprintf(msg, sizeof msg, "%s exists, but the function has %d %s", path, extra ? n_out : n_in,
               extra ? "outputs" : "inputs");
      ok = 0;
    }
  }
  for (int i = 0; ok && i < n_in; i++) {
    if (disc_call_bind_input(call, i, inputs[i].data, inputs[i].dtype, inputs[i].rank, inputs[i].shape, NULL) != RAL_OK) {
      snprintf(msg, sizeof msg, "%s", disc_last_error());
      ok = 0;
    }
  }
  double start = now_ms(), ms = 0;
  if (ok && disc_call_run(call) != RAL_OK) {
    snprintf(msg, sizeof msg, "%s", disc_last_error());
    ok = 0;
  }
  ms = now_ms() - start;
  if (!ok) {
    printf("ERROR %s: %s\n", dir, msg);
  } else {
    char shapes[1024] = "";
    size_t used = 0;
    for (int k = 0; k < n_out; k++) {
      const void *data;
      int rank;
      const int64_t *shape;
      const disc_tensor_spec *spec = disc_artifact_output(a, k);
      disc_call_output(call, k, &data, &rank, &shape);
      if (ok && !compare(k, spec, data, rank, shape, &expected[k], msg, sizeof msg)) ok = 0;
      char s[256];
      format_shape(s, sizeof s, rank, shape);
      if (used < sizeof shapes)
        used += (size_t)snprintf(shapes + used, sizeof shapes - used, "%s%s%s", k ? ", " : "", spec->dtype_name, s);
    }
    if (ok)
      printf("PASS %s: %s in %.3f ms\n", dir, shapes, ms);
    else
      printf("FAIL %s: %s\n", dir, msg);
  }
  for (int i = 0; inputs && i < n_in; i++) npy_free(&inputs[i]);
  for (int k = 0; expected && k < n_out; k++) npy_free(&expected[k]);
  free(inputs);
  free(expected);
  fflush(stdout);
  return ok;
}

static int usage(void) {
  fprintf(stderr, "usage: disc_run ARTIFACT [--blas PATH] [--threads N] CASE_DIR...\n"
                  "  --blas PATH  BLAS shared library for GEMMs (default: $DISC_BLAS)\n"
                  "  --threads N  threads of the runtime's pool (default: every core)\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *artifact_path = NULL, *blas = getenv("DISC_BLAS");
  int threads = 0, num_cases = 0;
  const char **cases = calloc((size_t)argc, sizeof(char *));
  if (!cases) return 2;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--blas") == 0 && i + 1 < argc) {
      blas = argv[++i];
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      free(cases);
      usage();
      return 0;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "disc_run: unknown option %s\n", argv[i]);
      free(cases);
      return usage();
    } else if (!artifact_path) {
      artifact_path = argv[i];
    } else {
      cases[num_cases++] = argv[i];
    }
  }
  if (!artifact_path || num_cases == 0) {
    free(cases);
    return usage();
  }
  ral_runtime *rt;
  if (ral_runtime_create(blas, threads, &rt) != RAL_OK) {
    fprintf(stderr, "disc_run: %s\n", ral_runtime_create_error());
    free(cases);
    return 2;
  }
  disc_artifact *a;
  if (disc_artifact_load(rt, artifact_path, &a) != RAL_OK) {
    fprintf(stderr, "disc_run: %s\n", disc_last_error());
    ral_runtime_destroy(rt);
    free(cases);
    return 2;
  }
  disc_call *call;
  int failed = 0;
  if (disc_call_create(a, &call) != RAL_OK) {
    fprintf(stderr, "disc_run: %s\n", disc_last_error());
    failed = num_cases;
  } else {
    for (int c = 0; c < num_cases; c++) failed += !run_case(a, call, cases[c]);
    disc_call_free(call);
  }
  printf("%d of %d cases passed\n", num_cases - failed, num_cases);
  disc_artifact_free(a);
  ral_runtime_destroy(rt);
  free(cases);
  return failed ? 1 : 0;
}
