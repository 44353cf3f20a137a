/* Loading and calling .disc artifacts: see ral/artifact.h and docs/artifact.md. */
#define _GNU_SOURCE
#include "ral/artifact.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "json.h"
#include "sha256.h"

#define PREFIX_SIZE 64 /* the fixed part before the header JSON */
#define MAX_RANK 64
#define MAX_TENSORS 65536 /* inputs, outputs, params or assertions */

/* ------------------------------------------------------------------------------------------ */
/* errors                                                                                     */

static _Thread_local char last_error[1024];

const char *disc_last_error(void) { return last_error; }

static ral_status fail(ral_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ral_status fail(ral_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

/* Puts `prefix` in front of the current message. */
static void prefix_error(const char *prefix) {
  char message[sizeof last_error];
  memcpy(message, last_error, sizeof message);
  size_t p = strlen(prefix);
  if (p > sizeof last_error - 1) p = sizeof last_error - 1;
  size_t m = strnlen(message, sizeof message - 1);
  if (m > sizeof last_error - 1 - p) m = sizeof last_error - 1 - p; /* the end of the message goes */
  memcpy(last_error, prefix, p);
  memcpy(last_error + p, message, m);
  last_error[p + m] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* element types                                                                              */

static const struct {
  const char *name;
  size_t size;
} dtype_table[] = {
    [DISC_DTYPE_INVALID] = {"invalid", 0}, [DISC_F16] = {"f16", 2},
    [DISC_BF16] = {"bf16", 2},             [DISC_F32] = {"f32", 4},
    [DISC_F64] = {"f64", 8},               [DISC_I1] = {"i1", 1},
    [DISC_I8] = {"i8", 1},                 [DISC_I16] = {"i16", 2},
    [DISC_I32] = {"i32", 4},               [DISC_I64] = {"i64", 8},
    [DISC_UI8] = {"ui8", 1},               [DISC_UI16] = {"ui16", 2},
    [DISC_UI32] = {"ui32", 4},             [DISC_UI64] = {"ui64", 8},
    [DISC_COMPLEX_F32] = {"complex<f32>", 8}, [DISC_COMPLEX_F64] = {"complex<f64>", 16},
};
#define NUM_DTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

static int valid_dtype(disc_dtype d) { return d > DISC_DTYPE_INVALID && (int)d < NUM_DTYPES; }

const char *disc_dtype_name(disc_dtype dtype) { return valid_dtype(dtype) ? dtype_table[dtype].name : "invalid"; }
size_t disc_dtype_size(disc_dtype dtype) { return valid_dtype(dtype) ? dtype_table[dtype].size : 0; }

disc_dtype disc_dtype_from_name(const char *name) {
  for (int d = 1; name && d < NUM_DTYPES; d++)
    if (strcmp(dtype_table[d].name, name) == 0) return (disc_dtype)d;
  return DISC_DTYPE_INVALID;
}

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                    */

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Elements and bytes of a shape; 0 when a size is negative or the byte count overflows. */
static int shape_bytes(int rank, const int64_t *sizes, size_t elem, int64_t *numel, size_t *bytes) {
  int64_t n = 1;
  int empty = 0;
  for (int d = 0; d < rank; d++) {
    if (sizes[d] < 0) return 0;
    if (sizes[d] == 0) empty = 1;
  }
  for (int d = 0; d < rank && !empty; d++) {
    if (n > INT64_MAX / sizes[d]) return 0;
    n *= sizes[d];
  }
  if (empty) n = 0;
  if (elem && n > (int64_t)(PTRDIFF_MAX / elem)) return 0;
  *numel = n;
  *bytes = (size_t)n * elem;
  return 1;
}

/* "[2, 15]" */
static const char *format_shape(char *buf, size_t n, int rank, const int64_t *sizes) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < rank && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)sizes[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* the artifact                                                                               */

typedef struct {
  disc_tensor_spec spec;
  int64_t *dims;
  const char **dim_names;
  /* inputs: for each dim with a variable, the input and dim where the variable first appears
   * (the dim itself for the first occurrence); -1 for static dims */
  int *first_input, *first_dim;
} tensor_info;

typedef struct {
  disc_dtype dtype;
  int rank;
  int64_t *sizes;
  const void *data; /* in params_block */
  size_t nbytes;
} param_info;

typedef struct {
  const char *message;
  int64_t num_values;
} assertion_info;

struct disc_artifact {
  ral_runtime *rt;
  void *map;
  size_t map_size;
  void *params_block; /* the parameters, copied out of the mapping (see read_params) */
  size_t params_block_size;
  disc_json *header; /* owns every string the specs point to */
  void *so;
  ral_entry entry, guard; /* the packed entry points: (void **args, void *results) */
  int num_inputs, num_outputs, num_params, num_assertions;
  tensor_info *inputs, *outputs;
  param_info *params;
  assertion_info *assertions;
  /* descriptors: argument k (inputs, then params) at arg_words[k] int64 words into the call's
   * argument buffer, which holds total_arg_words; results likewise */
  size_t *arg_words, total_arg_words;
  size_t *result_words, total_result_words;
};

static void free_tensors(tensor_info *t, int n) {
  for (int i = 0; t && i < n; i++) {
    free(t[i].dims);
    free(t[i].dim_names);
    free(t[i].first_input);
    free(t[i].first_dim);
  }
  free(t);
}

void disc_artifact_free(disc_artifact *a) {
  if (!a) return;
  if (a->so) dlclose(a->so);
  if (a->map) munmap(a->map, a->map_size);
  if (a->params_block) munmap(a->params_block, a->params_block_size);
  free_tensors(a->inputs, a->num_inputs);
  free_tensors(a->outputs, a->num_outputs);
  for (int i = 0; a->params && i < a->num_params; i++) free(a->params[i].sizes);
  free(a->params);
  free(a->assertions);
  free(a->arg_words);
  free(a->result_words);
  disc_json_free(a->header);
  free(a);
}

int disc_artifact_num_inputs(const disc_artifact *a) { return a ? a->num_inputs : 0; }
int disc_artifact_num_outputs(const disc_artifact *a) { return a ? a->num_outputs : 0; }

const disc_tensor_spec *disc_artifact_input(const disc_artifact *a, int i) {
  if (!a || i < 0 || i >= a->num_inputs) {
    fail(RAL_ERR_INVALID_ARGUMENT, "input %d out of range (the artifact has %d)", i, a ? a->num_inputs : 0);
    return NULL;
  }
  return &a->inputs[i].spec;
}

const disc_tensor_spec *disc_artifact_output(const disc_artifact *a, int i) {
  if (!a || i < 0 || i >= a->num_outputs) {
    fail(RAL_ERR_INVALID_ARGUMENT, "output %d out of range (the artifact has %d)", i, a ? a->num_outputs : 0);
    return NULL;
  }
  return &a->outputs[i].spec;
}

void *disc_artifact_symbol(const disc_artifact *a, const char *name) {
  if (!a || !a->so || !name) return NULL;
  void *sym = dlsym(a->so, name);
  if (!sym) fail(RAL_ERR_INVALID_ARGUMENT, "the artifact's shared object has no symbol '%s'", name);
  return sym;
}

/* ---- header ---- */

/* "inputs[1].shape" for member `key` of the object at `where` (NULL: the header's top level). */
static const char *member(char *buf, size_t n, const char *where, const char *key) {
  snprintf(buf, n, "%s%s%s", where ? where : "", where ? "." : "", key);
  return buf;
}

/* An array member of the header (an empty one when missing and `optional`). */
static ral_status get_array(const disc_json *obj, const char *key, const char *where, int optional,
                            const disc_json **out, int *count) {
  const disc_json *v = disc_json_get(obj, key);
  char at[128];
  *out = v;
  *count = 0;
  if (!v && optional) return RAL_OK;
  if (!v || v->kind != DISC_JSON_ARRAY)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected an array", member(at, sizeof at, where, key),
                v ? disc_json_kind_name(v->kind) : "missing");
  if (v->count > MAX_TENSORS)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s has %zu entries (at most %d)", member(at, sizeof at, where, key),
                v->count, MAX_TENSORS);
  *count = (int)v->count;
  return RAL_OK;
}

static ral_status get_string(const disc_json *obj, const char *key, const char *where, const char **out) {
  const disc_json *v = disc_json_get(obj, key);
  char at[128];
  if (!v || v->kind != DISC_JSON_STRING)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected a string", member(at, sizeof at, where, key),
                v ? disc_json_kind_name(v->kind) : "missing");
  *out = v->string;
  return RAL_OK;
}

static ral_status get_int(const disc_json *obj, const char *key, const char *where, int64_t *out) {
  const disc_json *v = disc_json_get(obj, key);
  char at[128];
  if (!v || v->kind != DISC_JSON_INT || v->integer < 0)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected an integer >= 0", member(at, sizeof at, where, key),
                !v ? "missing" : v->kind == DISC_JSON_INT ? "negative" : disc_json_kind_name(v->kind));
  *out = v->integer;
  return RAL_OK;
}

static ral_status get_dtype(const disc_json *obj, const char *where, disc_dtype *out) {
  const char *name = NULL;
  ral_status s = get_string(obj, "dtype", where, &name);
  if (s) return s;
  *out = disc_dtype_from_name(name);
  if (*out == DISC_DTYPE_INVALID)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s.dtype \"%s\" is not an element type this runtime knows",
                where, name);
  return RAL_OK;
}

/* "inputs" or "outputs": name, dtype and shape of each. */
static ral_status read_tensors(const disc_json *root, const char *key, tensor_info **out, int *count) {
  const disc_json *arr;
  ral_status s = get_array(root, key, NULL, 0, &arr, count);
  if (s) return s;
  *out = calloc((size_t)*count + 1, sizeof(tensor_info));
  if (!*out) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory reading the header");
  for (int i = 0; i < *count; i++) {
    const disc_json *item = &arr->items[i];
    tensor_info *t = &(*out)[i];
    char where[64];
    snprintf(where, sizeof where, "%s[%d]", key, i);
    if (item->kind != DISC_JSON_OBJECT)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected an object", where,
                  disc_json_kind_name(item->kind));
    if ((s = get_string(item, "name", where, &t->spec.name)) || (s = get_dtype(item, where, &t->spec.dtype)))
      return s;
    t->spec.dtype_name = disc_dtype_name(t->spec.dtype);
    const disc_json *shape;
    int rank;
    if ((s = get_array(item, "shape", where, 0, &shape, &rank))) return s;
    if (rank > MAX_RANK)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s has rank %d (at most %d)", where, rank, MAX_RANK);
    t->spec.rank = rank;
    t->dims = calloc((size_t)rank + 1, sizeof(int64_t));
    t->dim_names = calloc((size_t)rank + 1, sizeof(char *));
    t->first_input = calloc((size_t)rank + 1, sizeof(int));
    t->first_dim = calloc((size_t)rank + 1, sizeof(int));
    if (!t->dims || !t->dim_names || !t->first_input || !t->first_dim)
      return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory reading the header");
    for (int d = 0; d < rank; d++) {
      const disc_json *dim = &shape->items[d];
      if (dim->kind == DISC_JSON_INT && dim->integer >= 0) {
        t->dims[d] = dim->integer;
        t->first_input[d] = t->first_dim[d] = -1;
      } else if (dim->kind == DISC_JSON_STRING && dim->count > 0) {
        t->dims[d] = -1;
        t->dim_names[d] = dim->string;
      } else {
        return fail(RAL_ERR_INVALID_ARGUMENT,
                    "header: %s.shape[%d] is %s, expected a size >= 0 or a dimension variable's name", where, d,
                    dim->kind == DISC_JSON_INT ? "negative" : disc_json_kind_name(dim->kind));
      }
    }
    t->spec.dims = t->dims;
    t->spec.dim_names = t->dim_names;
  }
  return RAL_OK;
}

/* For each dimension variable of the inputs, where it first appears: the run checks the other
 * occurrences against that one. */
static void link_dim_variables(disc_artifact *a) {
  for (int i = 0; i < a->num_inputs; i++) {
    tensor_info *t = &a->inputs[i];
    for (int d = 0; d < t->spec.rank; d++) {
      if (!t->dim_names[d]) continue;
      t->first_input[d] = i;
      t->first_dim[d] = d;
      int found = 0;
      for (int pi = 0; pi <= i && !found; pi++) {
        const tensor_info *p = &a->inputs[pi];
        for (int pd = 0; pd < (pi == i ? d : p->spec.rank) && !found; pd++) {
          if (p->dim_names[pd] && strcmp(p->dim_names[pd], t->dim_names[d]) == 0) {
            t->first_input[d] = pi;
            t->first_dim[d] = pd;
            found = 1;
          }
        }
      }
    }
  }
}

/* Checks that [offset, offset + size) lies in the file after the header, 64-byte aligned. */
static ral_status check_range(const char *where, int64_t offset, int64_t size, uint64_t data_start,
                              uint64_t file_size) {
  if (offset % 64 != 0)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s: offset %lld is not a multiple of 64", where, (long long)offset);
  if ((uint64_t)offset < data_start)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s: offset %lld overlaps the header (which ends at %llu)", where,
                (long long)offset, (unsigned long long)data_start);
  if ((uint64_t)offset > file_size || (uint64_t)size > file_size - (uint64_t)offset)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s: bytes [%lld, %lld + %lld) run past the end of the file (%llu bytes)",
                where, (long long)offset, (long long)offset, (long long)size, (unsigned long long)file_size);
  return RAL_OK;
}

/* The parameters' span of the file copied into the process's own pages (huge ones where the
 * kernel gives them): kernels stream weights from there markedly faster than from the file's
 * page-cache pages once other work has taken them out of the cache. */
static ral_status copy_params(disc_artifact *a) {
  const char *lo = NULL, *hi = NULL;
  for (int i = 0; i < a->num_params; i++) {
    const char *p = a->params[i].data;
    if (!lo || p < lo) lo = p;
    if (!hi || p + a->params[i].nbytes > hi) hi = p + a->params[i].nbytes;
  }
  if (!lo || hi == lo) return RAL_OK;
  void *block = mmap(NULL, (size_t)(hi - lo), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED)
    return fail(RAL_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for the parameters", (size_t)(hi - lo));
  madvise(block, (size_t)(hi - lo), MADV_HUGEPAGE);
  memcpy(block, lo, (size_t)(hi - lo));
  mprotect(block, (size_t)(hi - lo), PROT_READ);
  a->params_block = block;
  a->params_block_size = (size_t)(hi - lo);
  for (int i = 0; i < a->num_params; i++) a->params[i].data = (const char *)block + ((const char *)a->params[i].data - lo);
  return RAL_OK;
}

static ral_status read_params(disc_artifact *a, const disc_json *root, uint64_t data_start) {
  const disc_json *arr;
  ral_status s = get_array(root, "params", NULL, 1, &arr, &a->num_params);
  if (s) return s;
  a->params = calloc((size_t)a->num_params + 1, sizeof(param_info));
  if (!a->params) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory reading the header");
  for (int i = 0; i < a->num_params; i++) {
    const disc_json *item = &arr->items[i];
    param_info *p = &a->params[i];
    char where[64];
    snprintf(where, sizeof where, "params[%d]", i);
    if (item->kind != DISC_JSON_OBJECT)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected an object", where,
                  disc_json_kind_name(item->kind));
    const disc_json *shape;
    int64_t offset = 0, nbytes = 0;
    if ((s = get_dtype(item, where, &p->dtype)) || (s = get_array(item, "shape", where, 0, &shape, &p->rank)) ||
        (s = get_int(item, "offset", where, &offset)) || (s = get_int(item, "nbytes", where, &nbytes)))
      return s;
    if (p->rank > MAX_RANK)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s has rank %d (at most %d)", where, p->rank, MAX_RANK);
    p->sizes = calloc((size_t)p->rank + 1, sizeof(int64_t));
    if (!p->sizes) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory reading the header");
    for (int d = 0; d < p->rank; d++) {
      const disc_json *dim = &shape->items[d];
      if (dim->kind != DISC_JSON_INT || dim->integer < 0)
        return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s.shape[%d] is not a size >= 0", where, d);
      p->sizes[d] = dim->integer;
    }
    int64_t numel;
    size_t bytes;
    if (!shape_bytes(p->rank, p->sizes, disc_dtype_size(p->dtype), &numel, &bytes) || bytes != (uint64_t)nbytes)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s: nbytes %lld does not match its shape and dtype %s", where,
                  (long long)nbytes, disc_dtype_name(p->dtype));
    if ((s = check_range(where, offset, nbytes, data_start, a->map_size))) return s;
    p->data = (const char *)a->map + offset;
    p->nbytes = bytes;
  }
  return copy_params(a);
}

static ral_status read_assertions(disc_artifact *a, const disc_json *root) {
  const disc_json *arr;
  ral_status s = get_array(root, "assertions", NULL, 1, &arr, &a->num_assertions);
  if (s) return s;
  a->assertions = calloc((size_t)a->num_assertions + 1, sizeof(assertion_info));
  if (!a->assertions) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory reading the header");
  for (int i = 0; i < a->num_assertions; i++) {
    char where[64];
    snprintf(where, sizeof where, "assertions[%d]", i);
    const disc_json *item = &arr->items[i];
    if (item->kind != DISC_JSON_OBJECT)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is %s, expected an object", where,
                  disc_json_kind_name(item->kind));
    if ((s = get_string(item, "message", where, &a->assertions[i].message)) ||
        (s = get_int(item, "num_values", where, &a->assertions[i].num_values)))
      return s;
    if (a->assertions[i].num_values > MAX_TENSORS)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s.num_values is %lld (at most %d)", where,
                  (long long)a->assertions[i].num_values, MAX_TENSORS);
  }
  return RAL_OK;
}

/* Every section is [offset, size] inside the file; "object" must be there. */
static ral_status read_sections(const disc_json *root, uint64_t data_start, uint64_t file_size,
                                const uint8_t *map, const uint8_t **object, size_t *object_size) {
  const disc_json *sections = disc_json_get(root, "sections");
  if (!sections || sections->kind != DISC_JSON_OBJECT)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: \"sections\" is %s, expected an object",
                sections ? disc_json_kind_name(sections->kind) : "missing");
  *object = NULL;
  for (size_t i = 0; i < sections->count; i++) {
    const disc_json *sec = &sections->items[i];
    char where[96];
    snprintf(where, sizeof where, "sections.%.64s", sec->key);
    if (sec->kind != DISC_JSON_ARRAY || sec->count != 2 || sec->items[0].kind != DISC_JSON_INT ||
        sec->items[1].kind != DISC_JSON_INT || sec->items[0].integer < 0 || sec->items[1].integer < 0)
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s is not [offset, size] with integers >= 0", where);
    ral_status s = check_range(where, sec->items[0].integer, sec->items[1].integer, data_start, file_size);
    if (s) return s;
    if (strcmp(sec->key, "object") == 0) {
      *object = map + sec->items[0].integer;
      *object_size = (size_t)sec->items[1].integer;
    }
  }
  if (!*object) return fail(RAL_ERR_INVALID_ARGUMENT, "header: \"sections\" has no \"object\"");
  return RAL_OK;
}

/* Descriptor layout: rank r takes 3 + 2r int64 words. */
static ral_status layout_descriptors(disc_artifact *a) {
  int num_args = a->num_inputs + a->num_params;
  a->arg_words = calloc((size_t)num_args + 1, sizeof(size_t));
  a->result_words = calloc((size_t)a->num_outputs + 1, sizeof(size_t));
  if (!a->arg_words || !a->result_words) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory loading the artifact");
  size_t words = 0;
  for (int k = 0; k < num_args; k++) {
    int rank = k < a->num_inputs ? a->inputs[k].spec.rank : a->params[k - a->num_inputs].rank;
    a->arg_words[k] = words;
    words += 3 + 2 * (size_t)rank;
  }
  a->total_arg_words = words;
  words = 0;
  for (int k = 0; k < a->num_outputs; k++) {
    a->result_words[k] = words;
    words += 3 + 2 * (size_t)a->outputs[k].spec.rank;
  }
  a->total_result_words = words;
  return RAL_OK;
}

/* ---- target ---- */

/* Whether `flag` is one of the space-separated words of the "flags" line of /proc/cpuinfo. */
static int has_word(const char *line, size_t len, const char *flag) {
  size_t n = strlen(flag);
  for (size_t i = 0; i < len;) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t start = i;
    while (i < len && line[i] != ' ' && line[i] != '\t') i++;
    if (i - start == n && memcmp(line + start, flag, n) == 0) return 1;
  }
  return 0;
}

/* The words after "flags :" of the first processor in /proc/cpuinfo, in a new buffer. */
static char *cpu_flags_line(size_t *len) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return NULL;
  char *line = NULL, *found = NULL;
  size_t cap = 0;
  ssize_t n;
  while (!found && (n = getline(&line, &cap, f)) > 0) {
    if (strncmp(line, "flags", 5) != 0) continue;
    size_t i = 5;
    while (i < (size_t)n && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i >= (size_t)n || line[i] != ':') continue;
    i++;
    size_t end = (size_t)n;
    while (end > i && (line[end - 1] == '\n' || line[end - 1] == '\r')) end--;
    found = malloc(end - i + 1);
    if (found) {
      memcpy(found, line + i, end - i);
      found[end - i] = '\0';
      *len = end - i;
    }
  }
  free(line);
  fclose(f);
  return found;
}

static ral_status check_target(const disc_json *root) {
  const disc_json *target = disc_json_get(root, "target");
  if (!target || target->kind != DISC_JSON_OBJECT)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: \"target\" is %s, expected an object",
                target ? disc_json_kind_name(target->kind) : "missing");
  const char *name = NULL;
  ral_status s = get_string(target, "name", "target", &name);
  if (s) return s;
  if (strcmp(name, "x86") != 0)
    return fail(RAL_ERR_INVALID_ARGUMENT, "wrong target: the artifact was compiled for '%s', this runtime runs x86 code",
                name);
  struct utsname u;
  if (uname(&u) != 0) return fail(RAL_ERR_INTERNAL, "wrong target: uname failed: %s", strerror(errno));
  if (strcmp(u.machine, "x86_64") != 0)
    return fail(RAL_ERR_INVALID_ARGUMENT, "wrong target: the artifact needs an x86_64 machine, this one is %s",
                u.machine);
  const disc_json *flags;
  int num_flags;
  if ((s = get_array(target, "cpu_flags", "target", 1, &flags, &num_flags))) return s;
  if (num_flags == 0) return RAL_OK;
  const disc_json *cpu = disc_json_get(target, "cpu");
  const char *cpu_name = cpu && cpu->kind == DISC_JSON_STRING ? cpu->string : "?";
  size_t len = 0;
  char *line = cpu_flags_line(&len);
  if (!line)
    return fail(RAL_ERR_UNAVAILABLE,
                "wrong target: cannot read the CPU flags from /proc/cpuinfo to check the artifact's (cpu '%s')",
                cpu_name);
  for (int i = 0; i < num_flags; i++) {
    const disc_json *flag = &flags->items[i];
    if (flag->kind != DISC_JSON_STRING) {
      free(line);
      return fail(RAL_ERR_INVALID_ARGUMENT, "header: target.cpu_flags[%d] is %s, expected a string", i,
                  disc_json_kind_name(flag->kind));
    }
    if (!has_word(line, len, flag->string)) {
      free(line);
      return fail(RAL_ERR_INVALID_ARGUMENT,
                  "wrong target: the artifact was compiled for cpu '%s' and needs the CPU flag '%s', which this "
                  "machine's /proc/cpuinfo does not list",
                  cpu_name, flag->string);
    }
  }
  free(line);
  return RAL_OK;
}

/* ---- the shared object ---- */

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w;
    n -= (size_t)w;
  }
  return 1;
}

/* dlopen identifies loaded objects by path (and by file identity): a second object opened under
 * the name of one still loaded, e.g. /proc/self/fd/N after fd N was closed and reused, would
 * silently get the first object's handle. So the object is opened under a name that no loaded
 * object has: RTLD_NOLOAD tells whether one has it, and the descriptor moves to another number
 * until none has. The name is in `path`. */
static void *dlopen_fd(int *fd, char *path, size_t path_size) {
  for (int tries = 0; tries < 4096; tries++) {
    snprintf(path, path_size, "/proc/self/fd/%d", *fd);
    void *loaded = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!loaded) break;
    dlclose(loaded);
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, *fd + 1);
    if (moved < 0) return NULL;
    close(*fd);
    *fd = moved;
  }
  dlerror(); /* the NOLOAD probe's "not loaded" */
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static atomic_ulong temp_counter;

/* Loads the object from a memfd (no file left anywhere), or if that fails (no memfd, or memfd
 * mappings not executable), from a temp file in $TMPDIR (default /tmp) that is unlinked right
 * away; its name holds the pid and a process-wide counter, so it never repeats in a process. */
static ral_status load_object(disc_artifact *a, const uint8_t *object, size_t size) {
  char path[4096], memfd_error[512] = "";
  int fd = memfd_create("disc-artifact", MFD_CLOEXEC);
  if (fd >= 0) {
    if (write_all(fd, object, size)) {
      a->so = dlopen_fd(&fd, path, sizeof path);
      if (!a->so) snprintf(memfd_error, sizeof memfd_error, "%s", dlerror());
    } else {
      snprintf(memfd_error, sizeof memfd_error, "writing the memfd failed: %s", strerror(errno));
    }
    close(fd);
    if (a->so) return RAL_OK;
  } else {
    snprintf(memfd_error, sizeof memfd_error, "memfd_create failed: %s", strerror(errno));
  }
  const char *dir = getenv("TMPDIR");
  if (!dir || !dir[0]) dir = "/tmp";
  snprintf(path, sizeof path, "%s/disc-artifact-%ld-%lu-XXXXXX.so", dir, (long)getpid(),
           atomic_fetch_add(&temp_counter, 1));
  fd = mkostemps(path, 3, O_CLOEXEC);
  if (fd < 0)
    return fail(RAL_ERR_UNAVAILABLE, "cannot load the shared object: %s; and cannot create a temp file in %s: %s",
                memfd_error, dir, strerror(errno));
  int written = write_all(fd, object, size);
  int write_errno = errno;
  close(fd);
  if (written) a->so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const char *why = written ? (a->so ? "" : dlerror()) : strerror(write_errno);
  ral_status s = RAL_OK;
  if (!a->so)
    s = fail(RAL_ERR_UNAVAILABLE, "cannot load the shared object: %s; from a temp file: %s", memfd_error,
             why ? why : "?");
  unlink(path);
  return s;
}

static ral_status find_entries(disc_artifact *a, const disc_json *root) {
  const char *entry = NULL;
  ral_status s = get_string(root, "entry", NULL, &entry);
  if (s) return s;
  a->entry = (ral_entry)dlsym(a->so, entry);
  if (!a->entry)
    return fail(RAL_ERR_INVALID_ARGUMENT, "the shared object has no entry function '%s' (header \"entry\")", entry);
  const disc_json *guard = disc_json_get(root, "guard");
  if (!guard || guard->kind == DISC_JSON_NULL) return RAL_OK;
  if (guard->kind != DISC_JSON_STRING)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: \"guard\" is %s, expected a string or null",
                disc_json_kind_name(guard->kind));
  a->guard = (ral_entry)dlsym(a->so, guard->string);
  if (!a->guard)
    return fail(RAL_ERR_INVALID_ARGUMENT, "the shared object has no guard function '%s' (header \"guard\")",
                guard->string);
  return RAL_OK;
}

/* ---- loading ---- */

static ral_status read_exact(int fd, uint8_t *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, buf + done, n - done, (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return fail(RAL_ERR_UNAVAILABLE, "read failed: %s", strerror(errno));
    if (r == 0) return fail(RAL_ERR_INVALID_ARGUMENT, "truncated: the file ended while being read");
    done += (size_t)r;
  }
  return RAL_OK;
}

static void hex(char *out, const uint8_t *digest) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
}

/* The checks of the fixed 64-byte part and the checksum, in the order of docs/artifact.md; maps
 * the file into a->map. */
static ral_status map_and_check(disc_artifact *a, int fd, uint64_t *header_size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return fail(RAL_ERR_UNAVAILABLE, "stat failed: %s", strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(RAL_ERR_INVALID_ARGUMENT, "not a regular file");
  uint64_t actual = (uint64_t)st.st_size;
  uint8_t prefix[PREFIX_SIZE];
  ral_status s = read_exact(fd, prefix, actual < PREFIX_SIZE ? (size_t)actual : PREFIX_SIZE);
  if (s) return s;
  if (actual < 8 || memcmp(prefix, "DISCSHLO", 8) != 0) {
    char seen[40] = "";
    for (size_t i = 0, n = 0; i < 8 && i < actual; i++)
      n += (size_t)snprintf(seen + n, sizeof seen - n, prefix[i] >= 0x20 && prefix[i] < 0x7f ? "%c" : "\\x%02x",
                            prefix[i]);
    return fail(RAL_ERR_INVALID_ARGUMENT, "bad magic: not a .disc artifact (expected \"DISCSHLO\", found \"%s\"%s)",
                seen, actual < 8 ? ", the file is shorter than the magic" : "");
  }
  if (actual < 12) return fail(RAL_ERR_INVALID_ARGUMENT, "truncated: the file is %llu bytes", (unsigned long long)actual);
  uint32_t version = le32(prefix + 8);
  if (version != DISC_ARTIFACT_FORMAT_VERSION)
    return fail(RAL_ERR_INVALID_ARGUMENT, "unsupported format version %u (this runtime reads version %d)", version,
                DISC_ARTIFACT_FORMAT_VERSION);
  if (actual < PREFIX_SIZE)
    return fail(RAL_ERR_INVALID_ARGUMENT, "truncated: the file is %llu bytes, shorter than the %d-byte fixed header",
                (unsigned long long)actual, PREFIX_SIZE);
  uint64_t declared = le64(prefix + 24);
  if (declared > actual)
    return fail(RAL_ERR_INVALID_ARGUMENT, "truncated: the file is %llu bytes, its header says %llu",
                (unsigned long long)actual, (unsigned long long)declared);
  if (declared < actual)
    return fail(RAL_ERR_INVALID_ARGUMENT, "extended: the file is %llu bytes, its header says %llu (bytes appended?)",
                (unsigned long long)actual, (unsigned long long)declared);
  if (actual > SIZE_MAX) return fail(RAL_ERR_OUT_OF_MEMORY, "the file is too large to map");
  void *map = mmap(NULL, (size_t)actual, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return fail(RAL_ERR_UNAVAILABLE, "mmap failed: %s", strerror(errno));
  a->map = map;
  a->map_size = (size_t)actual;
  uint8_t digest[32];
  disc_sha256((const uint8_t *)map + PREFIX_SIZE, a->map_size - PREFIX_SIZE, digest);
  if (memcmp(digest, prefix + 32, 32) != 0) {
    char want[65], got[65];
    hex(want, prefix + 32);
    hex(got, digest);
    return fail(RAL_ERR_INVALID_ARGUMENT, "corrupted: the SHA-256 of bytes [64, %llu) is %s, the file says %s",
                (unsigned long long)actual, got, want);
  }
  uint32_t abi = le32(prefix + 12);
  if (abi != (uint32_t)ral_abi_version())
    return fail(RAL_ERR_INVALID_ARGUMENT,
                "RAL ABI mismatch: the shared object was linked against RAL ABI version %u, this runtime implements "
                "version %d",
                abi, ral_abi_version());
  *header_size = le64(prefix + 16);
  if (*header_size > actual - PREFIX_SIZE)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: its size %llu runs past the end of the file (%llu bytes)",
                (unsigned long long)*header_size, (unsigned long long)actual);
  return RAL_OK;
}

static ral_status load(disc_artifact *a, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(RAL_ERR_UNAVAILABLE, "cannot open: %s", strerror(errno));
  uint64_t header_size = 0;
  ral_status s = map_and_check(a, fd, &header_size);
  close(fd);
  if (s) return s;
  char error[512];
  a->header = disc_json_parse((const char *)a->map + PREFIX_SIZE, (size_t)header_size, error, sizeof error);
  if (!a->header) return fail(RAL_ERR_INVALID_ARGUMENT, "header: %s", error);
  const disc_json *root = a->header;
  if (root->kind != DISC_JSON_OBJECT)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: the JSON is %s, expected an object", disc_json_kind_name(root->kind));
  const uint8_t *object = NULL;
  size_t object_size = 0;
  uint64_t data_start = PREFIX_SIZE + header_size;
  if ((s = read_tensors(root, "inputs", &a->inputs, &a->num_inputs)) ||
      (s = read_tensors(root, "outputs", &a->outputs, &a->num_outputs)) || (s = read_params(a, root, data_start)) ||
      (s = read_assertions(a, root)) ||
      (s = read_sections(root, data_start, a->map_size, a->map, &object, &object_size)) ||
      (s = layout_descriptors(a)))
    return s;
  const disc_json *entry = disc_json_get(root, "entry");
  if (!entry || entry->kind != DISC_JSON_STRING)
    return fail(RAL_ERR_INVALID_ARGUMENT, "header: \"entry\" is %s, expected a string",
                entry ? disc_json_kind_name(entry->kind) : "missing");
  link_dim_variables(a);
  if ((s = check_target(root)) || (s = load_object(a, object, object_size)) || (s = find_entries(a, root))) return s;
  return RAL_OK;
}

ral_status disc_artifact_load(ral_runtime *rt, const char *path, disc_artifact **out) {
  if (!out) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_artifact_load: out is NULL");
  *out = NULL;
  if (!rt || !path) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_artifact_load: the runtime or the path is NULL");
  disc_artifact *a = calloc(1, sizeof *a);
  if (!a) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory loading '%s'", path);
  a->rt = rt;
  ral_status s = load(a, path);
  if (s) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "cannot load the artifact '%.400s': ", path);
    prefix_error(prefix);
    disc_artifact_free(a);
    return s;
  }
  *out = a;
  return RAL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* calls                                                                                      */

typedef struct {
  void *owned;       /* the buffer to give back with ral_buffer_free (NULL: none) */
  const void *data;  /* its first element (NULL when empty) */
  int64_t *shape;    /* [rank], in the call's shapes buffer */
} output;

struct disc_call {
  const disc_artifact *a;
  int64_t *arg_desc;    /* every argument's descriptor (inputs, then params) */
  void **args;          /* args[k]: argument k's descriptor */
  unsigned char *bound; /* [num_inputs] */
  int64_t *result_desc; /* the entry's results */
  int64_t *out_shapes;  /* the outputs' shapes, one after the other */
  output *outputs;
  int have_outputs;
};

/* Row-major strides of `sizes` into `strides` (elements). */
static void row_major(int rank, const int64_t *sizes, int64_t *strides) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    strides[d] = s;
    s *= sizes[d] > 0 ? sizes[d] : 1;
  }
}

static void write_descriptor(int64_t *desc, const void *data, int rank, const int64_t *sizes) {
  desc[0] = desc[1] = (int64_t)(intptr_t)data;
  desc[2] = 0;
  memcpy(desc + 3, sizes, (size_t)rank * sizeof(int64_t));
  row_major(rank, sizes, desc + 3 + rank);
}

ral_status disc_call_create(const disc_artifact *a, disc_call **out) {
  if (!out) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_call_create: out is NULL");
  *out = NULL;
  if (!a) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_call_create: the artifact is NULL");
  disc_call *c = calloc(1, sizeof *c);
  int num_args = a->num_inputs + a->num_params;
  size_t shape_words = 0;
  for (int i = 0; i < a->num_outputs; i++) shape_words += (size_t)a->outputs[i].spec.rank;
  if (c) {
    c->a = a;
    c->arg_desc = calloc(a->total_arg_words + 1, sizeof(int64_t));
    c->args = calloc((size_t)num_args + 1, sizeof(void *));
    c->bound = calloc((size_t)a->num_inputs + 1, 1);
    c->result_desc = calloc(a->total_result_words + 1, sizeof(int64_t));
    c->out_shapes = calloc(shape_words + 1, sizeof(int64_t));
    c->outputs = calloc((size_t)a->num_outputs + 1, sizeof(output));
  }
  if (!c || !c->arg_desc || !c->args || !c->bound || !c->result_desc || !c->out_shapes || !c->outputs) {
    disc_call_free(c);
    return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory creating a call");
  }
  for (int k = 0; k < num_args; k++) c->args[k] = c->arg_desc + a->arg_words[k];
  /* parameters: the mapped bytes, the same in every call (each call has its own descriptors) */
  for (int k = 0; k < a->num_params; k++) {
    const param_info *p = &a->params[k];
    write_descriptor(c->arg_desc + a->arg_words[a->num_inputs + k], p->data, p->rank, p->sizes);
  }
  for (int i = 0, at = 0; i < a->num_outputs; i++) {
    c->outputs[i].shape = c->out_shapes + at;
    at += a->outputs[i].spec.rank;
  }
  *out = c;
  return RAL_OK;
}

static void release_outputs(disc_call *c) {
  for (int i = 0; i < c->a->num_outputs; i++) {
    if (c->outputs[i].owned) ral_buffer_free(c->a->rt, c->outputs[i].owned);
    c->outputs[i].owned = NULL;
    c->outputs[i].data = NULL;
  }
  c->have_outputs = 0;
}

void disc_call_free(disc_call *c) {
  if (!c) return;
  if (c->outputs) release_outputs(c);
  free(c->arg_desc);
  free(c->args);
  free(c->bound);
  free(c->result_desc);
  free(c->out_shapes);
  free(c->outputs);
  free(c);
}

/* "f32[b, 16]" */
static const char *describe(char *buf, size_t n, const disc_tensor_spec *spec) {
  size_t used = (size_t)snprintf(buf, n, "%s[", spec->dtype_name);
  for (int d = 0; d < spec->rank && used < n; d++) {
    if (spec->dim_names[d])
      used += (size_t)snprintf(buf + used, n - used, "%s%s", d ? ", " : "", spec->dim_names[d]);
    else
      used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)spec->dims[d]);
  }
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

ral_status disc_call_bind_input(disc_call *c, int i, const void *data, disc_dtype dtype, int rank,
                                const int64_t *shape, const int64_t *strides) {
  if (!c) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_call_bind_input: the call is NULL");
  const disc_artifact *a = c->a;
  if (i < 0 || i >= a->num_inputs)
    return fail(RAL_ERR_INVALID_ARGUMENT, "input %d out of range: the function takes %d inputs", i, a->num_inputs);
  c->bound[i] = 0; /* a failed bind leaves the input unbound, not bound to the previous buffer */
  const disc_tensor_spec *spec = &a->inputs[i].spec;
  char want[256], got[256];
  describe(want, sizeof want, spec);
  if (dtype != spec->dtype)
    return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d): expected element type %s (%s), got %s", spec->name, i,
                spec->dtype_name, want, disc_dtype_name(dtype));
  if (rank != spec->rank)
    return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d): expected rank %d (%s), got rank %d", spec->name, i,
                spec->rank, want, rank);
  if (rank > 0 && !shape)
    return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d): the shape is NULL", spec->name, i);
  format_shape(got, sizeof got, rank, shape);
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0)
      return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d) dim %d: negative size %lld (shape %s)", spec->name, i, d,
                  (long long)shape[d], got);
    if (spec->dims[d] >= 0 && shape[d] != spec->dims[d])
      return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d) dim %d: expected size %lld (%s), got %lld (shape %s)",
                  spec->name, i, d, (long long)spec->dims[d], want, (long long)shape[d], got);
  }
  int64_t numel;
  size_t bytes;
  if (!shape_bytes(rank, shape, disc_dtype_size(dtype), &numel, &bytes))
    return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d): shape %s is too large", spec->name, i, got);
  if (numel > 0 && !data)
    return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d): data is NULL for %lld elements", spec->name, i,
                (long long)numel);
  if (strides && numel > 0) { /* dims of size 1 take no step: their stride is free */
    int64_t expected = 1;
    for (int d = rank - 1; d >= 0; d--) {
      if (shape[d] != 1 && strides[d] != expected)
        return fail(RAL_ERR_INVALID_ARGUMENT,
                    "input '%s' (%d): not contiguous: dim %d has stride %lld, row-major order needs %lld (shape %s); "
                    "copy it to a contiguous buffer first",
                    spec->name, i, d, (long long)strides[d], (long long)expected, got);
      expected *= shape[d];
    }
  }
  write_descriptor(c->args[i], data, rank, shape);
  c->bound[i] = 1;
  return RAL_OK;
}

/* Step 2 of the calling convention, beyond what binding checked: every input is bound and each
 * dimension variable has one value. */
static ral_status check_inputs(const disc_call *c) {
  const disc_artifact *a = c->a;
  for (int i = 0; i < a->num_inputs; i++)
    if (!c->bound[i])
      return fail(RAL_ERR_INVALID_ARGUMENT, "input '%s' (%d) is not bound (the function takes %d inputs)",
                  a->inputs[i].spec.name, i, a->num_inputs);
  for (int i = 0; i < a->num_inputs; i++) {
    const tensor_info *t = &a->inputs[i];
    const int64_t *sizes = (const int64_t *)c->args[i] + 3;
    for (int d = 0; d < t->spec.rank; d++) {
      int fi = t->first_input[d], fd = t->first_dim[d];
      if (fi < 0 || (fi == i && fd == d)) continue;
      int64_t first = ((const int64_t *)c->args[fi])[3 + fd];
      if (first != sizes[d]) {
        char got[256];
        return fail(RAL_ERR_INVALID_ARGUMENT,
                    "input '%s' (%d) dim %d: dimension variable '%s' is %lld from input '%s' (%d) dim %d, but %lld "
                    "here (shape %s)",
                    t->spec.name, i, d, t->dim_names[d], (long long)first, a->inputs[fi].spec.name, fi, fd,
                    (long long)sizes[d], format_shape(got, sizeof got, t->spec.rank, sizes));
      }
    }
  }
  return RAL_OK;
}

/* The message of assertion k with its {j} placeholders replaced by values[j]. */
static void format_assertion(char *out, size_t n, const char *message, const int64_t *values, int64_t num_values) {
  size_t used = 0;
  for (const char *p = message; *p && used + 1 < n;) {
    if (*p == '{' && p[1] >= '0' && p[1] <= '9') {
      const char *q = p + 1;
      int64_t j = 0;
      while (*q >= '0' && *q <= '9' && j < 1000000) j = j * 10 + (*q++ - '0');
      if (*q == '}' && j < num_values) {
        used += (size_t)snprintf(out + used, n - used, "%lld", (long long)values[j]);
        p = q + 1;
        continue;
      }
    }
    out[used++] = *p++;
  }
  out[used < n ? used : n - 1] = '\0';
}

/* Step 3: the guard's [failed, values...]. */
static ral_status check_guard(const disc_call *c, ral_context *ctx) {
  const disc_artifact *a = c->a;
  int64_t result[5] = {0}; /* a rank-1 descriptor */
  if (ral_context_call(ctx, a->guard, c->args, result) != RAL_OK)
    return fail(ral_context_status(ctx), "the shape guard failed: %s", ral_context_message(ctx));
  const int64_t *values = (const int64_t *)(intptr_t)result[1];
  int64_t size = result[3];
  if (!values || size < 1) return fail(RAL_ERR_INTERNAL, "the shape guard returned an empty result");
  values += result[2];
  int64_t failed = values[0];
  if (failed == -1) return RAL_OK;
  if (failed < 0 || failed >= a->num_assertions)
    return fail(RAL_ERR_INTERNAL, "the shape guard reported assertion %lld, the header lists %d", (long long)failed,
                a->num_assertions);
  int64_t start = 1;
  for (int64_t k = 0; k < failed; k++) start += a->assertions[k].num_values;
  const assertion_info *as = &a->assertions[failed];
  if (start + as->num_values > size)
    return fail(RAL_ERR_INTERNAL, "the shape guard returned %lld values, assertion %lld needs %lld", (long long)size,
                (long long)failed, (long long)(start + as->num_values));
  char message[sizeof last_error];
  format_assertion(message, sizeof message, as->message, values + start, as->num_values);
  return fail(RAL_ERR_INVALID_ARGUMENT, "%s", message);
}

/* Copies a strided view into contiguous row-major memory. */
static void copy_strided(char *dst, const char *src, int rank, const int64_t *sizes, const int64_t *strides,
                         size_t elem, int64_t numel, int64_t *index) {
  for (int d = 0; d < rank; d++) index[d] = 0;
  for (int64_t n = 0; n < numel; n++) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off += index[d] * strides[d];
    memcpy(dst + (size_t)n * elem, src + off * (int64_t)elem, elem);
    for (int d = rank - 1; d >= 0; d--) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

/* Step 5: each result becomes an output owned by the call: taken from the context when it is
 * contiguous and the context allocated it, else copied (it aliases an input, a parameter or
 * another result, or is a strided view). */
static ral_status take_outputs(disc_call *c, ral_context *ctx) {
  const disc_artifact *a = c->a;
  int64_t index[MAX_RANK];
  for (int i = 0; i < a->num_outputs; i++) {
    const disc_tensor_spec *spec = &a->outputs[i].spec;
    const int64_t *desc = c->result_desc + a->result_words[i];
    int rank = spec->rank;
    const int64_t *sizes = desc + 3, *strides = desc + 3 + rank;
    size_t elem = disc_dtype_size(spec->dtype);
    int64_t numel;
    size_t bytes;
    char shape[256];
    format_shape(shape, sizeof shape, rank, sizes);
    if (!shape_bytes(rank, sizes, elem, &numel, &bytes))
      return fail(RAL_ERR_INTERNAL, "output '%s' (%d): the entry returned an invalid shape %s", spec->name, i, shape);
    for (int d = 0; d < rank; d++)
      if (spec->dims[d] >= 0 && sizes[d] != spec->dims[d])
        return fail(RAL_ERR_INTERNAL, "output '%s' (%d) dim %d: the entry returned size %lld, the header says %lld",
                    spec->name, i, d, (long long)sizes[d], (long long)spec->dims[d]);
    output *o = &c->outputs[i];
    memcpy(o->shape, sizes, (size_t)rank * sizeof(int64_t));
    if (numel == 0) continue;
    void *allocated = (void *)(intptr_t)desc[0];
    const char *first = (const char *)(intptr_t)desc[1] + desc[2] * (int64_t)elem;
    if (!desc[1]) return fail(RAL_ERR_INTERNAL, "output '%s' (%d): the entry returned a NULL buffer", spec->name, i);
    int contiguous = 1; /* row-major (dims of size 1 take no step, so any stride will do) */
    for (int64_t d = rank - 1, expected = 1; d >= 0; d--) {
      if (sizes[d] != 1 && strides[d] != expected) contiguous = 0;
      expected *= sizes[d];
    }
    if (contiguous && allocated && ral_context_take(ctx, allocated)) {
      o->owned = allocated;
      o->data = first;
      continue;
    }
    void *copy = ral_alloc(ctx, bytes);
    if (!copy)
      return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory copying output '%s' (%d) (%zu bytes)", spec->name, i, bytes);
    ral_context_take(ctx, copy);
    o->owned = copy;
    o->data = copy;
    if (contiguous)
      memcpy(copy, first, bytes);
    else
      copy_strided(copy, first, rank, sizes, strides, elem, numel, index);
  }
  return RAL_OK;
}

ral_status disc_call_run(disc_call *c) {
  if (!c) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_call_run: the call is NULL");
  const disc_artifact *a = c->a;
  release_outputs(c);
  ral_status s = check_inputs(c);
  if (s) return s;
  ral_context *ctx;
  if (ral_context_create(a->rt, &ctx) != RAL_OK) return fail(RAL_ERR_OUT_OF_MEMORY, "out of memory creating a context");
  ral_context *previous = ral_context_enter(ctx);
  if (a->guard) s = check_guard(c, ctx);
  if (!s) {
    memset(c->result_desc, 0, a->total_result_words * sizeof(int64_t));
    if (ral_context_call(ctx, a->entry, c->args, c->result_desc) != RAL_OK)
      s = fail(ral_context_status(ctx), "%s", ral_context_message(ctx));
  }
  if (!s) s = take_outputs(c, ctx);
  ral_context_enter(previous);
  ral_context_destroy(ctx);
  if (s)
    release_outputs(c);
  else
    c->have_outputs = 1;
  return s;
}

ral_status disc_call_output(const disc_call *c, int i, const void **data, int *rank, const int64_t **shape) {
  if (!c) return fail(RAL_ERR_INVALID_ARGUMENT, "disc_call_output: the call is NULL");
  if (i < 0 || i >= c->a->num_outputs)
    return fail(RAL_ERR_INVALID_ARGUMENT, "output %d out of range: the function has %d outputs", i, c->a->num_outputs);
  if (!c->have_outputs) return fail(RAL_ERR_INVALID_ARGUMENT, "no outputs: the last disc_call_run did not succeed");
  if (data) *data = c->outputs[i].data;
  if (rank) *rank = c->a->outputs[i].spec.rank;
  if (shape) *shape = c->outputs[i].shape;
  return RAL_OK;
}
