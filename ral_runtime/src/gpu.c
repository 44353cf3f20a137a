/* The RAL's GPU device: CUDA's driver and cuBLAS, or ROCm's HIP runtime and hipBLAS, loaded with
 * dlopen (building needs neither), a caching device allocator, caches of modules, kernels and
 * constants, and launches, copies and GEMMs on each context's stream. See ral/ral.h. One
 * implementation for both APIs: HIP's module API mirrors CUDA's driver API call for call, so the
 * device calls through one table loaded by either API's names; the few calls whose signatures
 * differ go through adapters. */
#define _GNU_SOURCE
#include "ral/ral.h"
#include "ral_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* the APIs' types and entry points (no CUDA or HIP headers)                                  */

typedef int CUresult; /* hipError_t: the codes used here (success, out of memory, invalid image) are CUDA's */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr; /* HIP's is void *: passed alike */
typedef struct cublasContext *cublasHandle_t;
typedef int cublasStatus_t; /* 0: success in both */

enum { CUDA_SUCCESS = 0, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_INVALID_IMAGE = 200 };
enum { CUBLAS_DEFAULT_MATH = 0 };
enum { API_CUDA = 0, API_HIP = 1 }; /* ral_runtime_gpu_kind() - 1 */

/* What differs between the APIs beyond the calls' names. */
static const struct {
  const char *name, *driver, *blas; /* in messages */
  int op_n, op_t;                   /* the BLAS's operations: not transposed, transposed */
  const char *blas_status[16];      /* the BLAS's statuses' names by value */
} apis[2] = {
    {"CUDA", "CUDA driver", "cuBLAS", 0, 1,
     {[1] = "CUBLAS_STATUS_NOT_INITIALIZED", [3] = "CUBLAS_STATUS_ALLOC_FAILED", [7] = "CUBLAS_STATUS_INVALID_VALUE",
      [8] = "CUBLAS_STATUS_ARCH_MISMATCH", [11] = "CUBLAS_STATUS_MAPPING_ERROR",
      [13] = "CUBLAS_STATUS_EXECUTION_FAILED", [14] = "CUBLAS_STATUS_INTERNAL_ERROR",
      [15] = "CUBLAS_STATUS_NOT_SUPPORTED"}},
    {"HIP", "HIP runtime", "hipBLAS", 111, 112,
     {[1] = "HIPBLAS_STATUS_NOT_INITIALIZED", [2] = "HIPBLAS_STATUS_ALLOC_FAILED", [3] = "HIPBLAS_STATUS_INVALID_VALUE",
      [4] = "HIPBLAS_STATUS_MAPPING_ERROR", [5] = "HIPBLAS_STATUS_EXECUTION_FAILED",
      [6] = "HIPBLAS_STATUS_INTERNAL_ERROR", [7] = "HIPBLAS_STATUS_NOT_SUPPORTED", [8] = "HIPBLAS_STATUS_ARCH_MISMATCH",
      [9] = "HIPBLAS_STATUS_HANDLE_IS_NULLPTR", [10] = "HIPBLAS_STATUS_INVALID_ENUM", [11] = "HIPBLAS_STATUS_UNKNOWN"}},
};

/* (CUDA's call, its symbol's version suffix, HIP's call, parameters): the calls of the same
 * signature in both APIs, each a field of the device named by CUDA's call. */
#define DRIVER_CALLS(X)                                                                                                \
  X(cuInit, , hipInit, (unsigned flags))                                                                               \
  X(cuDeviceGet, , hipDeviceGet, (CUdevice * device, int ordinal))                                                     \
  X(cuDevicePrimaryCtxRetain, , hipDevicePrimaryCtxRetain, (CUcontext * context, CUdevice device))                     \
  X(cuDevicePrimaryCtxRelease, , hipDevicePrimaryCtxRelease, (CUdevice device))                                        \
  X(cuCtxSetCurrent, , hipCtxSetCurrent, (CUcontext context))                                                          \
  X(cuMemAlloc, _v2, hipMalloc, (CUdeviceptr * ptr, size_t bytes))                                                     \
  X(cuMemFree, _v2, hipFree, (CUdeviceptr ptr))                                                                        \
  X(cuMemcpyHtoDAsync, _v2, hipMemcpyHtoDAsync, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))     \
  X(cuMemcpyDtoHAsync, _v2, hipMemcpyDtoHAsync, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))           \
  X(cuMemcpyDtoDAsync, _v2, hipMemcpyDtoDAsync, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))     \
  X(cuStreamSynchronize, , hipStreamSynchronize, (CUstream stream))                                                    \
  X(cuModuleLoadData, , hipModuleLoadData, (CUmodule * module, const void *image))                                     \
  X(cuModuleUnload, , hipModuleUnload, (CUmodule module))                                                              \
  X(cuModuleGetFunction, , hipModuleGetFunction, (CUfunction * function, CUmodule module, const char *name))           \
  X(cuLaunchKernel, , hipModuleLaunchKernel,                                                                           \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned block_y,              \
     unsigned block_z, unsigned shared_bytes, CUstream stream, void **params, void **extra))

#define BLAS_CALLS(X)                                                                                                  \
  X(cublasCreate, _v2, hipblasCreate, (cublasHandle_t * handle))                                                       \
  X(cublasDestroy, _v2, hipblasDestroy, (cublasHandle_t handle))                                                       \
  X(cublasSetStream, _v2, hipblasSetStream, (cublasHandle_t handle, CUstream stream))                                  \
  X(cublasSgemmStridedBatched, , hipblasSgemmStridedBatched,                                                           \
    (cublasHandle_t handle, int trans_a, int trans_b, int m, int n, int k, const float *alpha, const float *a,         \
     int lda, long long stride_a, const float *b, int ldb, long long stride_b, const float *beta, float *c,            \
     int ldc, long long stride_c, int count))                                                                          \
  X(cublasDgemmStridedBatched, , hipblasDgemmStridedBatched,                                                           \
    (cublasHandle_t handle, int trans_a, int trans_b, int m, int n, int k, const double *alpha, const double *a,       \
     int lda, long long stride_a, const double *b, int ldb, long long stride_b, const double *beta, double *c,         \
     int ldc, long long stride_c, int count))                                                                          \
  X(cublasSgemmBatched, , hipblasSgemmBatched,                                                                         \
    (cublasHandle_t handle, int trans_a, int trans_b, int m, int n, int k, const float *alpha,                         \
     const float *const a[], int lda, const float *const b[], int ldb, const float *beta, float *const c[],            \
     int ldc, int count))                                                                                              \
  X(cublasDgemmBatched, , hipblasDgemmBatched,                                                                         \
    (cublasHandle_t handle, int trans_a, int trans_b, int m, int n, int k, const double *alpha,                        \
     const double *const a[], int lda, const double *const b[], int ldb, const double *beta, double *const c[],        \
     int ldc, int count))

/* Each call's name in messages, by API (CUDA's without its version suffix): CALL(g, cuInit). */
enum {
#define CALL_ID(cu, v2, hip, params) CALL_##cu,
  DRIVER_CALLS(CALL_ID) BLAS_CALLS(CALL_ID)
#undef CALL_ID
  CALL_cuMemsetD2D8Async
};
static const char *const call_names[][2] = {
#define CALL_NAMES(cu, v2, hip, params) {#cu, #hip},
    DRIVER_CALLS(CALL_NAMES) BLAS_CALLS(CALL_NAMES)
#undef CALL_NAMES
    {"cuMemsetD2D8Async", "hipMemset2DAsync"}};
#define CALL(g, cu) call_names[CALL_##cu][(g)->api]

/* ------------------------------------------------------------------------------------------ */
/* chained hash tables of intrusive nodes (each lookup compares its own keys)                  */

typedef struct hash_node {
  struct hash_node *next;
  uint64_t hash;
} hash_node;

typedef struct {
  hash_node **buckets;
  size_t mask, count; /* mask + 1 buckets, a power of two */
} hash_table;

static uint64_t hash_of(const void *key, const void *name) {
  uint64_t h = ((uint64_t)(uintptr_t)key ^ ((uint64_t)(uintptr_t)name << 1)) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 32);
}

static int hash_init(hash_table *t) {
  t->mask = 63;
  t->buckets = calloc(t->mask + 1, sizeof(hash_node *));
  return t->buckets != NULL;
}

static hash_node *hash_chain(const hash_table *t, uint64_t h) { return t->buckets[h & t->mask]; }

static void hash_insert(hash_table *t, hash_node *n, uint64_t h) {
  if (t->count > t->mask) { /* twice the buckets where memory allows (else longer chains) */
    size_t size = 2 * (t->mask + 1);
    hash_node **grown = calloc(size, sizeof(hash_node *));
    if (grown) {
      for (size_t i = 0; i <= t->mask; i++)
        for (hash_node *p = t->buckets[i], *next; p; p = next) {
          next = p->next;
          p->next = grown[p->hash & (size - 1)];
          grown[p->hash & (size - 1)] = p;
        }
      free(t->buckets);
      t->buckets = grown;
      t->mask = size - 1;
    }
  }
  n->hash = h;
  n->next = t->buckets[h & t->mask];
  t->buckets[h & t->mask] = n;
  t->count++;
}

static void hash_remove(hash_table *t, hash_node *n) {
  hash_node **p = &t->buckets[n->hash & t->mask];
  while (*p != n) p = &(*p)->next;
  *p = n->next;
  t->count--;
}

/* ------------------------------------------------------------------------------------------ */
/* the device                                                                                 */

/* Size classes (size_class): the smallest, 4 << 6 = 256 bytes, is cuMemAlloc's alignment. */
#define GPU_MIN_SHIFT 6
#define GPU_BINS 160 /* up to 7 << 45 bytes */

typedef struct gpu_block {
  hash_node node; /* in the live table while allocated */
  CUdeviceptr ptr;
  size_t used; /* bytes requested */
  int bin;
  struct gpu_pool *pool; /* of the stream it was allocated for */
  struct gpu_block *next_free;
} gpu_block;

/* The cached blocks of one stream: work on a stream runs in order, so a block freed there can be
 * reused there at once; on another stream it could still be in use. */
typedef struct gpu_pool {
  void *stream;
  gpu_block *free_list[GPU_BINS];
  struct gpu_pool *next;
} gpu_pool;

typedef enum { CACHED_MODULE, CACHED_FUNCTION, CACHED_CONSTANT } cached_kind;

/* An entry of the kernel cache (a module, keyed by its image; a function, by its module's image
 * and its name) or of the constant cache (a device copy, keyed by the host data). */
typedef struct {
  hash_node node;
  cached_kind kind;
  const void *key;
  const char *name;
  size_t bytes;
  void *value; /* CUmodule, CUfunction, or the device pointer */
} cached;

struct ral_gpu {
  void *driver, *blas; /* dlopen handles; blas NULL: GEMMs fail, saying blas_error */
  char blas_error[256];
  int api; /* API_CUDA or API_HIP: which names were loaded, how the calls below are made */
#define FIELD(cu, v2, hip, params) CUresult(*cu) params;
  DRIVER_CALLS(FIELD)
#undef FIELD
#define FIELD(cu, v2, hip, params) cublasStatus_t(*cu) params;
  BLAS_CALLS(FIELD)
#undef FIELD
  /* calls whose signatures differ: those of one API loaded, made by the adapters below */
  CUresult (*cuMemsetD2D8Async)(CUdeviceptr dst, size_t pitch, unsigned char value, size_t width, size_t height,
                                CUstream stream);
  CUresult (*hipMemset2DAsync)(void *dst, size_t pitch, int value, size_t width, size_t height, CUstream stream);
  CUresult (*cuGetErrorName)(CUresult error, const char **name);
  CUresult (*cuGetErrorString)(CUresult error, const char **text);
  const char *(*hipGetErrorName)(CUresult error);
  const char *(*hipGetErrorString)(CUresult error);
  CUresult (*cuCtxGetCurrent)(CUcontext *context);                      /* optional (hipCtxGetCurrent) */
  cublasStatus_t (*cublasSetMathMode)(cublasHandle_t handle, int mode); /* CUDA only */
  int ordinal;
  CUdevice device;
  CUcontext context;          /* the device's primary context, retained (NULL before) */
  pthread_mutex_t alloc_lock; /* pools, live, stats */
  gpu_pool *pools;
  hash_table live; /* allocated blocks by pointer */
  ral_memory_stats stats;
  pthread_mutex_t kernel_lock; /* modules and functions */
  hash_table kernels;
  pthread_mutex_t constant_lock;
  hash_table constants;
  pthread_mutex_t blas_lock; /* the handle, its stream with it */
  cublasHandle_t blas_handle;
};

/* The API a driver library speaks (its cuInit or hipInit), or -1. */
static int api_of(void *lib) { return dlsym(lib, "cuInit") ? API_CUDA : dlsym(lib, "hipInit") ? API_HIP : -1; }

static void *load_symbol(void *lib, const char *name, const char **missing) {
  void *p = dlsym(lib, name);
  if (!p && !*missing) *missing = name;
  return p;
}

#define LOAD(field, name) g->field = (__typeof__(g->field))load_symbol(lib, name, &missing)
#define LOAD_CALL(cu, v2, hip, params) LOAD(cu, g->api == API_HIP ? #hip : #cu #v2);

/* The calls of g->api from `lib`: NULL, or the name of the first one missing. */
static const char *load_driver(ral_gpu *g, void *lib) {
  const char *missing = NULL;
  DRIVER_CALLS(LOAD_CALL)
  if (g->api == API_HIP) {
    LOAD(hipMemset2DAsync, "hipMemset2DAsync");
    LOAD(hipGetErrorName, "hipGetErrorName");
    LOAD(hipGetErrorString, "hipGetErrorString");
  } else {
    LOAD(cuMemsetD2D8Async, "cuMemsetD2D8Async");
    LOAD(cuGetErrorName, "cuGetErrorName");
    LOAD(cuGetErrorString, "cuGetErrorString");
  }
  const char *get_current = g->api == API_HIP ? "hipCtxGetCurrent" : "cuCtxGetCurrent";
  g->cuCtxGetCurrent = (__typeof__(g->cuCtxGetCurrent))dlsym(lib, get_current);
  return missing;
}

static const char *load_blas(ral_gpu *g, void *lib) {
  const char *missing = NULL;
  BLAS_CALLS(LOAD_CALL)
  if (g->api == API_CUDA) LOAD(cublasSetMathMode, "cublasSetMathMode");
  return missing;
}
#undef LOAD_CALL
#undef LOAD

/* cuMemsetD2D8Async, or hipMemset2DAsync (the value an int, the pointer a void *). */
static CUresult memset_2d(const ral_gpu *g, CUdeviceptr dst, size_t pitch, unsigned char value, size_t width,
                          size_t height, CUstream stream) {
  if (g->api == API_HIP) return g->hipMemset2DAsync((void *)(uintptr_t)dst, pitch, value, width, height, stream);
  return g->cuMemsetD2D8Async(dst, pitch, value, width, height, stream);
}

/* "<name>: <description>" of a driver error (HIP's calls return the strings). */
static const char *driver_error(const ral_gpu *g, CUresult r, char *buf, size_t size) {
  const char *name = NULL, *text = NULL;
  if (g->api == API_HIP)
    name = g->hipGetErrorName(r), text = g->hipGetErrorString(r);
  else if (g->cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  else if (g->cuGetErrorString(r, &text) != CUDA_SUCCESS)
    text = NULL;
  if (!name)
    snprintf(buf, size, "%s error %d", apis[g->api].name, r);
  else if (!text)
    snprintf(buf, size, "%s", name);
  else
    snprintf(buf, size, "%s: %s", name, text);
  return buf;
}

/* Fails ctx with `status` and the formatted message, followed by the driver's error where r is
 * one; returns status. */
static ral_status __attribute__((format(printf, 5, 6)))
fail(ral_context *ctx, ral_status status, const ral_gpu *g, CUresult r, const char *fmt, ...) {
  char message[512], error[256];
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  if (r != CUDA_SUCCESS && n >= 0 && (size_t)n < sizeof message)
    snprintf(message + n, sizeof message - (size_t)n, ": %s", driver_error(g, r, error, sizeof error));
  ral_context_fail(ctx, status, message);
  return status;
}

/* Makes the device's primary context current on the calling thread (driver calls act on the
 * current one; another library may have changed it since). */
static CUresult gpu_bind(ral_gpu *g) {
  CUcontext current;
  if (g->cuCtxGetCurrent && g->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == g->context) return CUDA_SUCCESS;
  return g->cuCtxSetCurrent(g->context);
}

/* The runtime's GPU for work on ctx, bound to the calling thread; else fails ctx. */
static ral_status context_gpu(ral_context *ctx, const char *what, ral_gpu **out) {
  ral_gpu *g = *out = runtime_gpu(ctx->rt);
  if (!g) return fail(ctx, RAL_ERR_UNAVAILABLE, NULL, CUDA_SUCCESS, "%s: no GPU enabled in the runtime", what);
  CUresult r = gpu_bind(g);
  if (r != CUDA_SUCCESS) {
    *out = NULL;
    return fail(ctx, RAL_ERR_INTERNAL, g, r, "%s: %s", what, CALL(g, cuCtxSetCurrent));
  }
  return RAL_OK;
}

/* For the entries of generated code: the current context (NULL: none), its GPU in *g, or *g NULL
 * after failing the context (which ends the call). */
static ral_context *entry_context(const char *what, ral_gpu **g) {
  ral_context *ctx = current_context();
  *g = NULL;
  if (ctx && context_gpu(ctx, what, g) != RAL_OK) context_exit(ctx);
  return ctx;
}

/* ------------------------------------------------------------------------------------------ */
/* caching allocator                                                                          */

static int gpu_bin(size_t bytes) { return size_class(bytes, GPU_MIN_SHIFT, GPU_BINS); }

static size_t gpu_bin_bytes(int bin) { return class_bytes(bin, GPU_MIN_SHIFT); }

static gpu_pool *pool_of(ral_gpu *g, void *stream) {
  gpu_pool *p = g->pools;
  while (p && p->stream != stream) p = p->next;
  if (!p && (p = calloc(1, sizeof *p))) {
    p->stream = stream;
    p->next = g->pools;
    g->pools = p;
  }
  return p;
}

/* Frees every cached block (cuMemFree and hipFree wait for the device's work first), with alloc_lock held. */
static void release_cached(ral_gpu *g) {
  for (gpu_pool *p = g->pools; p; p = p->next)
    for (int bin = 0; bin < GPU_BINS; bin++)
      while (p->free_list[bin]) {
        gpu_block *b = p->free_list[bin];
        p->free_list[bin] = b->next_free;
        g->cuMemFree(b->ptr);
        free(b);
      }
  g->stats.bytes_cached = 0;
}

void gpu_trim(ral_gpu *g) {
  if (gpu_bind(g) != CUDA_SUCCESS) return;
  pthread_mutex_lock(&g->alloc_lock);
  release_cached(g);
  pthread_mutex_unlock(&g->alloc_lock);
}

/* A block of `bytes` (> 0) for work on `stream`, the caller bound to the device: from the
 * stream's cache, else from cuMemAlloc, retried once with the cache freed. NULL on failure, with
 * the driver's error. */
static gpu_block *gpu_get(ral_gpu *g, size_t bytes, void *stream, CUresult *error) {
  int bin = gpu_bin(bytes);
  *error = CUDA_ERROR_OUT_OF_MEMORY;
  if (bin < 0) return NULL;
  size_t size = gpu_bin_bytes(bin);
  pthread_mutex_lock(&g->alloc_lock);
  gpu_pool *pool = pool_of(g, stream);
  int fit = bin, last = fit_last_class(bin, GPU_BINS);
  while (pool && fit < last && !pool->free_list[fit]) fit++;
  gpu_block *b = pool ? pool->free_list[fit] : NULL;
  if (b) {
    pool->free_list[fit] = b->next_free;
    g->stats.bytes_cached -= (int64_t)gpu_bin_bytes(fit);
    g->stats.cache_hits++;
    *error = CUDA_SUCCESS;
  } else if (pool && (b = calloc(1, sizeof *b))) {
    *error = g->cuMemAlloc(&b->ptr, size);
    if (*error != CUDA_SUCCESS) { /* the cache of every stream may hold the room */
      release_cached(g);
      *error = g->cuMemAlloc(&b->ptr, size);
    }
    if (*error == CUDA_SUCCESS) {
      b->bin = bin;
      b->pool = pool;
    } else {
      free(b);
      b = NULL;
    }
  }
  if (b) {
    b->used = bytes;
    hash_insert(&g->live, &b->node, hash_of((const void *)(uintptr_t)b->ptr, NULL));
    g->stats.allocations++;
    g->stats.bytes_in_use += (int64_t)bytes;
    if (g->stats.bytes_in_use > g->stats.peak_bytes) g->stats.peak_bytes = g->stats.bytes_in_use;
  }
  pthread_mutex_unlock(&g->alloc_lock);
  return b;
}

/* Returns an allocated block to its stream's cache; 0 if `ptr` is not one. */
static int gpu_put(ral_gpu *g, const void *ptr) {
  uint64_t h = hash_of(ptr, NULL);
  pthread_mutex_lock(&g->alloc_lock);
  gpu_block *b = (gpu_block *)hash_chain(&g->live, h);
  while (b && (void *)(uintptr_t)b->ptr != ptr) b = (gpu_block *)b->node.next;
  if (b) {
    hash_remove(&g->live, &b->node);
    b->next_free = b->pool->free_list[b->bin];
    b->pool->free_list[b->bin] = b;
    g->stats.bytes_in_use -= (int64_t)b->used;
    g->stats.bytes_cached += (int64_t)gpu_bin_bytes(b->bin);
  }
  pthread_mutex_unlock(&g->alloc_lock);
  return b != NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* module, function and constant caches                                                       */

static cached *cache_find(const hash_table *t, cached_kind kind, const void *key, const char *name, size_t bytes) {
  uint64_t h = hash_of(key, name);
  for (hash_node *n = hash_chain(t, h); n; n = n->next) {
    cached *c = (cached *)n;
    if (n->hash == h && c->kind == kind && c->key == key && c->name == name && c->bytes == bytes) return c;
  }
  return NULL;
}

static cached *cache_add(hash_table *t, cached_kind kind, const void *key, const char *name, size_t bytes, void *value) {
  cached *c = malloc(sizeof *c);
  if (!c) return NULL;
  *c = (cached){.kind = kind, .key = key, .name = name, .bytes = bytes, .value = value};
  hash_insert(t, &c->node, hash_of(key, name));
  return c;
}

/* Drops the entries keyed in [lo, hi): modules unloaded, constants back to the allocator. The
 * caller holds the table's lock and is bound to the device. */
static void cache_drop(ral_gpu *g, hash_table *t, uintptr_t lo, uintptr_t hi) {
  for (size_t i = 0; t->buckets && i <= t->mask; i++)
    for (hash_node **p = &t->buckets[i]; *p;) {
      cached *c = (cached *)*p;
      if ((uintptr_t)c->key < lo || (uintptr_t)c->key >= hi) {
        p = &(*p)->next;
        continue;
      }
      *p = c->node.next;
      t->count--;
      if (c->kind == CACHED_MODULE) g->cuModuleUnload((CUmodule)c->value);
      if (c->kind == CACHED_CONSTANT) gpu_put(g, c->value);
      free(c);
    }
}

/* The function `kernel` of the module `image` (or `ptx`), loaded on first use: the cubin, or
 * where the driver refuses it (built for another GPU) the PTX, compiled by the driver; on HIP the
 * code object only. NULL after failing ctx. */
static CUfunction gpu_function(ral_context *ctx, ral_gpu *g, const void *image, size_t image_size, const char *ptx,
                               const char *kernel) {
  const void *key = image ? image : (const void *)ptx;
  if (g->api == API_HIP) ptx = NULL; /* CUDA's */
  CUresult load = CUDA_SUCCESS, get = CUDA_SUCCESS;
  pthread_mutex_lock(&g->kernel_lock);
  cached *f = cache_find(&g->kernels, CACHED_FUNCTION, key, kernel, image_size);
  if (!f) {
    cached *m = cache_find(&g->kernels, CACHED_MODULE, key, NULL, image_size);
    if (!m) {
      CUmodule module;
      load = image ? g->cuModuleLoadData(&module, image) : CUDA_ERROR_INVALID_IMAGE;
      if (load != CUDA_SUCCESS && ptx) load = g->cuModuleLoadData(&module, ptx);
      if (load == CUDA_SUCCESS && !(m = cache_add(&g->kernels, CACHED_MODULE, key, NULL, image_size, module)))
        g->cuModuleUnload(module);
    }
    CUfunction function;
    if (m && (get = g->cuModuleGetFunction(&function, (CUmodule)m->value, kernel)) == CUDA_SUCCESS)
      f = cache_add(&g->kernels, CACHED_FUNCTION, key, kernel, image_size, function);
  }
  pthread_mutex_unlock(&g->kernel_lock);
  if (f) return (CUfunction)f->value;
  if (load != CUDA_SUCCESS)
    fail(ctx, RAL_ERR_INTERNAL, g, load, "%s(%s of %s)", CALL(g, cuModuleLoadData),
         g->api == API_HIP ? (image ? "the code object" : "no code object")
         : image && ptx    ? "the cubin, then the PTX"
         : image           ? "the cubin"
                           : "the PTX",
         kernel);
  else if (get != CUDA_SUCCESS)
    fail(ctx, RAL_ERR_INTERNAL, g, get, "%s(%s)", CALL(g, cuModuleGetFunction), kernel);
  else
    fail(ctx, RAL_ERR_OUT_OF_MEMORY, g, CUDA_SUCCESS, "out of memory caching kernel %s", kernel);
  return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* runtime side                                                                               */

void gpu_destroy(ral_gpu *g) {
  if (g->context) {
    gpu_bind(g);
    if (g->blas_handle) g->cublasDestroy(g->blas_handle);
    cache_drop(g, &g->kernels, 0, UINTPTR_MAX);
    cache_drop(g, &g->constants, 0, UINTPTR_MAX);
    for (size_t i = 0; i <= g->live.mask; i++) /* blocks taken and not given back */
      while (g->live.buckets[i]) {
        gpu_block *b = (gpu_block *)g->live.buckets[i];
        hash_remove(&g->live, &b->node);
        g->cuMemFree(b->ptr);
        free(b);
      }
    release_cached(g);
    g->cuDevicePrimaryCtxRelease(g->device);
  }
  while (g->pools) {
    gpu_pool *p = g->pools;
    g->pools = p->next;
    free(p);
  }
  if (g->blas) dlclose(g->blas);
  if (g->driver) dlclose(g->driver);
  free(g->live.buckets);
  free(g->kernels.buckets);
  free(g->constants.buckets);
  pthread_mutex_destroy(&g->alloc_lock);
  pthread_mutex_destroy(&g->kernel_lock);
  pthread_mutex_destroy(&g->constant_lock);
  pthread_mutex_destroy(&g->blas_lock);
  free(g);
}

/* The libraries stay mapped when closed (RTLD_NODELETE): their threads and exit handlers outlive a
 * runtime. */
#define GPU_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

static ral_status gpu_create(const char *driver_path, const char *blas_path, int ordinal, ral_gpu **out) {
  ral_gpu *g = *out = calloc(1, sizeof *g);
  if (!g) {
    runtime_error("out of memory enabling the GPU");
    return RAL_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&g->alloc_lock, NULL);
  pthread_mutex_init(&g->kernel_lock, NULL);
  pthread_mutex_init(&g->constant_lock, NULL);
  pthread_mutex_init(&g->blas_lock, NULL);
  g->ordinal = ordinal;
  if (!hash_init(&g->live) || !hash_init(&g->kernels) || !hash_init(&g->constants)) {
    runtime_error("out of memory enabling the GPU");
    return RAL_ERR_OUT_OF_MEMORY;
  }
  if (!driver_path) driver_path = "libcuda.so.1";
  const char *missing;
  if (!(g->driver = dlopen(driver_path, GPU_DLOPEN_FLAGS))) {
    runtime_error("cannot load the GPU driver '%s': %s", driver_path, dlerror());
    return RAL_ERR_UNAVAILABLE;
  }
  int api = api_of(g->driver);
  if (api < 0) {
    runtime_error("'%s' is neither CUDA's driver nor HIP's runtime: it has no cuInit or hipInit", driver_path);
    return RAL_ERR_UNAVAILABLE;
  }
  g->api = api;
  if ((missing = load_driver(g, g->driver))) {
    runtime_error("the %s '%s' has no %s", apis[g->api].driver, driver_path, missing);
    return RAL_ERR_UNAVAILABLE;
  }
  const char *call = CALL(g, cuInit);
  CUresult r = g->cuInit(0);
  if (r == CUDA_SUCCESS) call = CALL(g, cuDeviceGet), r = g->cuDeviceGet(&g->device, ordinal);
  if (r == CUDA_SUCCESS)
    call = CALL(g, cuDevicePrimaryCtxRetain), r = g->cuDevicePrimaryCtxRetain(&g->context, g->device);
  if (r != CUDA_SUCCESS) {
    char error[256];
    g->context = NULL;
    runtime_error("%s(device %d): %s", call, ordinal, driver_error(g, r, error, sizeof error));
    return RAL_ERR_UNAVAILABLE;
  }
  const char *blas = apis[g->api].blas;
  if (!blas_path)
    snprintf(g->blas_error, sizeof g->blas_error, "no %s was given to ral_runtime_enable_gpu", blas);
  else if (!(g->blas = dlopen(blas_path, GPU_DLOPEN_FLAGS)))
    snprintf(g->blas_error, sizeof g->blas_error, "cannot load %s '%s': %s", blas, blas_path, dlerror());
  else if ((missing = load_blas(g, g->blas))) {
    snprintf(g->blas_error, sizeof g->blas_error, "%s '%s' has no %s", blas, blas_path, missing);
    dlclose(g->blas);
    g->blas = NULL;
  }
  return RAL_OK;
}

ral_status ral_runtime_enable_gpu(ral_runtime *rt, const char *driver_path, const char *blas_path, int ordinal) {
  runtime_error("%s", "");
  ral_gpu *g = runtime_gpu(rt);
  if (!g) {
    ral_status s = gpu_create(driver_path, blas_path, ordinal, &g);
    if (s != RAL_OK) {
      if (g) gpu_destroy(g);
      return s;
    }
    ral_gpu *installed = runtime_install_gpu(rt, g);
    if (installed != g) { /* another thread enabled it meanwhile */
      gpu_destroy(g);
      g = installed;
    }
  } else if (driver_path) { /* enabled already: the library named must not speak the other API */
    void *lib = dlopen(driver_path, GPU_DLOPEN_FLAGS);
    int api = lib ? api_of(lib) : -1;
    if (lib) dlclose(lib);
    if (api >= 0 && api != g->api) {
      runtime_error("the runtime uses a %s GPU already, not %s ('%s')", apis[g->api].name, apis[api].name, driver_path);
      return RAL_ERR_INVALID_ARGUMENT;
    }
  }
  if (g->ordinal != ordinal) {
    runtime_error("the runtime uses GPU %d already, not %d", g->ordinal, ordinal);
    return RAL_ERR_INVALID_ARGUMENT;
  }
  return RAL_OK;
}

int ral_runtime_has_gpu(const ral_runtime *rt) { return runtime_gpu(rt) != NULL; }

int ral_runtime_gpu_kind(const ral_runtime *rt) {
  ral_gpu *g = runtime_gpu(rt);
  return g ? g->api + 1 : RAL_GPU_NONE;
}

void ral_runtime_gpu_memory_stats(ral_runtime *rt, ral_memory_stats *out) {
  ral_gpu *g = runtime_gpu(rt);
  memset(out, 0, sizeof *out);
  if (!g) return;
  pthread_mutex_lock(&g->alloc_lock);
  *out = g->stats;
  pthread_mutex_unlock(&g->alloc_lock);
}

void ral_runtime_gpu_forget(ral_runtime *rt, const void *begin, size_t bytes) {
  ral_gpu *g = runtime_gpu(rt);
  if (!g || gpu_bind(g) != CUDA_SUCCESS) return;
  uintptr_t lo = (uintptr_t)begin, hi = bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + bytes;
  pthread_mutex_lock(&g->kernel_lock);
  cache_drop(g, &g->kernels, lo, hi);
  pthread_mutex_unlock(&g->kernel_lock);
  pthread_mutex_lock(&g->constant_lock);
  cache_drop(g, &g->constants, lo, hi);
  pthread_mutex_unlock(&g->constant_lock);
}

void ral_context_set_stream(ral_context *ctx, void *stream) { ctx->stream = stream; }

ral_status ral_context_synchronize(ral_context *ctx) {
  ral_gpu *g;
  ral_status s = context_gpu(ctx, "ral_context_synchronize", &g);
  if (s != RAL_OK) return s;
  CUresult r = g->cuStreamSynchronize(ctx->stream);
  return r == CUDA_SUCCESS ? RAL_OK : fail(ctx, RAL_ERR_INTERNAL, g, r, "%s", CALL(g, cuStreamSynchronize));
}

/* A block for the context's stream, recorded as the context's (freed with it); NULL after failing
 * the context. */
static void *context_block(ral_context *ctx, ral_gpu *g, size_t bytes) {
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  gpu_block *b = gpu_get(g, bytes ? bytes : 1, ctx->stream, &r);
  if (!b) {
    fail(ctx, RAL_ERR_OUT_OF_MEMORY, g, r, "out of memory allocating %zu bytes on the GPU", bytes);
    return NULL;
  }
  void *ptr = (void *)(uintptr_t)b->ptr;
  if (!ptr_list_add(&ctx->device_buffers, ptr)) {
    gpu_put(g, ptr);
    fail(ctx, RAL_ERR_OUT_OF_MEMORY, g, CUDA_SUCCESS, "out of memory recording a buffer");
    return NULL;
  }
  return ptr;
}

ral_status ral_context_gpu_alloc(ral_context *ctx, size_t bytes, void **out) {
  ral_gpu *g;
  *out = NULL;
  ral_status s = context_gpu(ctx, "ral_context_gpu_alloc", &g);
  if (s != RAL_OK) return s;
  *out = context_block(ctx, g, bytes);
  return *out ? RAL_OK : ral_context_status(ctx);
}

ral_status ral_gpu_alloc(ral_runtime *rt, size_t bytes, void **out) {
  ral_gpu *g = runtime_gpu(rt);
  *out = NULL;
  if (!g) {
    runtime_error("ral_gpu_alloc: no GPU enabled in the runtime");
    return RAL_ERR_UNAVAILABLE;
  }
  CUresult r = gpu_bind(g);
  gpu_block *b = r == CUDA_SUCCESS ? gpu_get(g, bytes ? bytes : 1, NULL, &r) : NULL;
  if (!b) {
    char error[256];
    runtime_error("out of memory allocating %zu bytes on the GPU: %s", bytes, driver_error(g, r, error, sizeof error));
    return RAL_ERR_OUT_OF_MEMORY;
  }
  *out = (void *)(uintptr_t)b->ptr;
  return RAL_OK;
}

void ral_gpu_free(ral_runtime *rt, void *ptr) {
  ral_gpu *g = runtime_gpu(rt);
  if (g && ptr) gpu_put(g, ptr);
}

/* DLPack's DLManagedTensor (dlpack.h; the layout is stable since DLPack 0.2) */
typedef struct dl_managed {
  struct {
    void *data;
    struct {
      int32_t device_type, device_id;
    } device;
    int32_t ndim;
    struct {
      uint8_t code, bits;
      uint16_t lanes;
    } dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
  } tensor;
  void *manager_ctx; /* the runtime */
  void (*deleter)(struct dl_managed *self);
  int64_t dims[]; /* shape, then strides */
} dl_managed;

enum { DL_CUDA = 2, DL_ROCM = 10 };

static void dl_delete(dl_managed *self) {
  ral_runtime *rt = self->manager_ctx;
  ral_gpu_free(rt, self->tensor.data);
  free(self);
  ral_runtime_destroy(rt); /* the export's reference */
}

void *ral_gpu_dlpack(ral_runtime *rt, void *ptr, int32_t ndim, const int64_t *shape, const int64_t *strides, uint8_t code,
                     uint8_t bits) {
  ral_gpu *g = runtime_gpu(rt);
  if (!g || ndim < 0) return NULL;
  dl_managed *m = calloc(1, sizeof *m + 2 * (size_t)ndim * sizeof(int64_t));
  if (!m) return NULL;
  memcpy(m->dims, shape, (size_t)ndim * sizeof(int64_t));
  memcpy(m->dims + ndim, strides, (size_t)ndim * sizeof(int64_t));
  m->tensor.data = ptr;
  m->tensor.device.device_type = g->api == API_HIP ? DL_ROCM : DL_CUDA;
  m->tensor.device.device_id = g->ordinal;
  m->tensor.ndim = ndim;
  m->tensor.dtype.code = code;
  m->tensor.dtype.bits = bits;
  m->tensor.dtype.lanes = 1;
  m->tensor.shape = m->dims;
  m->tensor.strides = m->dims + ndim;
  m->manager_ctx = rt;
  m->deleter = dl_delete;
  runtime_retain(rt);
  return m;
}

void ral_dlpack_delete(void *managed) {
  dl_managed *m = managed;
  if (m && m->deleter) m->deleter(m);
}

ral_status ral_gpu_copy(ral_context *ctx, void *dst, const void *src, size_t bytes, int direction) {
  static const int calls[] = {CALL_cuMemcpyHtoDAsync, CALL_cuMemcpyDtoHAsync, CALL_cuMemcpyDtoDAsync};
  if (direction < RAL_COPY_HOST_TO_DEVICE || direction > RAL_COPY_DEVICE_TO_DEVICE)
    return fail(ctx, RAL_ERR_INVALID_ARGUMENT, NULL, CUDA_SUCCESS, "ral_gpu_copy: no direction %d", direction);
  ral_gpu *g;
  ral_status s = context_gpu(ctx, "ral_gpu_copy", &g);
  if (s != RAL_OK || bytes == 0) return s;
  CUstream stream = ctx->stream;
  CUdeviceptr d = (uintptr_t)dst, from = (uintptr_t)src;
  CUresult r = direction == RAL_COPY_HOST_TO_DEVICE   ? g->cuMemcpyHtoDAsync(d, src, bytes, stream)
               : direction == RAL_COPY_DEVICE_TO_HOST ? g->cuMemcpyDtoHAsync(dst, from, bytes, stream)
                                                      : g->cuMemcpyDtoDAsync(d, from, bytes, stream);
  if (r == CUDA_SUCCESS && direction == RAL_COPY_DEVICE_TO_HOST) r = g->cuStreamSynchronize(stream);
  const char *call = call_names[calls[direction]][g->api];
  return r == CUDA_SUCCESS ? RAL_OK : fail(ctx, RAL_ERR_INTERNAL, g, r, "%s of %zu bytes", call, bytes);
}

void gpu_release_context(ral_context *ctx) {
  ral_gpu *g = runtime_gpu(ctx->rt); /* not NULL when there are device buffers */
  for (size_t i = 0; i < ctx->device_buffers.count; i++) gpu_put(g, ctx->device_buffers.items[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* entries of generated code                                                                  */

void *disc_ral_gpu_alloc(int64_t bytes) {
  ral_gpu *g;
  ral_context *ctx = entry_context("disc_ral_gpu_alloc", &g);
  if (!g) return NULL;
  void *ptr = bytes >= 0 ? context_block(ctx, g, (size_t)bytes) : NULL;
  if (!ptr) {
    if (bytes < 0) fail(ctx, RAL_ERR_OUT_OF_MEMORY, g, CUDA_SUCCESS, "out of memory allocating %lld bytes on the GPU", (long long)bytes);
    context_exit(ctx);
  }
  return ptr;
}

/* Buffers live until the end of the call (or are taken as results), as host ones do; an early
 * free returns a block only when the current context owns it. */
void disc_ral_gpu_free(void *ptr) {
  ral_context *ctx = current_context();
  if (ctx && ptr && ptr_list_remove(&ctx->device_buffers, ptr)) gpu_put(runtime_gpu(ctx->rt), ptr);
}

void *disc_ral_gpu_constant(const void *host, int64_t bytes) {
  ral_gpu *g;
  ral_context *ctx = entry_context("disc_ral_gpu_constant", &g);
  if (!g) return NULL;
  size_t size = bytes > 0 ? (size_t)bytes : 0;
  CUresult r = CUDA_SUCCESS;
  gpu_block *b = NULL;
  /* held through the copy: a second thread waits for the first one's copy instead of making its own */
  pthread_mutex_lock(&g->constant_lock);
  cached *c = cache_find(&g->constants, CACHED_CONSTANT, host, NULL, size);
  if (!c && (b = gpu_get(g, size ? size : 1, ctx->stream, &r))) {
    /* waited for: other streams use it with no order to this one */
    if (size) r = g->cuMemcpyHtoDAsync(b->ptr, host, size, ctx->stream);
    if (size && r == CUDA_SUCCESS) r = g->cuStreamSynchronize(ctx->stream);
    if (r == CUDA_SUCCESS) c = cache_add(&g->constants, CACHED_CONSTANT, host, NULL, size, (void *)(uintptr_t)b->ptr);
    if (!c) gpu_put(g, (void *)(uintptr_t)b->ptr);
  }
  pthread_mutex_unlock(&g->constant_lock);
  if (c) return c->value;
  if (b && r != CUDA_SUCCESS)
    fail(ctx, RAL_ERR_INTERNAL, g, r, "copying a constant of %zu bytes to the GPU", size);
  else
    fail(ctx, RAL_ERR_OUT_OF_MEMORY, g, r, "out of memory allocating a constant of %zu bytes on the GPU", size);
  context_exit(ctx);
  return NULL;
}

/* The host code's own reads and writes of device buffers (a slice's start index, a loop's
 * condition): copies on the context's stream, a read waiting for the work before it. */
static void host_access(void *dst, const void *src, int64_t bytes, int direction, const char *what) {
  ral_gpu *g;
  ral_context *ctx = entry_context(what, &g);
  if (!g) return;
  if (ral_gpu_copy(ctx, dst, src, bytes > 0 ? (size_t)bytes : 0, direction) != RAL_OK) context_exit(ctx);
}

void disc_ral_gpu_read(void *host, const void *device, int64_t bytes) {
  host_access(host, device, bytes, RAL_COPY_DEVICE_TO_HOST, "disc_ral_gpu_read");
}

void disc_ral_gpu_write(void *device, const void *host, int64_t bytes) {
  host_access(device, host, bytes, RAL_COPY_HOST_TO_DEVICE, "disc_ral_gpu_write");
}

#define GPU_MAX_GRID ((int64_t)1 << 20)
#define GPU_MAX_PARAMS 4095 /* 8-byte parameters in the driver's 32764-byte limit */

void disc_ral_gpu_launch(const void *image, int64_t image_size, const char *ptx, const char *kernel, void *params,
                         int64_t num_params, int64_t threads, int64_t block) {
  if (threads <= 0) return;
  ral_gpu *g;
  ral_context *ctx = entry_context("disc_ral_gpu_launch", &g);
  if (!g) return;
  if (block < 1 || block > INT32_MAX || num_params < 0 || num_params > GPU_MAX_PARAMS) {
    fail(ctx, RAL_ERR_INVALID_ARGUMENT, g, CUDA_SUCCESS, "disc_ral_gpu_launch(%s): blocks of %lld threads, %lld parameters",
         kernel, (long long)block, (long long)num_params);
    context_exit(ctx);
    return;
  }
  CUfunction f = gpu_function(ctx, g, image, image_size > 0 ? (size_t)image_size : 0, ptx, kernel);
  if (!f) {
    context_exit(ctx);
    return;
  }
  int64_t grid = threads / block + (threads % block != 0);
  if (grid > GPU_MAX_GRID) grid = GPU_MAX_GRID;
  void *args[num_params + 1];
  for (int64_t i = 0; i < num_params; i++) args[i] = (char *)params + 8 * i;
  args[num_params] = NULL; /* unread by the driver: the end of the list for test stand-ins */
  CUresult r = g->cuLaunchKernel(f, (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, ctx->stream, args, NULL);
  if (r != CUDA_SUCCESS) {
    fail(ctx, RAL_ERR_INTERNAL, g, r, "%s(%s, grid %lld, block %lld)", CALL(g, cuLaunchKernel), kernel, (long long)grid,
         (long long)block);
    context_exit(ctx);
  }
}

/* A BLAS status's name. */
static const char *blas_status(const ral_gpu *g, cublasStatus_t s) {
  const char *name = s > 0 && s < 16 ? apis[g->api].blas_status[s] : NULL;
  return name ? name : g->api == API_HIP ? "HIPBLAS_STATUS_?" : "CUBLAS_STATUS_?";
}

/* disc_ral_gemm_f32's arguments (pointers as bytes) */
typedef struct {
  int64_t batch, inner, m, n, k, sa_b, sa_i, a_group, sa_m, sa_k, sb_b, sb_i, b_group, sb_k, sb_n, sc_b, sc_i, ldc;
  const char *a, *b;
  char *c;
} gemm_args;

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

/* Every entry (o, j) of the product as one batched call on device arrays of their addresses (built
 * here, copied on the context's stream; the block goes back to the stream's pool, so nothing
 * reuses it before the call has run). With the BLAS lock held. */
static cublasStatus_t gemm_by_pointers(ral_context *ctx, ral_gpu *g, const gemm_args *p, size_t elem, int op_a, int op_b,
                                       int lda, int ldb, int ldc, int is_double, CUresult *r) {
  static const float one_f = 1, zero_f = 0;
  static const double one_d = 1, zero_d = 0;
  int64_t count = p->batch * p->inner;
  size_t bytes = 3 * (size_t)count * sizeof(void *);
  const char **host = malloc(bytes);
  gpu_block *block = host ? gpu_get(g, bytes, ctx->stream, r) : NULL;
  if (!block) {
    free(host);
    if (*r == CUDA_SUCCESS) *r = CUDA_ERROR_OUT_OF_MEMORY;
    return 0;
  }
  for (int64_t e = 0; e < count; e++) {
    int64_t o = e / p->inner, j = e % p->inner;
    host[e] = p->a + (o * p->sa_b + j / p->a_group * p->sa_i) * (int64_t)elem;
    host[count + e] = p->b + (o * p->sb_b + j / p->b_group * p->sb_i) * (int64_t)elem;
    host[2 * count + e] = p->c + (o * p->sc_b + j * p->sc_i) * (int64_t)elem;
  }
  *r = g->cuMemcpyHtoDAsync(block->ptr, host, bytes, ctx->stream); /* pageable: `host` is copied on return */
  free(host);
  cublasStatus_t s = 0;
  if (*r == CUDA_SUCCESS) {
    void **arrays = (void **)(uintptr_t)block->ptr;
    if (is_double)
      s = g->cublasDgemmBatched(g->blas_handle, op_b, op_a, (int)p->n, (int)p->m, (int)p->k, &one_d,
                                (const double *const *)(arrays + count), ldb, (const double *const *)arrays, lda, &zero_d,
                                (double *const *)(arrays + 2 * count), ldc, (int)count);
    else
      s = g->cublasSgemmBatched(g->blas_handle, op_b, op_a, (int)p->n, (int)p->m, (int)p->k, &one_f,
                                (const float *const *)(arrays + count), ldb, (const float *const *)arrays, lda, &zero_f,
                                (float *const *)(arrays + 2 * count), ldc, (int)count);
  }
  gpu_put(g, (void *)(uintptr_t)block->ptr);
  return s;
}

/* The product on cuBLAS or hipBLAS: row-major C = A x B is column-major C^T = B^T x A^T, so B comes first.
 * Entries j = g + G t of one outer entry, for G the lcm of the groups, are a strided batch (A's
 * entry (g + G t) / a_group = g / a_group + t G / a_group): one call per outer entry and residue
 * g, one in all where the outer level continues the inner one. */
static void gpu_gemm(const void *key, const char *name, int is_double, gemm_args p) {
  ral_gpu *g;
  ral_context *ctx = entry_context(name, &g);
  if (!g) return;
  size_t elem = is_double ? sizeof(double) : sizeof(float);
  int ta, tb;
  int64_t lda, ldb, ldc = p.m == 1 && p.ldc < p.n ? p.n : p.ldc; /* one row: its leading dim is unused */
  ral_status status = RAL_OK;
  if (!g->blas) {
    status = fail(ctx, RAL_ERR_UNAVAILABLE, g, CUDA_SUCCESS, "%s: %s", name, g->blas_error);
  } else if (p.a_group < 1 || p.b_group < 1) {
    status = fail(ctx, RAL_ERR_INVALID_ARGUMENT, g, CUDA_SUCCESS, "%s: operands shared by groups of %lld and %lld entries",
                  name, (long long)p.a_group, (long long)p.b_group);
  } else if (p.batch <= 0 || p.inner <= 0 || p.m <= 0 || p.n <= 0) {
    return;
  } else if (!blas_layout(p.sa_m, p.sa_k, p.m, p.k, &ta, &lda) || !blas_layout(p.sb_k, p.sb_n, p.k, p.n, &tb, &ldb)) {
    status = fail(ctx, RAL_ERR_INVALID_ARGUMENT, g, CUDA_SUCCESS, "%s: operand has no unit stride", name);
  } else if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
             ldc > INT32_MAX || p.batch > INT32_MAX / p.inner) { /* at most INT32_MAX products in one call */
    status = fail(ctx, RAL_ERR_INVALID_ARGUMENT, g, CUDA_SUCCESS, "%s: dims exceed the 32-bit %s", name,
                  apis[g->api].blas);
  }
  if (status != RAL_OK) {
    context_exit(ctx);
    return;
  }
  if (p.inner == 1) { /* the outer level as the inner one */
    p.inner = p.batch, p.batch = 1;
    p.sa_i = p.sa_b, p.sb_i = p.sb_b, p.sc_i = p.sc_b;
    p.a_group = p.b_group = 1;
  }
  if (p.a_group > p.inner) p.a_group = p.inner; /* one entry for all */
  if (p.b_group > p.inner) p.b_group = p.inner;
  int64_t groups = p.a_group / gcd(p.a_group, p.b_group) * p.b_group;
  if (groups == 1 && p.batch > 1 && p.batch <= INT32_MAX / p.inner && p.sa_b == p.inner * p.sa_i &&
      p.sb_b == p.inner * p.sb_i && p.sc_b == p.inner * p.sc_i)
    p.inner *= p.batch, p.batch = 1;
  int64_t residues = groups < p.inner ? groups : p.inner, start = now_ns();
  CUresult r = CUDA_SUCCESS;
  cublasStatus_t s = 0;
  const char *call = CALL(g, cuMemsetD2D8Async);
  if (p.k == 0) { /* C = 0 (the BLAS may leave C alone when k is 0) */
    for (int64_t e = 0; e < p.batch * p.inner && r == CUDA_SUCCESS; e++) {
      CUdeviceptr c = (uintptr_t)(p.c + ((e / p.inner) * p.sc_b + (e % p.inner) * p.sc_i) * (int64_t)elem);
      r = memset_2d(g, c, (size_t)ldc * elem, 0, (size_t)p.n * elem, (size_t)p.m, ctx->stream);
    }
  } else {
    static const float one_f = 1, zero_f = 0;
    static const double one_d = 1, zero_d = 0;
    int op_n = apis[g->api].op_n, op_t = apis[g->api].op_t;
    int op_a = ta == NO_TRANS ? op_n : op_t, op_b = tb == NO_TRANS ? op_n : op_t;
    int64_t stride_a = groups / p.a_group * p.sa_i, stride_b = groups / p.b_group * p.sb_i, stride_c = groups * p.sc_i;
    call = CALL(g, cublasCreate);
    pthread_mutex_lock(&g->blas_lock);
    if (!g->blas_handle) {
      cublasHandle_t handle = NULL;
      s = g->cublasCreate(&handle);
      if (s == 0 && g->cublasSetMathMode && (s = g->cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH)) != 0)
        g->cublasDestroy(handle);
      if (s == 0) g->blas_handle = handle;
    }
    if (s == 0) call = CALL(g, cublasSetStream), s = g->cublasSetStream(g->blas_handle, ctx->stream);
    if (s == 0 && p.batch * residues > 1) { /* several strided batches: one call on arrays of the entries' addresses */
      call = is_double ? CALL(g, cublasDgemmBatched) : CALL(g, cublasSgemmBatched);
      s = gemm_by_pointers(ctx, g, &p, elem, op_a, op_b, (int)lda, (int)ldb, (int)ldc, is_double, &r);
      if (r != CUDA_SUCCESS) call = "the GEMM's pointer arrays";
    } else if (s == 0) { /* one strided batch */
      call = is_double ? CALL(g, cublasDgemmStridedBatched) : CALL(g, cublasSgemmStridedBatched);
      int count = (int)p.inner;
      if (is_double)
        s = g->cublasDgemmStridedBatched(g->blas_handle, op_b, op_a, (int)p.n, (int)p.m, (int)p.k, &one_d, (const double *)p.b,
                                         (int)ldb, stride_b, (const double *)p.a, (int)lda, stride_a, &zero_d, (double *)p.c,
                                         (int)ldc, stride_c, count);
      else
        s = g->cublasSgemmStridedBatched(g->blas_handle, op_b, op_a, (int)p.n, (int)p.m, (int)p.k, &one_f, (const float *)p.b,
                                         (int)ldb, stride_b, (const float *)p.a, (int)lda, stride_a, &zero_f, (float *)p.c,
                                         (int)ldc, stride_c, count);
    }
    pthread_mutex_unlock(&g->blas_lock);
  }
  if (r != CUDA_SUCCESS || s != 0) {
    if (s != 0)
      fail(ctx, RAL_ERR_INTERNAL, g, CUDA_SUCCESS, "%s: %s: %s", name, call, blas_status(g, s));
    else
      fail(ctx, RAL_ERR_INTERNAL, g, r, "%s: %s", name, call);
    context_exit(ctx);
    return;
  }
  if (p.k > 0) stat_record(key, 0, start); /* as on the CPU: products, not zero fills */
}

#define DEFINE_GPU_GEMM(NAME, T, IS_DOUBLE)                                                                          \
  void NAME(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const T *a, int64_t sa_b, int64_t sa_i, \
            int64_t a_group, int64_t sa_m, int64_t sa_k, const T *b, int64_t sb_b, int64_t sb_i, int64_t b_group,   \
            int64_t sb_k, int64_t sb_n, T *c, int64_t sc_b, int64_t sc_i, int64_t ldc) {                           \
    gpu_gemm((const void *)NAME, #NAME, IS_DOUBLE,                                                                  \
             (gemm_args){batch, inner, m, n, k, sa_b, sa_i, a_group, sa_m, sa_k, sb_b, sb_i, b_group, sb_k, sb_n,   \
                         sc_b, sc_i, ldc, (const char *)a, (const char *)b, (char *)c});                           \
  }

DEFINE_GPU_GEMM(disc_ral_gpu_gemm_f32, float, 0)
DEFINE_GPU_GEMM(disc_ral_gpu_gemm_f64, double, 1)

/* The grouped GEMM on device pointers: the offsets copied to the host (waiting for the stream),
 * checked, then one cuBLAS product per group, counted as the GEMM entry's; the rows past the last
 * offset zeroed on the stream. */
static void gpu_grouped_gemm(const void *key, const char *name, int is_double, int64_t rows, int64_t n, int64_t k, int64_t groups,
                             const char *a, const char *b, int64_t sb_g, int64_t sb_k, int64_t sb_n, const int64_t *offs, char *c) {
  ral_gpu *g;
  ral_context *ctx = entry_context(name, &g);
  if (!g || groups <= 0) return;
  int64_t *host = ral_alloc(ctx, (size_t)groups * sizeof *host);
  if (!host) return;
  disc_ral_gpu_read(host, offs, groups * (int64_t)sizeof *host);
  if (grouped_offsets_invalid(host, groups, rows)) return;
  size_t elem = is_double ? sizeof(double) : sizeof(float);
  int64_t start = 0;
  for (int64_t e = 0; e < groups; start = host[e++])
    if (host[e] > start)
      gpu_gemm(key, name, is_double, (gemm_args){1, 1, host[e] - start, n, k, 0, 0, 1, k, 1, 0, 0, 1, sb_k, sb_n, 0, 0, n,
                                                 a + start * k * (int64_t)elem, b + e * sb_g * (int64_t)elem,
                                                 c + start * n * (int64_t)elem});
  context_free(ctx, host);
  if (rows > start && n > 0) {
    CUresult r = memset_2d(g, (uintptr_t)(c + start * n * (int64_t)elem), (size_t)n * elem, 0, (size_t)n * elem,
                           (size_t)(rows - start), ctx->stream);
    if (r != CUDA_SUCCESS) {
      fail(ctx, RAL_ERR_INTERNAL, g, r, "%s: %s", name, CALL(g, cuMemsetD2D8Async));
      context_exit(ctx);
    }
  }
}

#define DEFINE_GPU_GROUPED_GEMM(NAME, T, GEMM, IS_DOUBLE)                                                              \
  void NAME(int64_t rows, int64_t n, int64_t k, int64_t groups, const T *a, const T *b, int64_t sb_g, int64_t sb_k,    \
            int64_t sb_n, const int64_t *offs, T *c) {                                                                \
    gpu_grouped_gemm((const void *)GEMM, #NAME, IS_DOUBLE, rows, n, k, groups, (const char *)a, (const char *)b, sb_g, \
                     sb_k, sb_n, offs, (char *)c);                                                                    \
  }

DEFINE_GPU_GROUPED_GEMM(disc_ral_gpu_grouped_gemm_f32, float, disc_ral_gpu_gemm_f32, 0)
DEFINE_GPU_GROUPED_GEMM(disc_ral_gpu_grouped_gemm_f64, double, disc_ral_gpu_gemm_f64, 1)
