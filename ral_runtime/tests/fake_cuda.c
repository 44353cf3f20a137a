/* A stand-in for CUDA's driver and cuBLAS on host memory, for testing the RAL's GPU device where
 * there is no GPU (the C tests, and Python's through ral_runtime_enable_gpu(rt, path, path, 0)).
 * Device memory is host memory, zero-filled, at addresses the host cannot use: a device address
 * is the host address with bit 62 set (non-canonical: code that reads or writes device memory on
 * the host faults, as with a real GPU; `fake_cuda_host` gives the host address). Copies are
 * memcpy and a stream runs nothing; a module is its
 * image, which must stay alive: a cubin is ELF's magic followed by text, PTX is text, and either
 * holds a kernel when the kernel's name occurs in its text. Launches are recorded, not run:
 * kernel, grid, block, stream, and the first 16 parameters as 8-byte words (kernelParams ends
 * with NULL, as the RAL passes it). GEMMs are computed. Device 0 only; the calls on memory,
 * modules, streams and cuBLAS handles fail with CUDA_ERROR_INVALID_CONTEXT unless the device's
 * primary context is retained and current on the calling thread.
 *
 * Built with FAKE_HIP it poses as ROCm's HIP runtime and hipBLAS instead (libfake_hip.so): the
 * same fake under HIP's names and signatures (hipMalloc, hipMemset2DAsync, hipModuleLaunchKernel,
 * hipGetErrorName returning the name, ...), HIP's error names, hipBLAS's operations (111, 112,
 * checked) and statuses, no math mode; a module must be a code object (ELF's magic: no PTX). The
 * test interface keeps its fake_cuda_* names.
 *
 * Standalone: cc -shared -fPIC -o libfake_cuda.so fake_cuda.c -lpthread (add -DFAKE_HIP for HIP) */
#define _GNU_SOURCE /* memmem */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FAKE_HIP
#define API(cuda, hip) hip
#else
#define API(cuda, hip) cuda
#endif

typedef int CUresult; /* hipError_t: the same codes */
typedef int CUdevice;
typedef struct fake_context *CUcontext;
typedef struct fake_module *CUmodule;
typedef struct fake_function *CUfunction;
typedef void *CUstream;
typedef API(unsigned long long, void *) CUdeviceptr;
typedef struct fake_blas *cublasHandle_t;
typedef int cublasStatus_t;

#define DEVICE_TAG ((uintptr_t)1 << 62)

/* The host address of fake device memory (for tests that look at it). */
void *fake_cuda_host(const void *device) { return (void *)((uintptr_t)device & ~DEVICE_TAG); }

static void *host_of(CUdeviceptr device) { return fake_cuda_host((const void *)(uintptr_t)device); }

enum {
  SUCCESS = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  INVALID_DEVICE = 101,
  INVALID_IMAGE = 200,
  INVALID_CONTEXT = 201,
  NO_BINARY_FOR_GPU = 209,
  NOT_FOUND = 500,
  BLAS_ALLOC_FAILED = API(3, 2),
  BLAS_INVALID_VALUE = API(7, 3),
  OP_N = API(0, 111),
  OP_T = API(1, 112),
};

static const struct {
  CUresult code;
  const char *name, *text;
} errors[] = {
    {SUCCESS, API("CUDA_SUCCESS", "hipSuccess"), "no error"},
    {INVALID_VALUE, API("CUDA_ERROR_INVALID_VALUE", "hipErrorInvalidValue"), "invalid argument"},
    {OUT_OF_MEMORY, API("CUDA_ERROR_OUT_OF_MEMORY", "hipErrorOutOfMemory"), "out of memory"},
    {INVALID_DEVICE, API("CUDA_ERROR_INVALID_DEVICE", "hipErrorInvalidDevice"), "invalid device ordinal"},
    {INVALID_IMAGE, API("CUDA_ERROR_INVALID_IMAGE", "hipErrorInvalidImage"), "device kernel image is invalid"},
    {INVALID_CONTEXT, API("CUDA_ERROR_INVALID_CONTEXT", "hipErrorInvalidContext"), "invalid device context"},
    {NO_BINARY_FOR_GPU, API("CUDA_ERROR_NO_BINARY_FOR_GPU", "hipErrorNoBinaryForGpu"),
     "no kernel image is available for execution on the device"},
    {NOT_FOUND, API("CUDA_ERROR_NOT_FOUND", "hipErrorNotFound"), "named symbol not found"},
};

struct fake_context {
  int refs;
};
struct fake_module {
  const char *text;
  size_t size; /* bytes of text searched for kernel names */
  struct fake_function *functions;
};
struct fake_function {
  char name[64];
  struct fake_function *next; /* of the module */
};
struct fake_blas {
  CUstream stream;
  int math_mode;
};

typedef struct {
  char name[64];
  int64_t grid[3], block[3], params[16];
  int num_params;
  CUstream stream;
} launch_record;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_context primary;
static _Thread_local CUcontext current;
static launch_record *launches;
static int num_launches, cap_launches, failing_allocs, failing_cubins;

/* Counters (fake_cuda_count): events since fake_cuda_reset, and state (live, modules, handles,
 * primary_refs, blas_stream), which reset keeps. */
static struct {
  int64_t allocs, frees, cubin_loads, ptx_loads, unloads, h2d, d2h, d2d, memsets, syncs, gemms;
  int64_t live, modules, handles, blas_stream;
} counts;

#define COUNTER(name) {#name, &counts.name}
static const struct {
  const char *name;
  int64_t *value;
} counters[] = {COUNTER(allocs), COUNTER(frees), COUNTER(cubin_loads), COUNTER(ptx_loads), COUNTER(unloads),
                COUNTER(h2d), COUNTER(d2h), COUNTER(d2d), COUNTER(memsets), COUNTER(syncs), COUNTER(gemms),
                COUNTER(live), COUNTER(modules), COUNTER(handles), COUNTER(blas_stream)};

/* ---- test interface ---- */

int fake_cuda_launch_count(void) {
  pthread_mutex_lock(&lock);
  int n = num_launches;
  pthread_mutex_unlock(&lock);
  return n;
}

/* Launch i (in order): its kernel's name (NUL-terminated in name_len bytes), grid, block and
 * parameter words; returns how many parameters it had (at most 16 recorded), -1 for no launch i. */
int fake_cuda_launch(int i, char *name, int name_len, int64_t grid[3], int64_t block[3], int64_t params[16]) {
  pthread_mutex_lock(&lock);
  int n = -1;
  if (i >= 0 && i < num_launches) {
    launch_record *l = &launches[i];
    if (name && name_len > 0) {
      strncpy(name, l->name, (size_t)name_len - 1);
      name[name_len - 1] = 0;
    }
    memcpy(grid, l->grid, sizeof l->grid);
    memcpy(block, l->block, sizeof l->block);
    memcpy(params, l->params, sizeof l->params);
    n = l->num_params;
  }
  pthread_mutex_unlock(&lock);
  return n;
}

/* The stream launch i went on. */
void *fake_cuda_launch_stream(int i) {
  pthread_mutex_lock(&lock);
  void *s = i >= 0 && i < num_launches ? launches[i].stream : NULL;
  pthread_mutex_unlock(&lock);
  return s;
}

/* A counter by name: allocs, frees, cubin_loads, ptx_loads, unloads, h2d, d2h, d2d (copies),
 * memsets, syncs (stream waits), gemms (cuBLAS calls); live (device allocations not freed),
 * modules (loaded), handles (cuBLAS), blas_stream (the last stream set on a cuBLAS handle), and
 * primary_refs (retains of the primary context not released). -1 for another name. */
int64_t fake_cuda_count(const char *name) {
  int64_t v = -1;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
    if (strcmp(counters[i].name, name) == 0) v = *counters[i].value;
  if (strcmp(name, "primary_refs") == 0) v = primary.refs;
  pthread_mutex_unlock(&lock);
  return v;
}

/* Forgets the launches, the pending failures and the event counters. */
void fake_cuda_reset(void) {
  pthread_mutex_lock(&lock);
  num_launches = failing_allocs = failing_cubins = 0;
  int64_t live = counts.live, modules = counts.modules, handles = counts.handles, stream = counts.blas_stream;
  memset(&counts, 0, sizeof counts);
  counts.live = live, counts.modules = modules, counts.handles = handles, counts.blas_stream = stream;
  pthread_mutex_unlock(&lock);
}

/* The next cuMemAlloc (hipMalloc) fails with out of memory (each call: one more). */
void fake_cuda_fail_next_alloc(void) {
  pthread_mutex_lock(&lock);
  failing_allocs++;
  pthread_mutex_unlock(&lock);
}

/* The next cuModuleLoadData (hipModuleLoadData) of a cubin (code object) fails with
 * CUDA_ERROR_NO_BINARY_FOR_GPU (hipErrorNoBinaryForGpu) (each call: one more). */
void fake_cuda_fail_next_cubin(void) {
  pthread_mutex_lock(&lock);
  failing_cubins++;
  pthread_mutex_unlock(&lock);
}

/* ---- driver ---- */

static int bound(void) { /* with the lock held */
  return current == &primary && primary.refs > 0;
}

#define NEED_CONTEXT(...)                                                      \
  pthread_mutex_lock(&lock);                                                   \
  if (!bound()) {                                                              \
    pthread_mutex_unlock(&lock);                                               \
    return INVALID_CONTEXT;                                                    \
  }                                                                            \
  __VA_ARGS__;                                                                 \
  pthread_mutex_unlock(&lock)

static int error_index(CUresult error) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == error) return (int)i;
  return -1;
}

#ifdef FAKE_HIP
const char *hipGetErrorName(CUresult error) {
  int i = error_index(error);
  return i < 0 ? "hipErrorUnknown" : errors[i].name;
}

const char *hipGetErrorString(CUresult error) {
  int i = error_index(error);
  return i < 0 ? "unknown error" : errors[i].text;
}
#else
CUresult cuGetErrorName(CUresult error, const char **name) {
  int i = error_index(error);
  *name = i < 0 ? NULL : errors[i].name;
  return i < 0 ? INVALID_VALUE : SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  int i = error_index(error);
  *text = i < 0 ? NULL : errors[i].text;
  return i < 0 ? INVALID_VALUE : SUCCESS;
}
#endif

CUresult API(cuInit, hipInit)(unsigned flags) { return flags == 0 ? SUCCESS : INVALID_VALUE; }

CUresult API(cuDeviceGet, hipDeviceGet)(CUdevice *device, int ordinal) {
  if (ordinal != 0) return INVALID_DEVICE;
  *device = 0;
  return SUCCESS;
}

CUresult API(cuDevicePrimaryCtxRetain, hipDevicePrimaryCtxRetain)(CUcontext *context, CUdevice device) {
  if (device != 0) return INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  primary.refs++;
  pthread_mutex_unlock(&lock);
  *context = &primary;
  return SUCCESS;
}

CUresult API(cuDevicePrimaryCtxRelease, hipDevicePrimaryCtxRelease)(CUdevice device) {
  if (device != 0) return INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  CUresult r = primary.refs > 0 ? (primary.refs--, SUCCESS) : INVALID_CONTEXT;
  pthread_mutex_unlock(&lock);
  return r;
}

CUresult API(cuCtxSetCurrent, hipCtxSetCurrent)(CUcontext context) {
  current = context;
  return SUCCESS;
}

CUresult API(cuCtxGetCurrent, hipCtxGetCurrent)(CUcontext *context) {
  *context = current;
  return SUCCESS;
}

CUresult API(cuMemAlloc_v2, hipMalloc)(CUdeviceptr *ptr, size_t bytes) {
  if (bytes == 0) return INVALID_VALUE;
  int fails = 0;
  NEED_CONTEXT(if ((fails = failing_allocs > 0)) failing_allocs--);
  if (fails) return OUT_OF_MEMORY;
  size_t size = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, size);
  if (!p) return OUT_OF_MEMORY;
  memset(p, 0, size);
  *ptr = (CUdeviceptr)((uintptr_t)p | DEVICE_TAG);
  pthread_mutex_lock(&lock);
  counts.allocs++, counts.live++;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}

CUresult API(cuMemFree_v2, hipFree)(CUdeviceptr ptr) {
  NEED_CONTEXT(counts.frees++, counts.live--);
  free(host_of(ptr));
  return SUCCESS;
}

CUresult API(cuMemcpyHtoDAsync_v2, hipMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
  (void)stream;
  NEED_CONTEXT(counts.h2d++);
  memcpy(host_of(dst), src, bytes);
  return SUCCESS;
}

CUresult API(cuMemcpyDtoHAsync_v2, hipMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  (void)stream;
  NEED_CONTEXT(counts.d2h++);
  memcpy(dst, host_of(src), bytes);
  return SUCCESS;
}

CUresult API(cuMemcpyDtoDAsync_v2, hipMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  (void)stream;
  NEED_CONTEXT(counts.d2d++);
  memmove(host_of(dst), host_of(src), bytes);
  return SUCCESS;
}

CUresult API(cuMemsetD2D8Async, hipMemset2DAsync)(CUdeviceptr dst, size_t pitch, API(unsigned char, int) value,
                                                   size_t width, size_t height, CUstream stream) {
  (void)stream;
  if (height > 1 && pitch < width) return INVALID_VALUE;
  NEED_CONTEXT(counts.memsets++);
  for (size_t row = 0; row < height; row++) memset((char *)host_of(dst) + row * pitch, value, width);
  return SUCCESS;
}

CUresult API(cuStreamSynchronize, hipStreamSynchronize)(CUstream stream) {
  (void)stream;
  NEED_CONTEXT(counts.syncs++);
  return SUCCESS;
}

CUresult API(cuModuleLoadData, hipModuleLoadData)(CUmodule *module, const void *image) {
  const char *text = image;
  int cubin = strncmp(text, "\x7f" "ELF", 4) == 0, refused = 0;
  NEED_CONTEXT(if ((refused = cubin && failing_cubins > 0)) failing_cubins--);
  if (refused) return NO_BINARY_FOR_GPU;
#ifdef FAKE_HIP
  if (!cubin) return INVALID_IMAGE; /* HIP loads code objects only */
#endif
  CUmodule m = calloc(1, sizeof *m);
  if (!m) return OUT_OF_MEMORY;
  m->text = cubin ? text + 4 : text;
  m->size = strlen(m->text);
  if (cubin && (unsigned char)text[4] == 2) { /* a real ELF64 cubin: names among its bytes, up to the section headers' end */
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, text + 0x28, 8);
    memcpy(&shentsize, text + 0x3A, 2);
    memcpy(&shnum, text + 0x3C, 2);
    m->size = shoff + (uint64_t)shentsize * shnum - 4;
  }
  pthread_mutex_lock(&lock);
  if (cubin)
    counts.cubin_loads++;
  else
    counts.ptx_loads++;
  counts.modules++;
  pthread_mutex_unlock(&lock);
  *module = m;
  return SUCCESS;
}

CUresult API(cuModuleUnload, hipModuleUnload)(CUmodule module) {
  NEED_CONTEXT(counts.unloads++, counts.modules--);
  for (struct fake_function *f = module->functions, *next; f; f = next) {
    next = f->next;
    free(f);
  }
  free(module);
  return SUCCESS;
}

CUresult API(cuModuleGetFunction, hipModuleGetFunction)(CUfunction *function, CUmodule module, const char *name) {
  NEED_CONTEXT();
  if (!memmem(module->text, module->size, name, strlen(name)) || strlen(name) >= sizeof((struct fake_function *)0)->name)
    return NOT_FOUND;
  struct fake_function *f = calloc(1, sizeof *f);
  if (!f) return OUT_OF_MEMORY;
  strcpy(f->name, name);
  pthread_mutex_lock(&lock);
  f->next = module->functions;
  module->functions = f;
  pthread_mutex_unlock(&lock);
  *function = f;
  return SUCCESS;
}

CUresult API(cuLaunchKernel, hipModuleLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                        unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void **params,
                        void **extra) {
  (void)shared_bytes;
  if (!f || extra || !grid_x || !grid_y || !grid_z || !block_x || !block_y || !block_z ||
      (uint64_t)block_x * block_y * block_z > 1024)
    return INVALID_VALUE;
  launch_record l = {.grid = {grid_x, grid_y, grid_z}, .block = {block_x, block_y, block_z}, .stream = stream};
  strcpy(l.name, f->name);
  while (params && params[l.num_params]) {
    if (l.num_params < 16) memcpy(&l.params[l.num_params], params[l.num_params], 8);
    l.num_params++;
  }
  pthread_mutex_lock(&lock);
  if (!bound()) {
    pthread_mutex_unlock(&lock);
    return INVALID_CONTEXT;
  }
  if (num_launches == cap_launches) {
    int cap = cap_launches ? 2 * cap_launches : 64;
    launch_record *grown = realloc(launches, (size_t)cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&lock);
      return OUT_OF_MEMORY;
    }
    launches = grown;
    cap_launches = cap;
  }
  launches[num_launches++] = l;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}

/* ---- cuBLAS (hipBLAS) ---- */

cublasStatus_t API(cublasCreate_v2, hipblasCreate)(cublasHandle_t *handle) {
  NEED_CONTEXT(counts.handles++);
  *handle = calloc(1, sizeof **handle);
  return *handle ? SUCCESS : BLAS_ALLOC_FAILED;
}

cublasStatus_t API(cublasDestroy_v2, hipblasDestroy)(cublasHandle_t handle) {
  NEED_CONTEXT(counts.handles--);
  free(handle);
  return SUCCESS;
}

cublasStatus_t API(cublasSetStream_v2, hipblasSetStream)(cublasHandle_t handle, CUstream stream) {
  handle->stream = stream;
  pthread_mutex_lock(&lock);
  counts.blas_stream = (int64_t)(intptr_t)stream;
  pthread_mutex_unlock(&lock);
  return SUCCESS;
}

#ifndef FAKE_HIP
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int mode) {
  handle->math_mode = mode;
  return SUCCESS;
}
#endif

/* Column-major C = alpha op(A) op(B) + beta C per batch entry, with cuBLAS's argument checks (the
 * operations: OP_N or OP_T). */
#define FAKE_GEMM(NAME, T)                                                                                      \
  cublasStatus_t NAME(cublasHandle_t handle, int ta, int tb, int m, int n, int k, const T *alpha, const T *a, int lda, \
                      long long sa, const T *b, int ldb, long long sb, const T *beta, T *c, int ldc, long long sc,     \
                      int count) {                                                                              \
    int a_rows = ta == OP_T ? k : m, b_rows = tb == OP_T ? n : k;                                               \
    if (!handle || (ta != OP_N && ta != OP_T) || (tb != OP_N && tb != OP_T) || m < 0 || n < 0 || k < 0 ||       \
        count < 0 ||                                                                                            \
        lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))            \
      return BLAS_INVALID_VALUE;                                                                                \
    NEED_CONTEXT(counts.gemms++);                                                                               \
    a = fake_cuda_host(a), b = fake_cuda_host(b), c = fake_cuda_host(c);                                        \
    for (long long e = 0; e < count; e++)                                                                       \
      for (int j = 0; j < n; j++)                                                                               \
        for (int i = 0; i < m; i++) {                                                                           \
          T sum = 0, *out = &c[e * sc + i + (long long)j * ldc];                                                \
          for (int l = 0; l < k; l++)                                                                           \
            sum += a[e * sa + (ta == OP_T ? l + (long long)i * lda : i + (long long)l * lda)] *                 \
                   b[e * sb + (tb == OP_T ? j + (long long)l * ldb : l + (long long)j * ldb)];                 \
          *out = *alpha * sum + (*beta == 0 ? 0 : *beta * *out);                                                \
        }                                                                                                       \
    return SUCCESS;                                                                                             \
  }

#define SGEMM_STRIDED API(cublasSgemmStridedBatched, hipblasSgemmStridedBatched)
#define DGEMM_STRIDED API(cublasDgemmStridedBatched, hipblasDgemmStridedBatched)
FAKE_GEMM(SGEMM_STRIDED, float)
FAKE_GEMM(DGEMM_STRIDED, double)

/* The same on arrays of the entries' addresses (in device memory). */
#define FAKE_GEMM_BATCHED(NAME, STRIDED, T)                                                                      \
  cublasStatus_t NAME(cublasHandle_t handle, int ta, int tb, int m, int n, int k, const T *alpha, const T *const a[], \
                      int lda, const T *const b[], int ldb, const T *beta, T *const c[], int ldc, int count) {     \
    const T *const *ha = fake_cuda_host(a), *const *hb = fake_cuda_host(b);                                     \
    T *const *hc = fake_cuda_host(c);                                                                            \
    for (int e = 0; e < count; e++) {                                                                            \
      cublasStatus_t s = STRIDED(handle, ta, tb, m, n, k, alpha, ha[e], lda, 0, hb[e], ldb, 0, beta, hc[e], ldc, 0, 1); \
      if (s != SUCCESS) return s;                                                                                \
    }                                                                                                            \
    return SUCCESS;                                                                                              \
  }

FAKE_GEMM_BATCHED(API(cublasSgemmBatched, hipblasSgemmBatched), SGEMM_STRIDED, float)
FAKE_GEMM_BATCHED(API(cublasDgemmBatched, hipblasDgemmBatched), DGEMM_STRIDED, double)
