/* Tests of the RAL's GPU device through fake_cuda (CUDA's driver and cuBLAS on host memory, see
 * fake_cuda.c): enabling, device memory and its cache, launch grids and parameters, the module
 * cache and the PTX fallback, context-owned and taken device buffers, failures that end the call,
 * constants, cuBLAS GEMMs, and threads sharing the runtime. Built with FAKE_HIP (test_gpu_hip), the
 * same tests run on ROCm's API through the fake built as HIP's runtime and hipBLAS (no PTX
 * fallback there); each build also drives the other fake from a second runtime. */
#include "ral/ral.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* fake_cuda's test interface */
int fake_cuda_launch_count(void);
int fake_cuda_launch(int i, char *name, int name_len, int64_t grid[3], int64_t block[3], int64_t params[16]);
void *fake_cuda_launch_stream(int i);
int64_t fake_cuda_count(const char *name);
void fake_cuda_reset(void);
void fake_cuda_fail_next_alloc(void);
void fake_cuda_fail_next_cubin(void);

#ifdef FAKE_HIP
#define API(cuda, hip) hip
#else
#define API(cuda, hip) cuda
#endif

/* the fake this test is linked with (its test interface above), and the other API's */
static const char *fake = API(FAKE_CUDA_PATH, FAKE_HIP_PATH), *other_fake = API(FAKE_HIP_PATH, FAKE_CUDA_PATH);
static const int kind = API(RAL_GPU_CUDA, RAL_GPU_ROCM), other_kind = API(RAL_GPU_ROCM, RAL_GPU_CUDA);

/* To the fake driver a cubin is ELF's magic followed by the names of its kernels. */
static const char cubin[] = "\x7f" "ELF disc_k0 disc_k1";
static const char ptx[] = ".entry disc_k0 .entry disc_k1";

static int reached; /* set by an entry that ran past the call under test */

/* Runs entry(args, results) as a call on a fresh context on `stream`: its status, and its message
 * in `message` (when not NULL). */
static ral_status call(ral_runtime *rt, void *stream, ral_entry entry, void *args, void *results, char message[512]) {
  ral_context *ctx;
  if (ral_context_create(rt, &ctx) != RAL_OK) return RAL_ERR_OUT_OF_MEMORY;
  ral_context_set_stream(ctx, stream);
  ral_context *prev = ral_context_enter(ctx);
  reached = 0;
  ral_status s = ral_context_call(ctx, entry, args, results);
  ral_context_enter(prev);
  if (message) snprintf(message, 512, "%s", ral_context_message(ctx));
  ral_context_destroy(ctx);
  return s;
}

static ral_memory_stats gpu_stats(ral_runtime *rt) {
  ral_memory_stats st;
  ral_runtime_gpu_memory_stats(rt, &st);
  return st;
}

static void test_enable(ral_runtime *rt) {
  char want[512];
  CHECK(!ral_runtime_has_gpu(rt) && ral_runtime_gpu_kind(rt) == RAL_GPU_NONE);
  CHECK(ral_runtime_enable_gpu(rt, "/nonexistent/libcuda.so.1", NULL, 0) == RAL_ERR_UNAVAILABLE);
  CHECK(strstr(ral_runtime_create_error(), "cannot load the GPU driver '/nonexistent/libcuda.so.1'") != NULL);
  CHECK(ral_runtime_enable_gpu(rt, "libc.so.6", NULL, 0) == RAL_ERR_UNAVAILABLE); /* speaks neither API */
  CHECK(strcmp(ral_runtime_create_error(), "'libc.so.6' is neither CUDA's driver nor HIP's runtime: it has no cuInit or hipInit") == 0);
  CHECK(ral_runtime_enable_gpu(rt, fake, fake, 7) == RAL_ERR_UNAVAILABLE);
  CHECK(strcmp(ral_runtime_create_error(), API("cuDeviceGet(device 7): CUDA_ERROR_INVALID_DEVICE",
                                               "hipDeviceGet(device 7): hipErrorInvalidDevice") ": invalid device ordinal") == 0);
  CHECK(!ral_runtime_has_gpu(rt) && fake_cuda_count("primary_refs") == 0 && ral_runtime_gpu_kind(rt) == RAL_GPU_NONE);
  CHECK(ral_runtime_enable_gpu(rt, fake, fake, 0) == RAL_OK);
  CHECK(ral_runtime_create_error()[0] == 0);
  CHECK(ral_runtime_gpu_kind(rt) == kind);
  CHECK(ral_runtime_enable_gpu(rt, fake, fake, 0) == RAL_OK); /* again: nothing to do */
  CHECK(ral_runtime_enable_gpu(rt, fake, fake, 1) == RAL_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(ral_runtime_create_error(), "the runtime uses GPU 0 already, not 1") == 0);
  CHECK(ral_runtime_enable_gpu(rt, other_fake, other_fake, 0) == RAL_ERR_INVALID_ARGUMENT); /* the other API */
  snprintf(want, sizeof want, "the runtime uses a %s GPU already, not %s ('%s')", API("CUDA", "HIP"), API("HIP", "CUDA"),
           other_fake);
  CHECK(strcmp(ral_runtime_create_error(), want) == 0);
  CHECK(ral_runtime_has_gpu(rt) && fake_cuda_count("primary_refs") == 1 && ral_runtime_gpu_kind(rt) == kind);
}

static void test_memory(ral_runtime *rt) {
  unsigned char host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (unsigned char)(i * 7);
  void *d1, *d2, *d3;
  CHECK(ral_gpu_alloc(rt, 1000, &d1) == RAL_OK && d1 && (uintptr_t)d1 % 256 == 0);
  CHECK(ral_gpu_alloc(rt, 1000, &d2) == RAL_OK && d2 && d2 != d1);
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  CHECK(ral_gpu_copy(ctx, d1, host, 1000, RAL_COPY_HOST_TO_DEVICE) == RAL_OK);
  CHECK(ral_gpu_copy(ctx, d2, d1, 1000, RAL_COPY_DEVICE_TO_DEVICE) == RAL_OK);
  int64_t syncs = fake_cuda_count("syncs");
  CHECK(ral_gpu_copy(ctx, back, d2, 1000, RAL_COPY_DEVICE_TO_HOST) == RAL_OK && memcmp(host, back, 1000) == 0);
  CHECK(fake_cuda_count("syncs") == syncs + 1); /* waited for the stream */
  CHECK(ral_context_synchronize(ctx) == RAL_OK && ral_context_status(ctx) == RAL_OK);
  CHECK(ral_gpu_copy(ctx, back, d2, 10, 3) == RAL_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(ral_context_message(ctx), "ral_gpu_copy: no direction 3") == 0);
  ral_context_destroy(ctx);
  ral_memory_stats st = gpu_stats(rt);
  CHECK(st.bytes_in_use == 2000 && st.peak_bytes == 2000 && st.allocations == 2);
  ral_gpu_free(rt, d1);
  ral_gpu_free(rt, d2);
  ral_gpu_free(rt, host); /* not a device buffer: ignored */
  st = gpu_stats(rt);
  CHECK(st.bytes_in_use == 0 && st.bytes_cached == 2048); /* two blocks of the 1024-byte class */
  int64_t allocs = fake_cuda_count("allocs");
  CHECK(ral_gpu_alloc(rt, 900, &d3) == RAL_OK && d3 == d2); /* the same class: the last block freed */
  CHECK(fake_cuda_count("allocs") == allocs && gpu_stats(rt).cache_hits == 1);
  ral_gpu_free(rt, d3);
  /* size classes m * 2^e for m in 4..7 (under a quarter wasted), from 256 bytes */
  size_t sizes[] = {1, 256, 257, 1025, 1280, 1281, 3 << 20}, classes = 256 + 256 + 320 + 1280 + 1280 + 1536 + (3 << 20);
  void *blocks[7];
  int64_t cached = gpu_stats(rt).bytes_cached;
  for (int i = 0; i < 7; i++) CHECK(ral_gpu_alloc(rt, sizes[i], &blocks[i]) == RAL_OK);
  for (int i = 0; i < 7; i++) ral_gpu_free(rt, blocks[i]);
  CHECK(gpu_stats(rt).bytes_cached == cached + (int64_t)classes);
  /* a cached block of up to twice the request's class serves it: the 3 MiB one for 2 MiB */
  allocs = fake_cuda_count("allocs");
  CHECK(ral_gpu_alloc(rt, 2 << 20, &d3) == RAL_OK && d3 == blocks[6] && fake_cuda_count("allocs") == allocs);
  ral_gpu_free(rt, d3);
  CHECK(gpu_stats(rt).bytes_cached == cached + (int64_t)classes);
}

static void test_launch(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context_set_stream(ctx, (void *)0x5a);
  ral_context *prev = ral_context_enter(ctx);
  fake_cuda_reset();
  int64_t slots[3] = {0x1234, -5, INT64_MAX};
  const struct {
    int64_t threads, block, grid;
  } cases[] = {{0, 256, 0},         {-3, 256, 0},    {1, 256, 1},
               {255, 256, 1},       {256, 256, 1},   {257, 256, 2},
               {10000000, 256, 39063}, {(int64_t)1 << 40, 1024, 1 << 20}, {INT64_MAX, 1, 1 << 20}};
  char name[32];
  int64_t grid[3], block[3], params[16];
  int launched = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    disc_ral_gpu_launch(cubin, sizeof cubin, ptx, "disc_k0", slots, 3, cases[i].threads, cases[i].block);
    CHECK(fake_cuda_launch_count() == launched + (cases[i].grid > 0));
    if (cases[i].grid == 0) continue; /* no threads: nothing launched */
    CHECK(fake_cuda_launch(launched, name, sizeof name, grid, block, params) == 3);
    CHECK(strcmp(name, "disc_k0") == 0 && grid[0] == cases[i].grid && grid[1] == 1 && grid[2] == 1);
    CHECK(block[0] == cases[i].block && block[1] == 1 && block[2] == 1);
    CHECK(params[0] == 0x1234 && params[1] == -5 && params[2] == INT64_MAX);
    CHECK(fake_cuda_launch_stream(launched) == (void *)0x5a);
    launched++;
  }
  disc_ral_gpu_launch(cubin, sizeof cubin, ptx, "disc_k1", NULL, 0, 10, 32); /* another kernel of the module */
  CHECK(fake_cuda_launch(launched++, name, sizeof name, grid, block, params) == 0);
  CHECK(strcmp(name, "disc_k1") == 0 && grid[0] == 1 && block[0] == 32);
  CHECK(fake_cuda_count("cubin_loads") == 1 && fake_cuda_count("ptx_loads") == 0); /* one load for all */
#ifndef FAKE_HIP /* HIP: no PTX (test_launch_failures) */
  /* the driver refuses the cubin (built for another GPU): the PTX is loaded instead */
  static const char refused[] = "\x7f" "ELF disc_k2", refused_ptx[] = ".entry disc_k2";
  fake_cuda_fail_next_cubin();
  disc_ral_gpu_launch(refused, sizeof refused, refused_ptx, "disc_k2", NULL, 0, 1, 1);
  CHECK(fake_cuda_count("cubin_loads") == 1 && fake_cuda_count("ptx_loads") == 1);
  CHECK(fake_cuda_launch(launched++, name, sizeof name, grid, block, params) == 0 && strcmp(name, "disc_k2") == 0);
  /* PTX only: keyed by the PTX */
  static const char only_ptx[] = ".entry disc_k3";
  disc_ral_gpu_launch(NULL, 0, only_ptx, "disc_k3", NULL, 0, 1, 1);
  disc_ral_gpu_launch(NULL, 0, only_ptx, "disc_k3", NULL, 0, 1, 1);
  CHECK(fake_cuda_count("ptx_loads") == 2 && fake_cuda_launch_count() == launched + 2);
#endif
  /* forgotten: unloaded, and loaded again by the next launch */
  ral_runtime_gpu_forget(rt, cubin, sizeof cubin);
  CHECK(fake_cuda_count("unloads") == 1);
  disc_ral_gpu_launch(cubin, sizeof cubin, ptx, "disc_k0", slots, 3, 1, 1);
  CHECK(fake_cuda_count("cubin_loads") == 2);
  CHECK(ral_context_status(ctx) == RAL_OK);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

typedef struct {
  const void *image;
  const char *ptx, *kernel;
  int64_t block;
} launch_args;

static void launch_entry(void *args, void *results) {
  (void)results;
  const launch_args *l = args;
  disc_ral_gpu_launch(l->image, 16, l->ptx, l->kernel, NULL, 0, 100, l->block);
  reached = 1;
}

#define NO_BINARY ": no kernel image is available for execution on the device"

static void test_launch_failures(ral_runtime *rt) {
  static const char refused[] = "\x7f" "ELF disc_k4", refused_ptx[] = ".entry disc_k4";
  const struct {
    launch_args args;
    int refuse; /* the driver refuses the cubin */
    ral_status status;
    const char *message;
  } cases[] = {
      {{refused, NULL, "disc_k4", 128}, 1, RAL_ERR_INTERNAL, /* the cubin refused, no PTX */
       API("cuModuleLoadData(the cubin of disc_k4): CUDA_ERROR_NO_BINARY_FOR_GPU",
           "hipModuleLoadData(the code object of disc_k4): hipErrorNoBinaryForGpu") NO_BINARY},
      {{cubin, ptx, "disc_nope", 128}, 0, RAL_ERR_INTERNAL, /* no such kernel */
       API("cuModuleGetFunction(disc_nope): CUDA_ERROR_NOT_FOUND", "hipModuleGetFunction(disc_nope): hipErrorNotFound")
       ": named symbol not found"},
      {{cubin, ptx, "disc_k0", 2048}, 0, RAL_ERR_INTERNAL, /* too many threads per block */
       API("cuLaunchKernel(disc_k0, grid 1, block 2048): CUDA_ERROR_INVALID_VALUE",
           "hipModuleLaunchKernel(disc_k0, grid 1, block 2048): hipErrorInvalidValue") ": invalid argument"},
      {{cubin, ptx, "disc_k0", 0}, 0, RAL_ERR_INVALID_ARGUMENT, "disc_ral_gpu_launch(disc_k0): blocks of 0 threads, 0 parameters"},
#ifdef FAKE_HIP /* PTX is CUDA's: ignored */
      {{refused, refused_ptx, "disc_k4", 128}, 1, RAL_ERR_INTERNAL,
       "hipModuleLoadData(the code object of disc_k4): hipErrorNoBinaryForGpu" NO_BINARY},
      {{NULL, refused_ptx, "disc_k4", 128}, 0, RAL_ERR_INTERNAL,
       "hipModuleLoadData(no code object of disc_k4): hipErrorInvalidImage: device kernel image is invalid"},
#endif
  };
  (void)refused_ptx;
  fake_cuda_reset();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char message[512];
    if (cases[i].refuse) fake_cuda_fail_next_cubin();
    CHECK(call(rt, NULL, launch_entry, (void *)&cases[i].args, NULL, message) == cases[i].status);
    CHECK(!reached); /* the call ended at the failure */
    CHECK(strcmp(message, cases[i].message) == 0);
  }
  CHECK(fake_cuda_count("ptx_loads") == 0);
}

static void test_context_buffers(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  int64_t base = gpu_stats(rt).bytes_in_use;
  char *a = disc_ral_gpu_alloc(100), *b = disc_ral_gpu_alloc(0), *c = disc_ral_gpu_alloc(5000), *d = disc_ral_gpu_alloc(0);
  CHECK(a && b && c && d && b != d && (uintptr_t)c % 256 == 0);
  CHECK(gpu_stats(rt).bytes_in_use == base + 5102);
  disc_ral_gpu_free(c);
  disc_ral_gpu_free(c);     /* freed already: ignored */
  disc_ral_gpu_free(a + 4); /* not a buffer: ignored */
  CHECK(gpu_stats(rt).bytes_in_use == base + 102);
  /* host and device buffers are told apart */
  void *h = _mlir_memref_to_llvm_alloc(64);
  disc_ral_gpu_free(h);
  _mlir_memref_to_llvm_free(b);
  CHECK(gpu_stats(rt).bytes_in_use == base + 102);
  if (ral_context_take(ctx, h)) ral_buffer_free(rt, h);
  CHECK(ral_context_take(ctx, a) == 1);
  CHECK(ral_context_take(ctx, a) == 0);
  int64_t live = fake_cuda_count("live");
  ral_context_enter(prev);
  ral_context_destroy(ctx); /* gives back b and d, not the taken a */
  CHECK(gpu_stats(rt).bytes_in_use == base + 100);
  CHECK(fake_cuda_count("live") == live); /* cached, not freed */
  ral_gpu_free(rt, a);
  CHECK(gpu_stats(rt).bytes_in_use == base);
}

/* A call's own device memory (ral_context_gpu_alloc, e.g. a host argument's copy) goes back with
 * the context to its stream's pool: reused there, never by another stream. */
static void test_call_buffers(ral_runtime *rt) {
  void *stream = (void *)0x33, *p = NULL, *q = NULL, *other = NULL;
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context_set_stream(ctx, stream);
  int64_t base = gpu_stats(rt).bytes_in_use;
  CHECK(ral_context_gpu_alloc(ctx, 3000, &p) == RAL_OK && p && gpu_stats(rt).bytes_in_use == base + 3000);
  ral_context_destroy(ctx);
  CHECK(gpu_stats(rt).bytes_in_use == base);
  CHECK(ral_gpu_alloc(rt, 3000, &other) == RAL_OK && other != p); /* the default stream's pool */
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context_set_stream(ctx, stream);
  CHECK(ral_context_gpu_alloc(ctx, 3000, &q) == RAL_OK && q == p);
  ral_context_destroy(ctx);
  ral_gpu_free(rt, other);
  for (int i = 0; i < 2; i++) fake_cuda_fail_next_alloc(); /* the RAL retries once after emptying its cache */
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  CHECK(ral_context_gpu_alloc(ctx, 1 << 30, &q) == RAL_ERR_OUT_OF_MEMORY && q == NULL);
  CHECK(strstr(ral_context_message(ctx), "out of memory allocating 1073741824 bytes on the GPU") != NULL);
  ral_context_destroy(ctx);
}

static void alloc_entry(void *args, void *results) {
  (void)results;
  disc_ral_gpu_alloc(*(const int64_t *)args);
  reached = 1;
}

#define OUT_OF_MEMORY API("CUDA_ERROR_OUT_OF_MEMORY", "hipErrorOutOfMemory") ": out of memory"

static void test_out_of_memory(ral_runtime *rt) {
  char message[512];
  int64_t bytes = 1 << 20;
  fake_cuda_reset();
  CHECK(gpu_stats(rt).bytes_cached > 0);
  fake_cuda_fail_next_alloc(); /* the first try, and the one after the cache is freed */
  fake_cuda_fail_next_alloc();
  CHECK(call(rt, NULL, alloc_entry, &bytes, NULL, message) == RAL_ERR_OUT_OF_MEMORY);
  CHECK(!reached); /* the call ended at the failure */
  CHECK(strcmp(message, "out of memory allocating 1048576 bytes on the GPU: " OUT_OF_MEMORY) == 0);
  CHECK(gpu_stats(rt).bytes_cached == 0 && fake_cuda_count("frees") > 0);
  /* one failure: the retry after freeing the cache succeeds */
  void *p;
  CHECK(ral_gpu_alloc(rt, 4096, &p) == RAL_OK);
  ral_gpu_free(rt, p);
  fake_cuda_fail_next_alloc();
  CHECK(call(rt, NULL, alloc_entry, &bytes, NULL, NULL) == RAL_OK && reached);
  CHECK(gpu_stats(rt).bytes_cached == 1 << 20); /* the 4096-byte block was freed */
  fake_cuda_fail_next_alloc();
  fake_cuda_fail_next_alloc();
  CHECK(ral_gpu_alloc(rt, 5 << 20, &p) == RAL_ERR_OUT_OF_MEMORY && p == NULL);
  CHECK(strcmp(ral_runtime_create_error(), "out of memory allocating 5242880 bytes on the GPU: " OUT_OF_MEMORY) == 0);
}

typedef struct {
  const void *host;
  int64_t bytes;
  void *device;
} constant_args;

static void constant_entry(void *args, void *results) {
  (void)results;
  constant_args *c = args;
  c->device = disc_ral_gpu_constant(c->host, c->bytes);
  reached = 1;
}

static void test_constants(ral_runtime *rt) {
  static float weights[64];
  for (int i = 0; i < 64; i++) weights[i] = (float)i * 0.5f;
  fake_cuda_reset();
  int64_t base = gpu_stats(rt).bytes_in_use;
  constant_args a = {weights, sizeof weights, NULL}, b = a, c = {weights, 16, NULL}, empty = {weights, 0, NULL};
  CHECK(call(rt, (void *)1, constant_entry, &a, NULL, NULL) == RAL_OK && a.device);
  CHECK(call(rt, (void *)2, constant_entry, &b, NULL, NULL) == RAL_OK && b.device == a.device); /* another stream: the same copy */
  CHECK(fake_cuda_count("h2d") == 1 && fake_cuda_count("syncs") == 1); /* copied once, and waited for */
  CHECK(call(rt, NULL, constant_entry, &c, NULL, NULL) == RAL_OK && c.device && c.device != a.device); /* a shorter one */
  CHECK(call(rt, NULL, constant_entry, &empty, NULL, NULL) == RAL_OK && empty.device);
  CHECK(gpu_stats(rt).bytes_in_use == base + 256 + 16 + 1);
  float back[64];
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  CHECK(ral_gpu_copy(ctx, back, a.device, sizeof back, RAL_COPY_DEVICE_TO_HOST) == RAL_OK);
  CHECK(memcmp(back, weights, sizeof back) == 0);
  ral_context_destroy(ctx);
  ral_runtime_gpu_forget(rt, weights, sizeof weights);
  CHECK(gpu_stats(rt).bytes_in_use == base);
  CHECK(call(rt, NULL, constant_entry, &a, NULL, NULL) == RAL_OK && fake_cuda_count("h2d") == 3); /* copied again */
}

/* batch x inner products [m x k] x [k x n] against a loop: A [batch, inner / a_group, m, k] (ta:
 * stored as [.., k, m]), B [batch, inner / b_group, k, n] (tb: stored as [.., n, k]), C [batch,
 * inner, m, n + pad] (its padding left alone); `calls`: the cuBLAS calls (k == 0: memsets) made. */
static int gemm_matches(ral_context *ctx, int is_double, int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, int ta,
                        int tb, int64_t a_group, int64_t b_group, int64_t pad, int64_t calls) {
  int64_t ldc = n + pad, sa_m = ta ? 1 : k, sa_k = ta ? m : 1, sb_k = tb ? 1 : n, sb_n = tb ? k : 1;
  int64_t sa_i = m * k, sa_b = (inner + a_group - 1) / a_group * sa_i, sb_i = k * n, sb_b = (inner + b_group - 1) / b_group * sb_i;
  int64_t sc_i = m * ldc, sc_b = inner * sc_i;
  size_t na = (size_t)(batch * sa_b), nb = (size_t)(batch * sb_b), nc = (size_t)(batch * sc_b);
  double *a = calloc(na + 1, sizeof(double)), *b = calloc(nb + 1, sizeof(double)), *c = calloc(nc + 1, sizeof(double));
  float *af = calloc(na + 1, sizeof(float)), *bf = calloc(nb + 1, sizeof(float)), *cf = calloc(nc + 1, sizeof(float));
  for (size_t i = 0; i < na; i++) af[i] = (float)(a[i] = (double)((i * 7) % 11) - 5);
  for (size_t i = 0; i < nb; i++) bf[i] = (float)(b[i] = (double)((i * 3) % 7) - 3);
  for (size_t i = 0; i < nc; i++) cf[i] = (float)(c[i] = 99);
  fake_cuda_reset();
  if (is_double)
    disc_ral_gpu_gemm_f64(batch, inner, m, n, k, a, sa_b, sa_i, a_group, sa_m, sa_k, b, sb_b, sb_i, b_group, sb_k, sb_n, c,
                          sc_b, sc_i, ldc);
  else
    disc_ral_gpu_gemm_f32(batch, inner, m, n, k, af, sa_b, sa_i, a_group, sa_m, sa_k, bf, sb_b, sb_i, b_group, sb_k, sb_n, cf,
                          sc_b, sc_i, ldc);
  int ok = ral_context_status(ctx) == RAL_OK && fake_cuda_count(k ? "gemms" : "memsets") == calls;
  for (int64_t e = 0; e < batch * inner; e++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < ldc; j++) {
        int64_t o = e / inner, x = e % inner, at = (e / inner) * sc_b + x * sc_i + i * ldc + j;
        double ref = 99;
        if (j < n) {
          ref = 0;
          for (int64_t l = 0; l < k; l++)
            ref += a[o * sa_b + x / a_group * sa_i + i * sa_m + l * sa_k] * b[o * sb_b + x / b_group * sb_i + l * sb_k + j * sb_n];
        }
        ok &= (is_double ? c[at] : (double)cf[at]) == ref;
      }
  free(a), free(b), free(c), free(af), free(bf), free(cf);
  return ok;
}

static void test_gemm(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context_set_stream(ctx, (void *)0x77);
  ral_context *prev = ral_context_enter(ctx);
  ral_kernel_stat before, after;
  ral_kernel_stats((const void *)disc_ral_gpu_gemm_f32, &before);
  for (int d = 0; d < 2; d++) {
    CHECK(gemm_matches(ctx, d, 1, 1, 5, 7, 3, 0, 0, 1, 1, 0, 1)); /* plain */
    CHECK(gemm_matches(ctx, d, 1, 1, 5, 7, 3, 1, 0, 1, 1, 0, 1)); /* A transposed */
    CHECK(gemm_matches(ctx, d, 1, 1, 5, 7, 3, 0, 1, 1, 1, 0, 1)); /* B transposed */
    CHECK(gemm_matches(ctx, d, 1, 1, 5, 7, 3, 1, 1, 1, 1, 2, 1)); /* both, C padded */
    CHECK(gemm_matches(ctx, d, 1, 1, 1, 7, 3, 1, 0, 1, 1, 0, 1)); /* one row */
    CHECK(gemm_matches(ctx, d, 2, 3, 4, 5, 6, 0, 1, 1, 1, 0, 1)); /* two levels that continue each other: one call */
    CHECK(gemm_matches(ctx, d, 2, 3, 4, 5, 6, 0, 0, 1, 1, 3, 1)); /* C padded */
    CHECK(gemm_matches(ctx, d, 3, 1, 4, 5, 6, 1, 0, 1, 1, 0, 1)); /* the outer level only */
    /* several strided batches: one call on address arrays (the fake counts its 8 or 12 entries) */
    CHECK(gemm_matches(ctx, d, 2, 4, 3, 5, 6, 0, 1, 1, 2, 0, 8)); /* B shared by pairs */
    CHECK(gemm_matches(ctx, d, 2, 4, 3, 5, 6, 0, 0, 2, 1, 0, 8)); /* A shared by pairs */
    CHECK(gemm_matches(ctx, d, 2, 6, 3, 5, 6, 1, 1, 2, 3, 1, 12)); /* groups of 2 and 3 */
    CHECK(gemm_matches(ctx, d, 1, 2, 3, 5, 6, 0, 0, 4, 1, 0, 2)); /* a group larger than the entries */
    CHECK(gemm_matches(ctx, d, 2, 3, 4, 5, 0, 0, 0, 1, 1, 2, 6)); /* k == 0: zeros, padding left alone */
    CHECK(gemm_matches(ctx, d, 2, 3, 0, 5, 6, 0, 0, 1, 1, 0, 0)); /* no rows: nothing */
  }
  ral_kernel_stats((const void *)disc_ral_gpu_gemm_f32, &after);
  CHECK(after.calls - before.calls == 12); /* the products that ran (not the zeros) */
  CHECK(fake_cuda_count("blas_stream") == 0x77 && ral_context_status(ctx) == RAL_OK);
  float x[8] = {0};
  disc_ral_gpu_gemm_f32(1, 1, 2, 2, 2, x, 0, 0, 1, 2, 2, x, 0, 0, 1, 2, 1, x, 0, 0, 2);
  CHECK(ral_context_status(ctx) == RAL_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(ral_context_message(ctx), "disc_ral_gpu_gemm_f32: operand has no unit stride") == 0);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

typedef struct {
  ral_runtime *rt;
  ral_context *ctx;
  int index, ok;
} worker;

static const float worker_a[6] = {1, 2, 3, 4, 5, 6}; /* [2 x 3], a constant */

/* results: the device buffer of [2 x 2] = worker_a x [3 x 2] (index + 1, ...) */
static void worker_entry(void *args, void *results) {
  worker *w = args;
  float host_b[6];
  for (int i = 0; i < 6; i++) host_b[i] = (float)(w->index + i);
  const float *a = disc_ral_gpu_constant(worker_a, sizeof worker_a);
  float *b = disc_ral_gpu_alloc(sizeof host_b), *c = disc_ral_gpu_alloc(4 * sizeof(float));
  ral_gpu_copy(w->ctx, b, host_b, sizeof host_b, RAL_COPY_HOST_TO_DEVICE);
  int64_t slots[2] = {w->index, (int64_t)(uintptr_t)c};
  disc_ral_gpu_launch(cubin, sizeof cubin, ptx, "disc_k1", slots, 2, 1000, 128);
  disc_ral_gpu_gemm_f32(1, 1, 2, 2, 3, a, 0, 0, 1, 3, 1, b, 0, 0, 1, 2, 1, c, 0, 0, 2);
  disc_ral_gpu_free(b);
  *(float **)results = c;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  w->ok = 1;
  for (int rep = 0; rep < 25; rep++) {
    float *c = NULL, back[4] = {0};
    w->ok &= ral_context_create(w->rt, &w->ctx) == RAL_OK;
    ral_context_set_stream(w->ctx, (void *)(uintptr_t)(w->index + 1));
    ral_context *prev = ral_context_enter(w->ctx);
    w->ok &= ral_context_call(w->ctx, worker_entry, w, &c) == RAL_OK;
    int taken = ral_context_take(w->ctx, c); /* 0 after a failed call: the context gives c back */
    w->ok &= taken && ral_gpu_copy(w->ctx, back, c, sizeof back, RAL_COPY_DEVICE_TO_HOST) == RAL_OK;
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) {
        float ref = 0;
        for (int l = 0; l < 3; l++) ref += worker_a[i * 3 + l] * (float)(w->index + l * 2 + j);
        w->ok &= back[i * 2 + j] == ref;
      }
    ral_context_enter(prev);
    ral_context_destroy(w->ctx);
    if (taken) ral_gpu_free(w->rt, c);
  }
  return NULL;
}

static void test_threads(ral_runtime *rt) {
  pthread_t threads[4];
  worker workers[4];
  fake_cuda_reset();
  for (int i = 0; i < 4; i++) {
    workers[i] = (worker){.rt = rt, .index = i};
    pthread_create(&threads[i], NULL, worker_main, &workers[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(threads[i], NULL);
    CHECK(workers[i].ok);
  }
  CHECK(fake_cuda_launch_count() == 100 && fake_cuda_count("gemms") == 100);
  CHECK(fake_cuda_count("h2d") == 101); /* the constant once, the B operands */
}

static void test_without_cublas(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 1, &rt) == RAL_OK);
  CHECK(ral_runtime_enable_gpu(rt, fake, "/nonexistent/libcublas.so", 0) == RAL_OK);
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  float x[4] = {0};
  disc_ral_gpu_gemm_f32(1, 1, 2, 2, 1, x, 0, 0, 1, 1, 1, x, 0, 0, 1, 2, 1, x, 0, 0, 2);
  CHECK(ral_context_status(ctx) == RAL_ERR_UNAVAILABLE);
  CHECK(strstr(ral_context_message(ctx), "disc_ral_gpu_gemm_f32: cannot load " API("cuBLAS", "hipBLAS")
                                         " '/nonexistent/libcublas.so'") != NULL);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
  void *kept;
  CHECK(ral_gpu_alloc(rt, 100, &kept) == RAL_OK); /* never given back: freed with the runtime */
  ral_runtime_destroy(rt);
  CHECK(fake_cuda_count("live") == 0 && fake_cuda_count("primary_refs") == 0);
}

/* DLManagedTensor's fields as dlpack.h lays them out */
typedef struct {
  void *data;
  int32_t device_type, device_id, ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t *shape, *strides;
  uint64_t byte_offset;
  void *manager_ctx;
  void (*deleter)(void *self);
} dl_tensor;

/* A buffer exported through DLPack outlives the runtime's owner: the runtime (device memory,
 * primary context) goes when the last deleter has run. */
static void test_dlpack(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 1, &rt) == RAL_OK);
  void *p;
  CHECK(ral_gpu_dlpack(rt, NULL, 0, NULL, NULL, 2, 32) == NULL); /* no GPU */
  CHECK(ral_runtime_enable_gpu(rt, fake, fake, 0) == RAL_OK);
  CHECK(ral_gpu_alloc(rt, 24, &p) == RAL_OK);
  int64_t shape[2] = {2, 3}, strides[2] = {3, 1};
  dl_tensor *t = ral_gpu_dlpack(rt, p, 2, shape, strides, 2, 32);
  CHECK(t && t->data == p && t->device_type == API(2, 10) && t->device_id == 0 && t->ndim == 2);
  CHECK(t->code == 2 && t->bits == 32 && t->lanes == 1 && t->byte_offset == 0);
  CHECK(t->shape[0] == 2 && t->shape[1] == 3 && t->strides[0] == 3 && t->strides[1] == 1);
  ral_runtime_destroy(rt);
  CHECK(fake_cuda_count("primary_refs") == 1 && fake_cuda_count("live") > 0); /* still there for the export */
  ral_dlpack_delete(t);
  CHECK(fake_cuda_count("live") == 0 && fake_cuda_count("primary_refs") == 0);
}

static void test_without_gpu(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 1, &rt) == RAL_OK);
  void *p = &rt;
  CHECK(ral_gpu_alloc(rt, 100, &p) == RAL_ERR_UNAVAILABLE && p == NULL);
  CHECK(strcmp(ral_runtime_create_error(), "ral_gpu_alloc: no GPU enabled in the runtime") == 0);
  char message[512];
  int64_t bytes = 8;
  CHECK(call(rt, NULL, alloc_entry, &bytes, NULL, message) == RAL_ERR_UNAVAILABLE && !reached);
  CHECK(strcmp(message, "disc_ral_gpu_alloc: no GPU enabled in the runtime") == 0);
  ral_memory_stats st = gpu_stats(rt);
  CHECK(!ral_runtime_has_gpu(rt) && ral_runtime_gpu_kind(rt) == RAL_GPU_NONE && st.allocations == 0);
  ral_runtime_destroy(rt);
}

/* A second runtime on the other API's fake (in the same process): a round trip through device
 * memory and a GEMM. */
static void test_other_api(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 1, &rt) == RAL_OK);
  CHECK(ral_runtime_enable_gpu(rt, other_fake, other_fake, 0) == RAL_OK);
  CHECK(ral_runtime_gpu_kind(rt) == other_kind);
  float host[6] = {1, 2, 3, 4, 5, 6}, back[4] = {0};
  void *a;
  CHECK(ral_gpu_alloc(rt, sizeof host + sizeof back, &a) == RAL_OK);
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  float *c = (float *)a + 6;
  CHECK(ral_gpu_copy(ctx, a, host, sizeof host, RAL_COPY_HOST_TO_DEVICE) == RAL_OK);
  disc_ral_gpu_gemm_f32(1, 1, 2, 2, 3, a, 0, 0, 1, 3, 1, a, 0, 0, 1, 1, 3, c, 0, 0, 2); /* [2 x 3] x its transpose */
  CHECK(ral_gpu_copy(ctx, back, c, sizeof back, RAL_COPY_DEVICE_TO_HOST) == RAL_OK);
  CHECK(back[0] == 14 && back[1] == 32 && back[2] == 32 && back[3] == 77 && ral_context_status(ctx) == RAL_OK);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
  ral_runtime_destroy(rt);
}

int main(void) {
  ral_kernel_stats_enable(1);
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 2, &rt) == RAL_OK);
  test_enable(rt);
  test_memory(rt);
  test_launch(rt);
  test_launch_failures(rt);
  test_context_buffers(rt);
  test_out_of_memory(rt);
  test_call_buffers(rt);
  test_constants(rt);
  test_gemm(rt);
  test_threads(rt);
  ral_runtime_destroy(rt);
  /* everything given back: memory, modules, the cuBLAS handle, the primary context */
  CHECK(fake_cuda_count("live") == 0 && fake_cuda_count("modules") == 0 && fake_cuda_count("handles") == 0 &&
        fake_cuda_count("primary_refs") == 0);
  test_without_cublas();
  test_dlpack();
  test_without_gpu();
  test_other_api();
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}
