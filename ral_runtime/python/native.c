/* disc_stablehlo's call path for host (x86) functions, in C: from the caller's numpy arrays to the
 * compiled entry and back, with no per-call Python work but wrapping the results.
 *
 * A plan (one per loaded function) holds the entry and guard, the arguments' dtypes and dims,
 * and the parameters' memref descriptors, built once. call(plan, arrays) checks that each array
 * is an ndarray of the exact dtype, C-contiguous, with the static sizes and consistent dimension
 * variables of the signature; where one is not, it returns None and the caller takes the general
 * path (conversions, and the error naming the argument). Otherwise it builds the descriptors,
 * and, without the GIL, creates the call's context, runs the guard and the entry through the RAL
 * and takes the results' buffers. The RAL's entry points come from the library the package
 * loaded (bind), so this module links against nothing but Python (the stable ABI: one build
 * serves every Python from 3.11). */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANK 32

/* the RAL's C API (ral/ral.h), bound at run time */
typedef void (*entry_fn)(void *args, void *results);
static struct {
  int (*context_create)(void *rt, void **out);
  void (*context_destroy)(void *ctx);
  void *(*context_enter)(void *ctx);
  int (*context_call)(void *ctx, entry_fn entry, void *args, void *results);
  const char *(*context_message)(const void *ctx);
  int (*context_take)(void *ctx, void *ptr);
  void (*buffer_free)(void *rt, void *ptr);
} ral;

/* numpy's array object as its C ABI lays it out (numpy/ndarraytypes.h, PyArrayObject_fields,
 * unchanged since numpy 1.7: what PyArray_DATA and the other accessor macros read in every
 * extension built against numpy), read for exact ndarrays only: a buffer export per argument
 * costs a quarter of a microsecond, reading these a few nanoseconds. */
typedef struct {
  PyObject_HEAD
  char *data;
  int nd;
  Py_ssize_t *dimensions, *strides;
  PyObject *base, *descr;
  int flags;
} numpy_array;
#define NUMPY_C_CONTIGUOUS 0x0001

typedef struct {
  PyObject *dtype; /* the exact dtype object an argument must have */
  int rank;
  int64_t dims[MAX_RANK]; /* >= 0: a static size; -1 - k: dimension variable k */
} arg_spec;

typedef struct {
  void *rt;
  PyObject *runtime; /* kept alive by every result buffer: its finalizer destroys `rt` */
  PyObject *ndarray; /* numpy.ndarray */
  entry_fn entry, guard;
  int num_args, num_vars, num_params, num_results;
  arg_spec *args;
  int64_t *param_words; /* the parameters' descriptors, laid out as the arguments' */
  size_t num_param_words;
  PyObject *params; /* the parameter arrays (their memory) */
  int *param_ranks;
  int *result_ranks;
  Py_ssize_t *result_itemsizes;
  size_t result_words;
  int64_t calls, entry_ns; /* calls of the entry, and the time in it (atomics): the call path's cost is the rest */
} plan;

/* ------------------------------------------------------------------------------------------ */
/* result buffers: a RAL block owned by a Python object (the base of the result's ndarray)      */

typedef struct {
  PyObject_HEAD
  void *rt, *allocated, *data;
  Py_ssize_t len;
  PyObject *runtime;
} ral_buffer;

static int buffer_get(PyObject *self, Py_buffer *view, int flags) {
  ral_buffer *b = (ral_buffer *)self;
  return PyBuffer_FillInfo(view, self, b->data, b->len, 0, flags);
}

static void buffer_dealloc(PyObject *self) {
  ral_buffer *b = (ral_buffer *)self;
  PyTypeObject *type = Py_TYPE(self);
  ral.buffer_free(b->rt, b->allocated);
  Py_XDECREF(b->runtime);
  freefunc free_self = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free_self(self);
  Py_DECREF(type);
}

static PyType_Slot buffer_slots[] = {
    {Py_tp_dealloc, buffer_dealloc},
    {Py_bf_getbuffer, buffer_get},
    {Py_tp_doc, "A result's buffer from the RAL's allocator, given back when the array dies."},
    {0, NULL},
};

static PyType_Spec buffer_spec = {"disc_stablehlo._native.RalBuffer", sizeof(ral_buffer), 0, Py_TPFLAGS_DEFAULT, buffer_slots};
static PyObject *buffer_type;

/* ------------------------------------------------------------------------------------------ */
/* plans                                                                                      */

static void plan_free(PyObject *capsule) {
  plan *p = PyCapsule_GetPointer(capsule, "disc_plan");
  if (!p) return;
  for (int i = 0; i < p->num_args; i++) Py_XDECREF(p->args[i].dtype);
  Py_XDECREF(p->runtime);
  Py_XDECREF(p->ndarray);
  Py_XDECREF(p->params);
  free(p->args);
  free(p->param_words);
  free(p->param_ranks);
  free(p->result_ranks);
  free(p->result_itemsizes);
  free(p);
}

static int as_pointer(PyObject *o, void **out) {
  *out = PyLong_AsVoidPtr(o);
  return !PyErr_Occurred();
}

/* The memref descriptor of a C-contiguous array: allocated and aligned pointer, offset 0,
 * sizes, strides in elements. */
static int64_t *put_descriptor(int64_t *w, const void *data, int rank, const Py_ssize_t *shape) {
  *w++ = (int64_t)(intptr_t)data;
  *w++ = (int64_t)(intptr_t)data;
  *w++ = 0;
  for (int i = 0; i < rank; i++) *w++ = shape[i];
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; i--) {
    w[i] = stride;
    stride *= shape[i];
  }
  return w + rank;
}

/* The parameters' descriptors, once (0: failed, with the Python error set). */
static int plan_params(plan *p, PyObject *params) {
  for (int i = 0; i < p->num_params; i++) {
    const numpy_array *x = (const numpy_array *)PyList_GetItem(params, i);
    if (!x || Py_TYPE((PyObject *)x) != (PyTypeObject *)p->ndarray || !(x->flags & NUMPY_C_CONTIGUOUS)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "parameters must be C-contiguous numpy arrays");
      return 0;
    }
    p->param_ranks[i] = x->nd;
    p->num_param_words += 3 + 2 * (size_t)x->nd;
  }
  if (!(p->param_words = malloc((p->num_param_words + 1) * sizeof(int64_t)))) return PyErr_NoMemory(), 0;
  int64_t *w = p->param_words;
  for (int i = 0; i < p->num_params; i++) {
    const numpy_array *x = (const numpy_array *)PyList_GetItem(params, i);
    w = put_descriptor(w, x->data, x->nd, x->dimensions);
  }
  return 1;
}

/* plan(runtime, rt, entry, guard, ndarray, args, num_vars, params, results): `args` a list of
 * (dtype, dims) with dims ints (static) or -1 - k (variable k); `params` C-contiguous arrays;
 * `results` a list of (rank, itemsize). */
static PyObject *make_plan(PyObject *self, PyObject *a) {
  (void)self;
  PyObject *runtime, *rt_o, *entry_o, *guard_o, *ndarray, *args, *params, *ranks;
  int num_vars;
  if (!PyArg_ParseTuple(a, "OOOOOOiOO", &runtime, &rt_o, &entry_o, &guard_o, &ndarray, &args, &num_vars, &params, &ranks))
    return NULL;
  plan *p = calloc(1, sizeof *p);
  if (!p) return PyErr_NoMemory();
  PyObject *capsule = PyCapsule_New(p, "disc_plan", plan_free);
  if (!capsule) {
    free(p);
    return NULL;
  }
  void *entry, *guard;
  if (!as_pointer(rt_o, &p->rt) || !as_pointer(entry_o, &entry) || !as_pointer(guard_o, &guard)) goto fail;
  p->entry = (entry_fn)entry;
  p->guard = (entry_fn)guard;
  p->runtime = Py_NewRef(runtime);
  p->ndarray = Py_NewRef(ndarray);
  p->num_vars = num_vars;
  p->num_args = (int)PyList_Size(args);
  p->num_params = (int)PyList_Size(params);
  p->num_results = (int)PyList_Size(ranks);
  if (p->num_args < 0 || p->num_params < 0 || p->num_results < 0) goto fail;
  p->args = calloc((size_t)p->num_args + 1, sizeof(arg_spec));
  p->param_ranks = calloc((size_t)p->num_params + 1, sizeof(int));
  p->result_ranks = calloc((size_t)p->num_results + 1, sizeof(int));
  p->result_itemsizes = calloc((size_t)p->num_results + 1, sizeof(Py_ssize_t));
  if (!p->args || !p->param_ranks || !p->result_ranks || !p->result_itemsizes) {
    PyErr_NoMemory();
    goto fail;
  }
  for (int i = 0; i < p->num_args; i++) {
    arg_spec *s = &p->args[i];
    PyObject *dtype, *dims;
    if (!PyArg_ParseTuple(PyList_GetItem(args, i), "OO", &dtype, &dims)) goto fail;
    s->dtype = Py_NewRef(dtype);
    s->rank = (int)PyTuple_Size(dims);
    if (PyErr_Occurred() || s->rank < 0 || s->rank > MAX_RANK) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rank out of range");
      goto fail;
    }
    for (int d = 0; d < s->rank; d++) s->dims[d] = PyLong_AsLongLong(PyTuple_GetItem(dims, d));
    if (PyErr_Occurred()) goto fail;
  }
  for (int i = 0; i < p->num_results; i++) {
    if (!PyArg_ParseTuple(PyList_GetItem(ranks, i), "in", &p->result_ranks[i], &p->result_itemsizes[i])) goto fail;
    if (p->result_ranks[i] < 0 || p->result_ranks[i] > MAX_RANK) {
      PyErr_SetString(PyExc_ValueError, "rank out of range");
      goto fail;
    }
    p->result_words += 3 + 2 * (size_t)p->result_ranks[i];
  }
  if (!plan_params(p, params)) goto fail;
  p->params = Py_NewRef(params);
  return capsule;
fail:
  Py_DECREF(capsule);
  return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* calls                                                                                      */

/* A result: (buffer or None, address of its first element, shape, strides in elements); the
 * buffer when the call's own block was taken for it (else the caller copies from the address:
 * an argument, a parameter or a constant returned). */
static PyObject *result_tuple(const plan *p, void *ctx, const int64_t *w, int rank, Py_ssize_t itemsize) {
  void *allocated = (void *)(intptr_t)w[0];
  const int64_t *sizes = w + 3, *strides = w + 3 + rank;
  PyObject *shape = PyTuple_New(rank), *steps = PyTuple_New(rank);
  if (!shape || !steps) goto fail;
  for (int i = 0; i < rank; i++) {
    PyObject *n = PyLong_FromLongLong(sizes[i]), *s = PyLong_FromLongLong(strides[i]);
    if (!n || !s) {
      Py_XDECREF(n);
      Py_XDECREF(s);
      goto fail;
    }
    PyTuple_SetItem(shape, i, n);
    PyTuple_SetItem(steps, i, s);
  }
  PyObject *owner = Py_None;
  int64_t count = 1;
  for (int i = 0; i < rank; i++) count *= sizes[i];
  int64_t stride = 1, contiguous = w[2] == 0;
  for (int i = rank - 1; i >= 0 && contiguous; i--) {
    contiguous = sizes[i] <= 1 || strides[i] == stride;
    stride *= sizes[i];
  }
  if (count > 0 && contiguous && ral.context_take(ctx, allocated)) {
    ral_buffer *b = PyObject_New(ral_buffer, (PyTypeObject *)buffer_type);
    if (!b) {
      ral.buffer_free(p->rt, allocated);
      goto fail;
    }
    b->rt = p->rt;
    b->allocated = allocated;
    b->data = (void *)(intptr_t)w[1];
    b->len = (Py_ssize_t)count * itemsize;
    b->runtime = Py_NewRef(p->runtime);
    owner = (PyObject *)b;
  } else {
    Py_INCREF(owner);
  }
  return Py_BuildValue("(NLNN)", owner, (long long)(w[1] + w[2] * itemsize), shape, steps);
fail:
  Py_XDECREF(shape);
  Py_XDECREF(steps);
  return NULL;
}

/* call(plan, arrays) -> the list of results (as result_tuple says), or None (an argument is not
 * exactly as compiled), or ("guard", values) when the guard failed (its words: the failed
 * assertion's index first), or ("error", status, message). */
static PyObject *call(PyObject *self, PyObject *a) {
  (void)self;
  PyObject *capsule, *arrays;
  if (!PyArg_ParseTuple(a, "OO", &capsule, &arrays)) return NULL;
  plan *p = PyCapsule_GetPointer(capsule, "disc_plan");
  if (!p) return NULL;
  Py_ssize_t n = PySequence_Size(arrays);
  if (n < 0) return NULL;
  if (n != p->num_args) Py_RETURN_NONE;
  int64_t vars[p->num_vars > 0 ? p->num_vars : 1];
  for (int v = 0; v < p->num_vars; v++) vars[v] = -1;
  PyObject *held[p->num_args > 0 ? p->num_args : 1]; /* the arguments, referenced through the call */
  size_t words = p->num_param_words;
  int got = 0, exact = 1;
  for (; got < p->num_args && exact; got++) {
    const arg_spec *s = &p->args[got];
    const numpy_array *x = (const numpy_array *)(held[got] = PySequence_GetItem(arrays, got));
    if (!x) {
      for (int k = 0; k < got; k++) Py_DECREF(held[k]);
      return NULL;
    }
    exact = Py_TYPE(held[got]) == (PyTypeObject *)p->ndarray && x->descr == s->dtype && x->nd == s->rank && (x->flags & NUMPY_C_CONTIGUOUS);
    for (int d = 0; exact && d < s->rank; d++) {
      int64_t want = s->dims[d], size = x->dimensions[d];
      if (want >= 0)
        exact = want == size;
      else if (vars[-1 - want] < 0)
        vars[-1 - want] = size;
      else
        exact = vars[-1 - want] == size;
    }
    words += 3 + 2 * (size_t)s->rank;
  }
  int64_t *buf = exact ? malloc((words + (size_t)p->num_args + (size_t)p->num_params + p->result_words + 1) * sizeof(int64_t)) : NULL;
  if (!buf) {
    for (int k = 0; k < got; k++) Py_DECREF(held[k]);
    if (exact) return PyErr_NoMemory();
    Py_RETURN_NONE;
  }
  /* descriptors (the arguments', then the parameters'), a pointer to each, the results' words */
  size_t count = (size_t)p->num_args + (size_t)p->num_params;
  int64_t *w = buf, **ptrs = (int64_t **)(buf + words), *results = buf + words + count, guard_words[5] = {0};
  for (int i = 0; i < p->num_args; i++) {
    const numpy_array *x = (const numpy_array *)held[i];
    ptrs[i] = w;
    w = put_descriptor(w, x->data, x->nd, x->dimensions);
  }
  memcpy(w, p->param_words, p->num_param_words * sizeof(int64_t));
  for (int i = 0; i < p->num_params; i++) {
    ptrs[p->num_args + i] = w;
    w += 3 + 2 * p->param_ranks[i];
  }
  void *ctx = NULL;
  int status = 0, guard_failed = 0;
  const char *message = "";
  Py_BEGIN_ALLOW_THREADS
  status = ral.context_create(p->rt, &ctx);
  if (status == 0) {
    void *previous = ral.context_enter(ctx);
    if (p->guard) {
      status = ral.context_call(ctx, p->guard, ptrs, guard_words);
      guard_failed = status == 0 && guard_words[3] > 0 && ((int64_t *)(intptr_t)guard_words[1])[guard_words[2]] >= 0;
    }
    if (status == 0 && !guard_failed) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      status = ral.context_call(ctx, p->entry, ptrs, results);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      __atomic_fetch_add(&p->calls, 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&p->entry_ns, (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec), __ATOMIC_RELAXED);
    }
    if (status != 0) message = ral.context_message(ctx);
    ral.context_enter(previous);
  }
  Py_END_ALLOW_THREADS
  for (int k = 0; k < got; k++) Py_DECREF(held[k]);
  PyObject *out = NULL;
  if (!ctx) {
    out = Py_BuildValue("(sis)", "error", status, "cannot create a runtime context");
  } else if (status != 0) {
    out = Py_BuildValue("(sis)", "error", status, message);
  } else if (guard_failed) {
    const int64_t *values = (const int64_t *)(intptr_t)guard_words[1] + guard_words[2];
    PyObject *t = PyTuple_New((Py_ssize_t)guard_words[3]);
    for (int64_t i = 0; t && i < guard_words[3]; i++) PyTuple_SetItem(t, (Py_ssize_t)i, PyLong_FromLongLong(values[i]));
    out = t ? Py_BuildValue("(sN)", "guard", t) : NULL;
  } else {
    PyObject *list = PyList_New(p->num_results);
    const int64_t *r = results;
    for (int i = 0; list && i < p->num_results; i++) {
      PyObject *item = result_tuple(p, ctx, r, p->result_ranks[i], p->result_itemsizes[i]);
      if (!item) {
        Py_CLEAR(list);
        break;
      }
      PyList_SetItem(list, i, item);
      r += 3 + 2 * p->result_ranks[i];
    }
    out = list;
  }
  if (ctx) ral.context_destroy(ctx);
  free(buf);
  return out;
}

/* entry_time(plan) -> (calls, ns): how often the entry ran, and for how long in all. */
static PyObject *entry_time(PyObject *self, PyObject *capsule) {
  (void)self;
  plan *p = PyCapsule_GetPointer(capsule, "disc_plan");
  if (!p) return NULL;
  return Py_BuildValue("(LL)", (long long)__atomic_load_n(&p->calls, __ATOMIC_RELAXED),
                       (long long)__atomic_load_n(&p->entry_ns, __ATOMIC_RELAXED));
}

/* bind(context_create, context_destroy, context_enter, context_call, context_message,
 * context_take, buffer_free): the addresses of the RAL's entry points. */
static PyObject *bind(PyObject *self, PyObject *a) {
  (void)self;
  PyObject *f[7];
  if (!PyArg_ParseTuple(a, "OOOOOOO", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6])) return NULL;
  void *addr[7];
  for (int i = 0; i < 7; i++)
    if (!as_pointer(f[i], &addr[i])) return NULL;
  memcpy(&ral.context_create, &addr[0], sizeof(void *));
  memcpy(&ral.context_destroy, &addr[1], sizeof(void *));
  memcpy(&ral.context_enter, &addr[2], sizeof(void *));
  memcpy(&ral.context_call, &addr[3], sizeof(void *));
  memcpy(&ral.context_message, &addr[4], sizeof(void *));
  memcpy(&ral.context_take, &addr[5], sizeof(void *));
  memcpy(&ral.buffer_free, &addr[6], sizeof(void *));
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Binds the RAL's entry points (their addresses)."},
    {"plan", make_plan, METH_VARARGS, "A loaded function's call plan."},
    {"call", call, METH_VARARGS, "Calls a plan's function on numpy arrays exactly as compiled (else None)."},
    {"entry_time", entry_time, METH_O, "(calls, ns): the plan's entry calls and the time spent in them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "disc_stablehlo's host call path in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  buffer_type = PyType_FromSpec(&buffer_spec);
  if (!buffer_type || PyModule_AddObject(m, "RalBuffer", Py_NewRef(buffer_type)) != 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
