/* Tests of the RAL's C API: allocator, contexts, thread pool, GEMM, convolution. Usage: test_ral [blas.so] */
#include "ral/ral.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "packed_gemm.h"
#include "small_gemm.h"
#include "check.h"

static void test_allocator_reuse_and_take(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  char *a = ral_alloc(ctx, 1000);
  CHECK(a != NULL && ((uintptr_t)a % 64) == 0);
  memset(a, 1, 1000);
  char *b = ral_alloc(ctx, 1000);
  CHECK(b != NULL && b != a);
  CHECK(ral_context_take(ctx, b) == 1);
  CHECK(ral_context_take(ctx, b) == 0); /* taken already */
  int on_stack;
  CHECK(ral_context_take(ctx, &on_stack) == 0);
  ral_context_destroy(ctx); /* frees a, keeps b */
  ral_memory_stats st;
  ral_runtime_memory_stats(rt, &st);
  CHECK(st.bytes_in_use == 1000);
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  char *c = ral_alloc(ctx, 900); /* same size class: comes from the cache */
  CHECK(c == a);
  ral_context_destroy(ctx);
  ral_buffer_free(rt, b);
  ral_runtime_memory_stats(rt, &st);
  CHECK(st.bytes_in_use == 0);
  CHECK(st.cache_hits >= 1);
  CHECK(st.peak_bytes >= 2000);
  ral_runtime_reset_peak(rt);
  ral_runtime_memory_stats(rt, &st);
  CHECK(st.peak_bytes == 0);
}

static ral_memory_stats host_stats(ral_runtime *rt) {
  ral_memory_stats st;
  ral_runtime_memory_stats(rt, &st);
  return st;
}

/* A request takes a cached block of its size class or of a larger one up to twice its class (a
 * new shape's buffer reusing memory an earlier shape gave back), never a larger one. */
static void test_allocator_fits_cached_blocks(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 1, &rt) == RAL_OK);
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  char *big = ral_alloc(ctx, 1 << 20);
  CHECK(big != NULL);
  ral_context_destroy(ctx);
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  char *small = ral_alloc(ctx, 300000);     /* class 327680: the MiB block is more than twice that */
  char *half = ral_alloc(ctx, (1 << 19) + 1); /* class 655360: the MiB block fits */
  CHECK(small != NULL && small != big && half == big);
  memset(half, 1, (1 << 19) + 1);
  ral_context_destroy(ctx);
  ral_memory_stats st = host_stats(rt);
  CHECK(st.cache_hits == 1 && st.bytes_in_use == 0 && st.bytes_cached == (1 << 20) + 327680);
  CHECK(ral_context_create(rt, &ctx) == RAL_OK); /* back in its own class: a MiB request takes it again */
  CHECK(ral_alloc(ctx, 1 << 20) == big);
  ral_context_destroy(ctx);
  ral_runtime_destroy(rt);
}

/* Cached memory: size classes wasting under a quarter of a request, a limit past which a block
 * given back is freed, blocks idle past the idle time freed (by a pool worker while it waits),
 * and ral_runtime_trim. */
static void test_cache_limits(void) {
  ral_runtime *rt;
  CHECK(ral_runtime_create(NULL, 2, &rt) == RAL_OK); /* one pool worker */
  ral_context *ctx;
  size_t sizes[] = {1, 64, 65, 100, 1000, 1025, 4097, 100000, 1 << 20, (1 << 20) + 1, 123456789};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    CHECK(ral_context_create(rt, &ctx) == RAL_OK);
    CHECK(ral_alloc(ctx, sizes[i]) != NULL);
    ral_context_destroy(ctx);
    int64_t cached = host_stats(rt).bytes_cached;
    CHECK(cached >= (int64_t)sizes[i] && (sizes[i] < 64 || cached * 4 <= (int64_t)sizes[i] * 5)); /* <= 25 % more */
    ral_runtime_trim(rt);
    CHECK(host_stats(rt).bytes_cached == 0);
  }
  ral_runtime_set_cache_limits(rt, 10000, 60000);
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  for (int i = 0; i < 5; i++) CHECK(ral_alloc(ctx, 4000) != NULL);
  ral_context_destroy(ctx);
  CHECK(host_stats(rt).bytes_cached == 8192); /* two 4096-byte blocks fit under 10000, the others were freed */
  ral_runtime_set_cache_limits(rt, 1 << 30, 50); /* idle after 50 ms */
  for (int i = 0; i < 50 && host_stats(rt).bytes_cached != 0; i++) { /* the worker waits a second for work, then looks */
    struct timespec pause = {0, 100000000};
    nanosleep(&pause, NULL);
  }
  CHECK(host_stats(rt).bytes_cached == 0);
  ral_runtime_destroy(rt);
}

static void count_nothing(void *data, int64_t lo, int64_t hi) { (void)data, (void)lo, (void)hi; }

/* Kernel statistics are collected only while asked for. */
static void test_stats_off_until_enabled(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  ral_kernel_stat st;
  disc_ral_parallel_for(count_nothing, NULL, 4, 4);
  ral_kernel_stats((const void *)count_nothing, &st);
  CHECK(st.calls == 0);
  ral_kernel_stats_enable(1);
  disc_ral_parallel_for(count_nothing, NULL, 4, 4);
  ral_kernel_stats((const void *)count_nothing, &st);
  CHECK(st.calls == 1 && st.pool_calls == 0);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

static void test_generated_code_hooks(ral_runtime *rt) {
  CHECK(_mlir_memref_to_llvm_alloc(16) == NULL); /* no current context */
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  CHECK(prev == NULL);
  void *p = _mlir_memref_to_llvm_aligned_alloc(128, 100);
  CHECK(p != NULL && ((uintptr_t)p % 64) == 0);
  _mlir_memref_to_llvm_free(p);
  CHECK(ral_context_take(ctx, p) == 0); /* freed already */
  ral_context_enter(prev);
  CHECK(ral_context_status(ctx) == RAL_OK);
  ral_context_fail(ctx, RAL_ERR_INVALID_ARGUMENT, "first");
  ral_context_fail(ctx, RAL_ERR_INTERNAL, "second");
  CHECK(ral_context_status(ctx) == RAL_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(ral_context_message(ctx), "first") == 0);
  ral_context_destroy(ctx);
}

static int reached_after_failure;

static void greedy_entry(void *args, void *results) {
  (void)args, (void)results;
  char *p = _mlir_memref_to_llvm_alloc((size_t)1 << 62); /* larger than any size class */
  reached_after_failure = 1;
  p[0] = 1; /* never runs: the call ended at the failed allocation */
}

static void negative_size_entry(void *args, void *results) {
  (void)args, (void)results;
  disc_ral_check_alloc(1, -3, "iota (model.py:7): a buffer of memref<?x4xf32>");
  reached_after_failure = 1;
}

static void checked_entry(void *args, void *results) {
  (void)args, (void)results;
  disc_ral_check_alloc(0, 5, "fine");
  disc_ral_check_shape(0, "fine too {0}", 1, 2);
  reached_after_failure = 1;
}

static void contract_entry(void *args, void *results) {
  (void)args, (void)results;
  disc_ral_check_shape(1, "stablehlo.dynamic_reshape at m.py:3: {0} elements into a shape of {1} {2}{", 6, -16);
  reached_after_failure = 1;
}

static void test_failures_end_the_call(ral_runtime *rt) {
  ral_entry entries[] = {greedy_entry, negative_size_entry, checked_entry, contract_entry};
  ral_status want[] = {RAL_ERR_OUT_OF_MEMORY, RAL_ERR_SHAPE, RAL_OK, RAL_ERR_SHAPE};
  const char *message[] = {"out of memory allocating 4611686018427387904 bytes",
                           "iota (model.py:7): a buffer of memref<?x4xf32>: a dim is negative (-3)", "",
                           "stablehlo.dynamic_reshape at m.py:3: 6 elements into a shape of -16 {2}{"};
  for (int i = 0; i < 4; i++) {
    ral_context *ctx;
    CHECK(ral_context_create(rt, &ctx) == RAL_OK);
    ral_context *prev = ral_context_enter(ctx);
    reached_after_failure = 0;
    CHECK(ral_context_call(ctx, entries[i], NULL, NULL) == want[i]);
    CHECK(reached_after_failure == (want[i] == RAL_OK));
    CHECK(strcmp(ral_context_message(ctx), message[i]) == 0);
    ral_context_enter(prev);
    ral_context_destroy(ctx);
  }
}

typedef struct {
  int64_t *out;
} fill_data;

static void fill_body(void *data, int64_t lo, int64_t hi) {
  fill_data *d = data;
  for (int64_t i = lo; i < hi; i++) d->out[i] += i * 2;
}

static void test_parallel_for(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  enum { N = 100003 };
  int64_t *out = calloc(N, sizeof(int64_t));
  fill_data d = {out};
  for (int rep = 0; rep < 20; rep++) ral_parallel_for(ctx, fill_body, &d, 0, N, 7);
  int ok = 1;
  for (int64_t i = 0; i < N; i++) ok &= out[i] == 40 * i;
  CHECK(ok);
  ral_parallel_for(ctx, fill_body, &d, 5, 5, 1); /* empty range */
  free(out);
  ral_context_destroy(ctx);
}

typedef struct {
  ral_runtime *rt;
  int ok;
} thread_arg;

static void *concurrent_caller(void *p) {
  thread_arg *t = p;
  ral_context *ctx;
  ral_context_create(t->rt, &ctx);
  int64_t *out = ral_alloc(ctx, 5000 * sizeof(int64_t));
  memset(out, 0, 5000 * sizeof(int64_t));
  fill_data d = {out};
  for (int rep = 0; rep < 50; rep++) ral_parallel_for(ctx, fill_body, &d, 0, 5000, 16);
  t->ok = 1;
  for (int64_t i = 0; i < 5000; i++) t->ok &= out[i] == 100 * i;
  ral_context_destroy(ctx);
  return NULL;
}

static void test_threads_share_runtime(ral_runtime *rt) {
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){rt, 0};
    pthread_create(&th[i], NULL, concurrent_caller, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(args[i].ok);
  }
}

/* Loops of concurrent calls run at the same time: each loop's first chunk waits (up to 5 s) until
 * the other loop has started one. */
static atomic_int loops_started;

static void meet_body(void *data, int64_t lo, int64_t hi) {
  (void)hi;
  int *met = data;
  if (lo != 0) return;
  atomic_fetch_add(&loops_started, 1);
  for (int i = 0; i < 5000 && atomic_load(&loops_started) < 2; i++) {
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  *met = atomic_load(&loops_started) >= 2;
}

static void *meeting_caller(void *p) {
  thread_arg *t = p;
  ral_context *ctx;
  ral_context_create(t->rt, &ctx);
  ral_parallel_for(ctx, meet_body, &t->ok, 0, 64, 1);
  ral_context_destroy(ctx);
  return NULL;
}

static void test_concurrent_loops_overlap(ral_runtime *rt) {
  pthread_t th[2];
  thread_arg args[2];
  atomic_store(&loops_started, 0);
  for (int i = 0; i < 2; i++) {
    args[i] = (thread_arg){rt, 0};
    pthread_create(&th[i], NULL, meeting_caller, &args[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK(args[0].ok && args[1].ok);
}

/* Stress (run under TSan in CI): threads whose calls allocate, free and fail inside parallel
 * loops on every thread of the pool. A failed allocation ends its chunk (its pointer is never
 * used), no chunk starts after it, and the call ends after the loop. */
typedef struct {
  ral_context *ctx;
  int64_t fail_at;          /* the iteration whose allocation fails (-1: none) */
  atomic_int after_failure; /* work done past a failed allocation */
  atomic_int done;          /* iterations completed */
  int after_loop;           /* the entry went on after the loop */
} alloc_call;

enum { ALLOC_LOOP = 400 };

static void allocating_body(void *data, int64_t lo, int64_t hi) {
  alloc_call *c = data;
  for (int64_t i = lo; i < hi; i++) {
    size_t bytes = i == c->fail_at ? (size_t)1 << 62 : (size_t)(64 + i % 7 * 200);
    char *p = _mlir_memref_to_llvm_alloc(bytes);
    if (i == c->fail_at) atomic_fetch_add(&c->after_failure, 1);
    memset(p, (int)i, 64);
    if (i % 3) _mlir_memref_to_llvm_free(p);
    atomic_fetch_add(&c->done, 1);
  }
}

static void allocating_entry(void *args, void *results) {
  (void)results;
  alloc_call *c = args;
  ral_parallel_for(c->ctx, allocating_body, c, 0, ALLOC_LOOP, 1);
  c->after_loop = 1;
}

static void *allocating_caller(void *p) {
  thread_arg *t = p;
  t->ok = 1;
  for (int round = 0; round < 60; round++) {
    alloc_call c = {.fail_at = round % 3 ? -1 : (round * 37) % ALLOC_LOOP};
    atomic_init(&c.after_failure, 0);
    atomic_init(&c.done, 0);
    if (ral_context_create(t->rt, &c.ctx) != RAL_OK) return t->ok = 0, NULL;
    ral_context *prev = ral_context_enter(c.ctx);
    ral_status status = ral_context_call(c.ctx, allocating_entry, &c, NULL);
    ral_context_enter(prev);
    if (c.fail_at < 0)
      t->ok &= status == RAL_OK && c.after_loop && atomic_load(&c.done) == ALLOC_LOOP;
    else
      t->ok &= status == RAL_ERR_OUT_OF_MEMORY && !c.after_loop && atomic_load(&c.done) < ALLOC_LOOP &&
               strcmp(ral_context_message(c.ctx), "out of memory allocating 4611686018427387904 bytes") == 0;
    t->ok &= atomic_load(&c.after_failure) == 0;
    ral_context_destroy(c.ctx);
  }
  return NULL;
}

static void test_failures_inside_loops(ral_runtime *rt) {
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){rt, 0};
    pthread_create(&th[i], NULL, allocating_caller, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(args[i].ok);
  }
  CHECK(host_stats(rt).bytes_in_use == 0); /* every buffer went back with its context */
}

/* One [m x k] x [k x n] product with A and B laid out by the given strides (element (i, k) of A at
 * i * sa_m + k * sa_k), large enough for the pool, checked against a reference loop. */
static int gemm_matches(ral_context *ctx, int64_t m, int64_t n, int64_t k, int64_t sa_m, int64_t sa_k, int64_t sb_k,
                        int64_t sb_n) {
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * n);
  for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 11) - 5;
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 3) % 7) - 3;
  disc_ral_gemm_f32(1, 1, m, n, k, a, 0, 0, 1, sa_m, sa_k, b, 0, 0, 1, sb_k, sb_n, c, 0, m * n, n);
  int ok = ral_context_status(ctx) == RAL_OK;
  for (int64_t i = 0; i < m && ok; i++)
    for (int64_t j = 0; j < n; j++) {
      float ref = 0;
      for (int64_t x = 0; x < k; x++) ref += a[i * sa_m + x * sa_k] * b[x * sb_k + j * sb_n];
      ok &= c[i * n + j] == ref;
    }
  free(a);
  free(b);
  free(c);
  return ok;
}

/* An epilogue over rows of C: adds 1 to each element of its rows and counts each row. */
typedef struct {
  float *c;
  int64_t n;
  atomic_int *seen;
} epilogue_data;

static void add_one(void *data, int64_t lo, int64_t hi) {
  epilogue_data *e = data;
  for (int64_t i = lo; i < hi; i++) {
    atomic_fetch_add(&e->seen[i], 1);
    for (int64_t j = 0; j < e->n; j++) e->c[i * e->n + j] += 1;
  }
}

/* batch x [m x k] x [k x n] with the epilogue: every row seen once, after its product; the batch
 * as the outer level, or as the inner one (`inner`: where entries and rows may swap) */
static int gemm_epilogue_matches(ral_context *ctx, int64_t batch, int64_t m, int64_t n, int64_t k, int inner) {
  float *a = malloc(sizeof(float) * batch * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * batch * m * n);
  atomic_int *seen = calloc((size_t)(batch * m), sizeof(atomic_int));
  for (int64_t i = 0; i < batch * m * k; i++) a[i] = (float)((i * 5) % 9) - 4;
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 3) % 7) - 3;
  epilogue_data e = {.c = c, .n = n, .seen = seen};
  if (inner)
    disc_ral_gemm_f32_epilogue(1, batch, m, n, k, a, batch * m * k, m * k, 1, k, 1, b, 0, 0, 1, n, 1, c, batch * m * n, m * n, n, add_one, &e,
                               batch * m, batch * m * n);
  else
    disc_ral_gemm_f32_epilogue(batch, 1, m, n, k, a, m * k, 0, 1, k, 1, b, 0, 0, 1, n, 1, c, m * n, m * n, n, add_one, &e, batch * m,
                               batch * m * n);
  int ok = ral_context_status(ctx) == RAL_OK;
  for (int64_t bi = 0; bi < batch; bi++)
    for (int64_t i = 0; i < m && ok; i++) {
      ok &= atomic_load(&seen[bi * m + i]) == 1;
      for (int64_t j = 0; j < n; j++) {
        float ref = 1;
        for (int64_t x = 0; x < k; x++) ref += a[(bi * m + i) * k + x] * b[x * n + j];
        ok &= c[(bi * m + i) * n + j] == ref;
      }
    }
  free(a);
  free(b);
  free(c);
  free(seen);
  return ok;
}

/* Attention scores per head straight from [B, S, H, D] buffers: batch levels (B, H) with strides
 * (S*H*D, D), rows S with stride H*D, D contiguous; B operand transposed (n = S with stride H*D).
 * The keys have H / group heads, each serving `group` consecutive query heads (grouped-query
 * attention); `keys_first`: the scores transposed, keys x queries (the keys are A). */
static int gemm_heads_match(ral_context *ctx, int64_t nb, int64_t s, int64_t h, int64_t d, int64_t group, int keys_first) {
  int64_t kh = h / group;
  float *q = malloc(sizeof(float) * nb * s * h * d), *k = malloc(sizeof(float) * nb * s * kh * d);
  float *c = malloc(sizeof(float) * nb * h * s * s);
  for (int64_t i = 0; i < nb * s * h * d; i++) q[i] = (float)((i * 7) % 13) - 6;
  for (int64_t i = 0; i < nb * s * kh * d; i++) k[i] = (float)((i * 5) % 11) - 5;
  /* C written as [B, S, H, S]: row i of head x at ((b * s + i) * h + x) * s */
  if (keys_first)
    disc_ral_gemm_f32(nb, h, s, s, d, k, s * kh * d, d, group, kh * d, 1, q, s * h * d, d, 1, 1, h * d, c, s * h * s, s, h * s);
  else
    disc_ral_gemm_f32(nb, h, s, s, d, q, s * h * d, d, 1, h * d, 1, k, s * kh * d, d, group, 1, kh * d, c, s * h * s, s, h * s);
  int ok = ral_context_status(ctx) == RAL_OK;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t x = 0; x < h; x++)
      for (int64_t i = 0; i < s; i++)
        for (int64_t j = 0; j < s; j++) {
          float ref = 0;
          int64_t qi = keys_first ? j : i, kj = keys_first ? i : j;
          for (int64_t e = 0; e < d; e++) ref += q[((b * s + qi) * h + x) * d + e] * k[((b * s + kj) * kh + x / group) * d + e];
          ok &= c[((b * s + i) * h + x) * s + j] == ref;
        }
  free(q);
  free(k);
  free(c);
  return ok;
}

/* The kernel for products with few rows, where this CPU has one: rows, columns and k not
 * multiples of its blocks, columns across panels, A or B transposed, C with a leading dim. */
static void test_small_gemm_kernel(void) {
  ral_small_sgemm_fn kernel = ral_small_sgemm_kernel();
  if (!kernel) {
    printf("small-product kernel: none on this CPU, skipped\n");
    return;
  }
  static const int64_t sizes[][3] = {{1, 1, 1}, {2, 5, 3}, {8, 48, 32}, {9, 49, 33}, {37, 1100, 70}, {64, 17, 300}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2], ldc = n + 3;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * ldc);
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 11) - 5;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 3) % 7) - 3;
    for (int form = 0; form < 3; form++) { /* A transposed, B transposed (A's rows contiguous) */
      int64_t sa_m = form == 1 ? 1 : k, sa_k = form == 1 ? m : 1, sb_k = form == 2 ? 1 : n, sb_n = form == 2 ? k : 1;
      for (int64_t i = 0; i < m * ldc; i++) c[i] = 99;
      kernel(m, n, k, a, sa_m, sa_k, b, sb_k, sb_n, c, ldc);
      int ok = 1;
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
          float ref = j < n ? 0 : 99; /* past n: untouched */
          for (int64_t x = 0; j < n && x < k; x++) ref += a[i * sa_m + x * sa_k] * b[x * sb_k + j * sb_n];
          ok &= c[i * ldc + j] == ref;
        }
      CHECK(ok);
    }
    free(a);
    free(b);
    free(c);
  }
}

/* The packed single-precision kernel, where this CPU has AVX2 and FMA: dims on either side of its
 * tiles (6 x 16) and blocks (k 256, rows 144, columns 2048), A and B either way round, B read in
 * place (few rows) and packed, C with a leading dim (past n untouched). Operands are allocated
 * to their exact size, so the sanitizer builds catch a read past them. Small integers keep every
 * sum exact. Run on a thread of its own too, whose panel buffer is freed when it ends. */
static int packed_gemm_matches(ral_sgemm_fn kernel, int64_t m, int64_t n, int64_t k, int a_transposed, int b_transposed) {
  int64_t ldc = n + 3, sa_m = a_transposed ? 1 : k, sa_k = a_transposed ? m : 1;
  int64_t sb_k = b_transposed ? 1 : n, sb_n = b_transposed ? k : 1;
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * ldc);
  for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 11) - 5;
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 3) % 7) - 3;
  for (int64_t i = 0; i < m * ldc; i++) c[i] = 99;
  kernel(m, n, k, a, sa_m, sa_k, b, sb_k, sb_n, c, ldc);
  int ok = 1;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      float ref = j < n ? 0 : 99;
      for (int64_t x = 0; j < n && x < k; x++) ref += a[i * sa_m + x * sa_k] * b[x * sb_k + j * sb_n];
      ok &= c[i * ldc + j] == ref;
    }
  free(a);
  free(b);
  free(c);
  return ok;
}

static void *packed_gemm_on_thread(void *kernel) {
  return (void *)(intptr_t)packed_gemm_matches((ral_sgemm_fn)kernel, 20, 33, 300, 0, 1);
}

static void test_packed_gemm_kernel(void) {
  static const int64_t sizes[][3] = {{1, 1, 1},     {1, 16, 9},     {5, 17, 8},     {6, 16, 256}, {7, 33, 257},
                                     {64, 48, 70},  {65, 48, 70},   {150, 31, 300}, {13, 2050, 5}, {70, 2064, 3},
                                     {145, 16, 513}, {2, 4100, 2},  {150, 300, 300}, {9, 16, 40},  {15, 20, 33}};
  const struct {
    const char *tile;
    ral_sgemm_fn kernel;
  } kernels[] = {{"AVX2", ral_packed_sgemm_avx2()}, {"AVX-512", ral_packed_sgemm_avx512()}};
  for (size_t v = 0; v < sizeof kernels / sizeof kernels[0]; v++) {
    ral_sgemm_fn kernel = kernels[v].kernel;
    if (!kernel) {
      printf("packed GEMM kernel, %s tile: not on this CPU, skipped\n", kernels[v].tile);
      continue;
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (int t = 0; t < 4; t++) CHECK(packed_gemm_matches(kernel, sizes[s][0], sizes[s][1], sizes[s][2], t & 1, t >> 1));
    pthread_t thread;
    void *ok = NULL;
    CHECK(pthread_create(&thread, NULL, packed_gemm_on_thread, (void *)kernel) == 0);
    pthread_join(thread, &ok);
    CHECK(ok == (void *)1);
  }
}

/* The FFT entry against a direct DFT in long double: lengths with factors of 4, 2, 3, 5 and small
 * primes, and with primes past the direct limit (Bluestein), every kind, 1-3 dims, float and
 * double, several lines per call. */
static void dft(const double *in, double *out, int64_t n, int inverse) {
  long double *c = malloc(sizeof(long double) * (size_t)n), *sn = malloc(sizeof(long double) * (size_t)n);
  for (int64_t m = 0; m < n; m++) {
    long double a = (inverse ? 2 : -2) * 3.14159265358979323846264338327950288L * (long double)m / (long double)n;
    c[m] = cosl(a);
    sn[m] = sinl(a);
  }
  for (int64_t k = 0; k < n; k++) {
    long double re = 0, im = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t m = (j * k) % n;
      re += in[2 * j] * c[m] - in[2 * j + 1] * sn[m];
      im += in[2 * j] * sn[m] + in[2 * j + 1] * c[m];
    }
    out[2 * k] = (double)(inverse ? re / n : re);
    out[2 * k + 1] = (double)(inverse ? im / n : im);
  }
  free(c), free(sn);
}

static int fft_1d_matches(int kind, int64_t n, int64_t batch) {
  int64_t in_points = kind == 3 ? n / 2 + 1 : n, out_points = kind == 2 ? n / 2 + 1 : n;
  int real_in = kind == 2, real_out = kind == 3;
  double *in = calloc((size_t)(2 * batch * n + 2), sizeof(double)), *out = calloc((size_t)(2 * batch * n + 2), sizeof(double));
  double *line = malloc(sizeof(double) * 2 * (size_t)n), *want = malloc(sizeof(double) * 2 * (size_t)n);
  for (int64_t i = 0; i < batch * in_points * (real_in ? 1 : 2); i++) in[i] = (double)((i * 37) % 23) / 7.0 - 1.5;
  disc_ral_fft(kind, 1, batch, 1, n, 0, 0, in, out);
  int ok = 1;
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t j = 0; j < n; j++) { /* the line as complex numbers (IRFFT: the whole Hermitian spectrum) */
      int64_t src = kind == 3 && j >= in_points ? n - j : j;
      double re = real_in ? in[b * n + j] : in[2 * (b * in_points + src)], im = real_in ? 0 : in[2 * (b * in_points + src) + 1];
      line[2 * j] = re;
      line[2 * j + 1] = kind == 3 && j >= in_points ? -im : im;
    }
    dft(line, want, n, kind == 1 || kind == 3);
    for (int64_t k = 0; k < out_points; k++) {
      double re = real_out ? out[b * n + k] : out[2 * (b * out_points + k)], im = real_out ? 0 : out[2 * (b * out_points + k) + 1];
      double scale = 1e-9 * (1 + n);
      ok &= fabs(re - want[2 * k]) < scale && (real_out || fabs(im - want[2 * k + 1]) < scale);
    }
  }
  free(in), free(out), free(line), free(want);
  return ok;
}

static void test_fft(ral_runtime *rt) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  static const int64_t lengths[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 30, 31, 37, 64, 97, 100, 210, 1000, 1031};
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
    for (int kind = 0; kind < 4; kind++) {
      int ok = fft_1d_matches(kind, lengths[i], lengths[i] >= 1000 ? 1 : 3);
      CHECK(ok);
      if (!ok) printf("fft kind %d of %lld points differs from the DFT\n", kind, (long long)lengths[i]);
    }
  /* 2-D: FFT of [2, 3, 5] over the last two dims against two passes of 1-D ones; float */
  float x[2 * 3 * 5 * 2], y[2 * 3 * 5 * 2];
  for (int i = 0; i < 60; i++) x[i] = (float)((i * 7) % 11) - 5;
  disc_ral_fft(0, 0, 2, 2, 3, 5, 0, x, y);
  int ok2 = 1;
  for (int b = 0; b < 2; b++)
    for (int k0 = 0; k0 < 3; k0++)
      for (int k1 = 0; k1 < 5; k1++) {
        double re = 0, im = 0;
        for (int j0 = 0; j0 < 3; j0++)
          for (int j1 = 0; j1 < 5; j1++) {
            double a = -2 * M_PI * ((double)(j0 * k0) / 3 + (double)(j1 * k1) / 5);
            const float *v = x + 2 * ((b * 3 + j0) * 5 + j1);
            re += v[0] * cos(a) - v[1] * sin(a);
            im += v[0] * sin(a) + v[1] * cos(a);
          }
        const float *got = y + 2 * ((b * 3 + k0) * 5 + k1);
        ok2 &= fabs(got[0] - re) < 1e-4 && fabs(got[1] - im) < 1e-4;
      }
  CHECK(ok2);
  CHECK(ral_context_status(ctx) == RAL_OK);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

/* LAPACK through the BLAS: LU of a batch split over the pool (P L U = A), an SVD (U S Vt = A), a
 * rotation's complex eigenpair (real LAPACK packs it in two columns), the symmetric
 * eigendecomposition, a triangular solve and Cholesky's info > 0; without a BLAS, a clear failure. */
static void test_lapack(ral_runtime *rt, int have_blas) {
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  enum { BATCH = 300, N = 12 };
  double *a = malloc(sizeof(double) * BATCH * N * N), *lu = malloc(sizeof(double) * BATCH * N * N);
  int32_t *piv = malloc(sizeof(int32_t) * BATCH * N), info[BATCH];
  for (int i = 0; i < BATCH * N * N; i++) a[i] = (double)((i * 37 + 11) % 29) / 7.0 - 2;
  disc_ral_lapack(DISC_LAPACK_GETRF, DISC_LAPACK_F64, 0, BATCH, N, N, 0, 0, a, NULL, lu, piv, info, NULL, NULL);
  if (!have_blas) {
    CHECK(ral_context_status(ctx) == RAL_ERR_UNAVAILABLE && strstr(ral_context_message(ctx), "dgetrf_ is not in the BLAS"));
  } else {
    CHECK(ral_context_status(ctx) == RAL_OK);
    double worst = 0;
    for (int b = 0; b < BATCH; b++) {
      const double *f = lu + b * N * N;
      double row[N][N]; /* L U, its rows then swapped back in reverse pivot order */
      for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
          double v = 0;
          for (int k = 0; k <= (i < j ? i : j); k++) v += (k == i ? 1 : f[i * N + k]) * f[k * N + j];
          row[i][j] = v;
        }
      for (int i = N - 1; i >= 0; i--) {
        int p = piv[b * N + i] - 1;
        for (int j = 0; j < N; j++) {
          double t = row[i][j];
          row[i][j] = row[p][j], row[p][j] = t;
        }
      }
      for (int i = 0; i < N * N; i++) worst = fmax(worst, fabs(row[i / N][i % N] - a[b * N * N + i]));
      CHECK(info[b] >= 0);
    }
    CHECK(worst < 1e-10);
    /* one matrix of order 300 (fewer than the threads): the blocked LU, trailing updates on the pool */
    enum { BIG = 300 };
    double *big = malloc(sizeof(double) * BIG * BIG), *blu = malloc(sizeof(double) * BIG * BIG), *prod = calloc(BIG * BIG, sizeof(double));
    int32_t *bpiv = malloc(sizeof(int32_t) * BIG), binfo = -1;
    uint64_t state = 12345;
    for (int i = 0; i < BIG * BIG; i++) { /* pseudo-random in [-1, 1): nonsingular, pivots move rows */
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      big[i] = (double)(state >> 11) / (double)(1ULL << 52) - 1;
    }
    disc_ral_lapack(DISC_LAPACK_GETRF, DISC_LAPACK_F64, 0, 1, BIG, BIG, 0, 0, big, NULL, blu, bpiv, &binfo, NULL, NULL);
    CHECK(ral_context_status(ctx) == RAL_OK && binfo == 0);
    for (int i = 0; i < BIG; i++) /* L U */
      for (int k = 0; k <= i; k++) {
        double l = k == i ? 1 : blu[i * BIG + k];
        for (int j = k; j < BIG; j++) prod[i * BIG + j] += l * blu[k * BIG + j];
      }
    for (int i = BIG - 1; i >= 0; i--) { /* the interchanges undone, last first */
      int p = bpiv[i] - 1;
      CHECK(p >= i && p < BIG);
      for (int j = 0; j < BIG; j++) {
        double t = prod[i * BIG + j];
        prod[i * BIG + j] = prod[p * BIG + j], prod[p * BIG + j] = t;
      }
    }
    double big_err = 0;
    for (int i = 0; i < BIG * BIG; i++) big_err = fmax(big_err, fabs(prod[i] - big[i]));
    CHECK(big_err < 1e-9);
    free(big), free(blu), free(prod), free(bpiv);
    /* SVD of 5 x 3, thin: u 5 x 3, vt 3 x 3 */
    double m[15], over[15], s[3], u[15], vt[9];
    for (int i = 0; i < 15; i++) m[i] = (double)((i * 5 + 3) % 7) - 3;
    disc_ral_lapack(DISC_LAPACK_GESDD, DISC_LAPACK_F64, 'S', 1, 5, 3, 3, 3, m, NULL, over, s, u, vt, info);
    CHECK(ral_context_status(ctx) == RAL_OK && info[0] == 0 && s[0] >= s[1] && s[1] >= s[2]);
    double err = 0;
    for (int i = 0; i < 5; i++)
      for (int j = 0; j < 3; j++) {
        double v = 0;
        for (int k = 0; k < 3; k++) v += u[i * 3 + k] * s[k] * vt[k * 3 + j];
        err = fmax(err, fabs(v - m[i * 3 + j]));
      }
    CHECK(err < 1e-12);
    /* the rotation [[0, -1], [1, 0]]: eigenvalues +-i, right vectors complex (float) */
    float rot[4] = {0, -1, 1, 0}, wr[2], wi[2], vl[8], vr[8];
    disc_ral_lapack(DISC_LAPACK_GEEV, DISC_LAPACK_F32, 'N' | 'V' << 8, 1, 2, 2, 0, 0, rot, NULL, wr, wi, vl, vr, info);
    CHECK(ral_context_status(ctx) == RAL_OK && info[0] == 0 && fabsf(wi[0] + wi[1]) < 1e-6f && fabsf(fabsf(wi[0]) - 1) < 1e-6f);
    for (int j = 0; j < 2; j++) /* rot v = w v, v column j of the row-major complex matrix */
      for (int i = 0; i < 2; i++) {
        float re = 0, im = 0;
        for (int k = 0; k < 2; k++) re += rot[i * 2 + k] * vr[2 * (k * 2 + j)], im += rot[i * 2 + k] * vr[2 * (k * 2 + j) + 1];
        float vre = vr[2 * (i * 2 + j)], vim = vr[2 * (i * 2 + j) + 1];
        CHECK(fabsf(re - (wr[j] * vre - wi[j] * vim)) < 1e-5f && fabsf(im - (wr[j] * vim + wi[j] * vre)) < 1e-5f);
      }
    CHECK(vl[0] == 0 && vl[7] == 0); /* left vectors not asked: zeros */
    /* symmetric [[2, 1], [1, 2]]: values 1, 3; then a lower triangular solve and Cholesky of -I */
    double sym[4] = {2, 1, 1, 2}, vec[4], w[2], low[4] = {2, 0, 1, 4}, rhs[2] = {2, 9}, x[2], neg[4] = {-1, 0, 0, -1}, chol[4];
    disc_ral_lapack(DISC_LAPACK_SYEVD, DISC_LAPACK_F64, 'V' | 'L' << 8, 1, 2, 2, 0, 0, sym, NULL, vec, w, info, NULL, NULL);
    CHECK(fabs(w[0] - 1) < 1e-12 && fabs(w[1] - 3) < 1e-12 && fabs(fabs(vec[1]) - sqrt(0.5)) < 1e-12);
    disc_ral_lapack(DISC_LAPACK_TRSM, DISC_LAPACK_F64, 'L' | 'L' << 8 | 'N' << 16 | 'N' << 24, 1, 2, 1, 0, 0, low, rhs, x, NULL, NULL,
                    NULL, NULL);
    CHECK(fabs(x[0] - 1) < 1e-12 && fabs(x[1] - 2) < 1e-12);
    disc_ral_lapack(DISC_LAPACK_POTRF, DISC_LAPACK_F64, 'L', 1, 2, 2, 0, 0, neg, NULL, chol, info, NULL, NULL, NULL);
    CHECK(ral_context_status(ctx) == RAL_OK && info[0] == 1);
  }
  free(a), free(lu), free(piv);
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

/* Whether single-precision products run without a BLAS: on the runtime's own kernel, where the CPU
 * has one and DISC_GEMM does not ask for the BLAS (ral_runtime_create). */
static int sgemm_without_blas(void) {
  const char *gemm = getenv("DISC_GEMM");
  return ral_packed_sgemm_kernel() && !(gemm && gemm[0]);
}

/* Whether c (2 x [3 x 5], contiguous) holds the two products of [3 x 4] entries of a and [4 x 5]
 * entries of b at these element strides (entry, row, column). Small integers: exact sums. */
static int two_products_match(const float *a, int sa_e, int sa_m, int sa_k, const float *b, int sb_e, int sb_k, int sb_n,
                              const float *c) {
  int ok = 1;
  for (int e = 0; e < 2; e++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++) {
        float ref = 0;
        for (int k = 0; k < 4; k++) ref += a[e * sa_e + i * sa_m + k * sa_k] * b[e * sb_e + k * sb_k + j * sb_n];
        ok &= c[e * 15 + i * 5 + j] == ref;
      }
  return ok;
}

static void test_gemm(ral_runtime *rt, int have_blas) {
  int have_sgemm = have_blas || sgemm_without_blas();
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  /* 2 batches of [3x4] x [4x5]; B given transposed (stride 1 along k) */
  float a[2 * 3 * 4], bt[2 * 5 * 4], c[2 * 3 * 5];
  for (int i = 0; i < 24; i++) a[i] = (float)(i % 7) - 3;
  for (int i = 0; i < 40; i++) bt[i] = (float)(i % 5) * 0.5f;
  disc_ral_gemm_f32(1, 2, 3, 5, 4, a, 0, 12, 1, 4, 1, bt, 0, 20, 1, 1, 4, c, 0, 15, 5);
  if (have_sgemm) {
    CHECK(ral_context_status(ctx) == RAL_OK);
    CHECK(two_products_match(a, 12, 4, 1, bt, 20, 1, 4, c));
  } else {
    CHECK(ral_context_status(ctx) == RAL_ERR_UNAVAILABLE);
  }
  if (!have_blas) { /* double precision needs the BLAS */
    ral_context *fresh;
    CHECK(ral_context_create(rt, &fresh) == RAL_OK);
    ral_context_enter(fresh);
    double x = 1, y = 1, z = 0;
    disc_ral_gemm_f64(1, 1, 1, 1, 1, &x, 0, 1, 1, 1, 1, &y, 0, 1, 1, 1, 1, &z, 0, 1, 1);
    CHECK(ral_context_status(fresh) == RAL_ERR_UNAVAILABLE);
    ral_context_enter(ctx);
    ral_context_destroy(fresh);
  }
  if (have_sgemm) {
    CHECK(gemm_matches(ctx, 300, 70, 40, 1, 300, 70, 1)); /* row blocks over the pool; A transposed */
    CHECK(gemm_matches(ctx, 8, 300, 128, 128, 1, 1, 128)); /* few rows: column blocks; B transposed */
    /* on the runtime's kernel, op(B) packed once for row blocks of about 128 rows: B transposed,
     * k over two of the kernel's blocks, n not a multiple of its panels */
    CHECK(gemm_matches(ctx, 600, 70, 300, 300, 1, 1, 300));
    CHECK(gemm_matches(ctx, 257, 33, 40, 40, 1, 33, 1));
    /* few rows with B not transposed and larger than L2: the runtime's own kernel where the CPU
     * has AVX-512 (B is not the context's buffer) */
    CHECK(gemm_matches(ctx, 37, 1100, 700, 700, 1, 1100, 1));
    CHECK(gemm_matches(ctx, 2, 3000, 300, 1, 2, 3000, 1));
    CHECK(gemm_heads_match(ctx, 3, 40, 4, 16, 1, 0)); /* two batch levels, transposed views */
    CHECK(gemm_heads_match(ctx, 1, 5, 2, 3, 1, 0));   /* small: inline */
    CHECK(gemm_heads_match(ctx, 2, 40, 8, 16, 4, 0)); /* keys shared by groups of 4 heads */
    CHECK(gemm_heads_match(ctx, 1, 5, 6, 3, 3, 0));   /* small: inline */
    CHECK(gemm_heads_match(ctx, 2, 40, 8, 16, 2, 1)); /* the shared keys as A */
    { /* operands with no unit stride (every other element: the real parts of complex pairs): copied first */
      float ap[2 * 3 * 8], bp[2 * 4 * 10], cp[2 * 3 * 5];
      for (int i = 0; i < 48; i++) ap[i] = (float)(i % 9) - 4;
      for (int i = 0; i < 80; i++) bp[i] = (float)(i % 7) - 3;
      disc_ral_gemm_f32(1, 2, 3, 5, 4, ap, 0, 24, 1, 8, 2, bp, 0, 40, 1, 10, 2, cp, 0, 15, 5);
      CHECK(ral_context_status(ctx) == RAL_OK);
      CHECK(two_products_match(ap, 24, 8, 2, bp, 40, 10, 2, cp));
    }
    CHECK(gemm_epilogue_matches(ctx, 1, 300, 70, 40, 0));  /* row blocks, one per thread: after the product */
    CHECK(gemm_epilogue_matches(ctx, 16, 50, 64, 32, 0));  /* behind each of 16 batch entries */
    CHECK(gemm_epilogue_matches(ctx, 1, 8, 300, 128, 0));  /* column blocks: after the product */
    CHECK(gemm_epilogue_matches(ctx, 2, 3, 5, 4, 0));      /* small: inline */
    CHECK(gemm_epilogue_matches(ctx, 1, 4, 5, 0, 0));      /* k == 0: zeros, then the epilogue */
    CHECK(gemm_epilogue_matches(ctx, 300, 2, 64, 32, 1)); /* 300 entries of 2 rows sharing B: swapped */
    CHECK(gemm_epilogue_matches(ctx, 16, 50, 64, 32, 1)); /* fewer entries than rows: as they are */
    /* on the runtime's kernel: 17 row blocks reading op(B) packed once, the epilogue behind them
     * (the BLAS: one block per thread, the epilogue after) */
    CHECK(gemm_epilogue_matches(ctx, 1, 2100, 37, 20, 0));
    ral_kernel_stat st;
    ral_kernel_stats((const void *)add_one, &st);
    /* the products with enough whole-row tasks (not the swapped one) */
    CHECK(st.calls == 8 && st.fused_calls == 2 + sgemm_without_blas());
    disc_ral_gemm_f32_epilogue(1, 1, 4, 5, 3, NULL, 0, 0, 1, 3, 1, NULL, 0, 0, 1, 5, 1, NULL, 20, 20, 5, add_one, NULL, 7, 20);
    CHECK(ral_context_status(ctx) == RAL_ERR_INVALID_ARGUMENT); /* rows != batch * m */
    ral_context *fresh;
    CHECK(ral_context_create(rt, &fresh) == RAL_OK);
    ral_context_enter(fresh);
    disc_ral_gemm_f32(1, 2, 3, 5, 4, a, 0, 12, 1, 4, 1, bt, 0, 20, 0, 1, 4, c, 0, 15, 5);
    CHECK(ral_context_status(fresh) == RAL_ERR_INVALID_ARGUMENT); /* B's groups of no entries */
    ral_context_enter(ctx);
    ral_context_destroy(fresh);
  }
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

/* The RAL's convolution against a direct sum: [batch, in_c, 1, h, w] (*) [out_c, in_c, 1, kh, kw],
 * stride (sh, sw), low padding (ph, pw), input dilation (lh, lw), window dilation (rh, rw);
 * the output size from the high padding (qh, qw). Small integers: exact sums. */
static int conv_matches(ral_context *ctx, int64_t batch, int64_t in_c, int64_t out_c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                        int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t qh, int64_t qw, int64_t lh, int64_t lw, int64_t rh,
                        int64_t rw) {
  int64_t oh = ((h - 1) * lh + 1 + ph + qh - ((kh - 1) * rh + 1)) / sh + 1, ow = ((w - 1) * lw + 1 + pw + qw - ((kw - 1) * rw + 1)) / sw + 1;
  float *x = malloc(sizeof(float) * batch * in_c * h * w), *k = malloc(sizeof(float) * out_c * in_c * kh * kw);
  float *y = malloc(sizeof(float) * batch * out_c * oh * ow);
  for (int64_t i = 0; i < batch * in_c * h * w; i++) x[i] = (float)((i * 7) % 11) - 5;
  for (int64_t i = 0; i < out_c * in_c * kh * kw; i++) k[i] = (float)((i * 5) % 9) - 4;
  /* with an epilogue adding 1 to each row of the output ([batch, out_c, oh] rows of ow) */
  atomic_int *seen = calloc((size_t)(batch * out_c * oh), sizeof(atomic_int));
  epilogue_data e = {.c = y, .n = ow, .seen = seen};
  disc_ral_conv_f32_epilogue(batch, in_c, in_c, out_c, x, k, y, 1, h, w, 1, oh, ow, 1, kh, kw, 1, sh, sw, 0, ph, pw, 1, lh, lw, 1, rh, rw,
                             add_one, &e, batch * out_c * oh, batch * out_c * oh * ow);
  int ok = ral_context_status(ctx) == RAL_OK;
  for (int64_t i = 0; i < batch * out_c * oh; i++) ok &= atomic_load(&seen[i]) == 1;
  for (int64_t b = 0; b < batch && ok; b++)
    for (int64_t o = 0; o < out_c; o++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          float ref = 1;
          for (int64_t c = 0; c < in_c; c++)
            for (int64_t u = 0; u < kh; u++)
              for (int64_t v = 0; v < kw; v++) {
                int64_t r = i * sh + u * rh - ph, q = j * sw + v * rw - pw;
                if (r < 0 || q < 0 || r % lh || q % lw || r / lh >= h || q / lw >= w) continue;
                ref += x[((b * in_c + c) * h + r / lh) * w + q / lw] * k[((o * in_c + c) * kh + u) * kw + v];
              }
          ok &= y[((b * out_c + o) * oh + i) * ow + j] == ref;
        }
  free(x);
  free(k);
  free(y);
  free(seen);
  return ok;
}

/* Whether the convolution rejects (RAL_ERR_INVALID_ARGUMENT, nothing written) an input with x_c
 * features for a kernel of 1, the given stride and input dilation. */
static int conv_rejected(ral_runtime *rt, int64_t x_c, int64_t in_c, int64_t stride, int64_t lhs) {
  ral_context *ctx;
  if (ral_context_create(rt, &ctx) != RAL_OK) return 0;
  ral_context *prev = ral_context_enter(ctx);
  float x[2] = {1, 1}, k = 1, y = 7;
  disc_ral_conv_f32(1, x_c, in_c, 1, x, &k, &y, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, stride, 0, 0, 0, 1, 1, lhs, 1, 1, 1);
  int ok = ral_context_status(ctx) == RAL_ERR_INVALID_ARGUMENT && y == 7;
  ral_context_enter(prev);
  ral_context_destroy(ctx);
  return ok;
}

/* A: [7, 3]; B: 3 groups of [3, 4], given as [4, 3] (transposed); offsets {2, 2, 5}: group 0 takes
 * rows 0-1, group 1 none, group 2 rows 2-4, rows 5-6 are zeros */
static float grouped_a[7 * 3], grouped_bt[3 * 4 * 3], grouped_c[7 * 4];
static int64_t grouped_offs[3];

static void grouped_entry(void *args, void *results) {
  (void)args, (void)results;
  disc_ral_grouped_gemm_f32(7, 4, 3, 3, grouped_a, grouped_bt, 12, 1, 3, grouped_offs, grouped_c);
  reached_after_failure = 1;
}

static void test_grouped_gemm(ral_runtime *rt, int have_blas) {
  if (!have_blas && !sgemm_without_blas()) return;
  for (int i = 0; i < 21; i++) grouped_a[i] = (float)(i % 5) - 2;
  for (int i = 0; i < 36; i++) grouped_bt[i] = (float)(i % 7) * 0.25f;
  const int64_t offsets[][3] = {{2, 2, 5}, {3, 2, 5}, {2, 4, 8}, {-1, 2, 5}};
  const char *message[] = {"", "grouped GEMM: offset 1 is 2, after 3", "grouped GEMM: offset 2 is 8, after 4",
                           "grouped GEMM: offset 0 is -1, after 0"};
  for (int t = 0; t < 4; t++) {
    ral_context *ctx;
    CHECK(ral_context_create(rt, &ctx) == RAL_OK);
    ral_context *prev = ral_context_enter(ctx);
    memcpy(grouped_offs, offsets[t], sizeof grouped_offs);
    for (int i = 0; i < 28; i++) grouped_c[i] = -7.0f; /* untouched where the call fails */
    reached_after_failure = 0;
    CHECK(ral_context_call(ctx, grouped_entry, NULL, NULL) == (t == 0 ? RAL_OK : RAL_ERR_INVALID_ARGUMENT));
    CHECK(reached_after_failure == (t == 0));
    CHECK(strncmp(ral_context_message(ctx), message[t], strlen(message[t])) == 0);
    int ok = 1;
    for (int r = 0; r < 7; r++) {
      int g = r < 2 ? 0 : 2;
      for (int j = 0; j < 4; j++) {
        float ref = 0;
        for (int k = 0; k < 3 && r < 5; k++) ref += grouped_a[r * 3 + k] * grouped_bt[g * 12 + j * 3 + k];
        ok &= grouped_c[r * 4 + j] == (t == 0 ? ref : -7.0f);
      }
    }
    CHECK(ok);
    ral_context_enter(prev);
    ral_context_destroy(ctx);
  }
}

static void test_conv(ral_runtime *rt, int have_blas) {
  int have_sgemm = have_blas || sgemm_without_blas(); /* single precision only here */
  ral_context *ctx;
  CHECK(ral_context_create(rt, &ctx) == RAL_OK);
  ral_context *prev = ral_context_enter(ctx);
  if (have_sgemm) {
    ral_kernel_stat before;
    ral_kernel_stats((const void *)add_one, &before); /* the GEMM tests' epilogues count too */
    CHECK(conv_matches(ctx, 2, 3, 8, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));          /* small: one thread */
    CHECK(conv_matches(ctx, 3, 16, 24, 70, 90, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));      /* several patch blocks per image */
    CHECK(conv_matches(ctx, 1, 8, 100, 20, 20, 3, 3, 2, 1, 1, 0, 1, 2, 1, 1, 1, 2));      /* batch 1: the kernel's rows split */
    CHECK(conv_matches(ctx, 2, 4, 5, 30, 40, 3, 2, 1, 2, -1, 2, 3, -2, 2, 3, 2, 1));      /* input dilation, negative padding */
    CHECK(conv_matches(ctx, 2, 32, 40, 33, 31, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1));      /* 1x1: the input is read in place */
    CHECK(conv_matches(ctx, 2, 32, 40, 33, 31, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1));      /* 1x1 with stride 2: patches */
    CHECK(conv_matches(ctx, 2, 0, 3, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));          /* no input features: zeros */
    CHECK(conv_matches(ctx, 1, 64, 2, 1, 9000, 1, 1, 1, 2, 0, 0, 0, 0, 1, 1, 1, 1));      /* blocks of parts of rows */
    ral_kernel_stat st;
    ral_kernel_stats((const void *)disc_ral_conv_f32, &st);
    CHECK(st.calls == 7 && st.pool_calls >= 4); /* the one without input features returns before running */
    ral_kernel_stats((const void *)add_one, &st);
    CHECK(st.calls - before.calls == 8 && st.fused_calls - before.fused_calls == 6); /* after: no features, parts of rows */
    float x = 1, k = 1, y = 0;
    disc_ral_conv_f32_epilogue(1, 1, 1, 1, &x, &k, &y, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, add_one, NULL, 2, 2);
    CHECK(ral_context_status(ctx) == RAL_ERR_INVALID_ARGUMENT); /* rows != the output's */
    CHECK(conv_rejected(rt, 2, 1, 1, 1)); /* the input's features are not the kernel's */
    CHECK(conv_rejected(rt, 1, 1, 0, 1)); /* stride 0 */
    CHECK(conv_rejected(rt, 1, 1, 1, 0)); /* input dilation 0 */
    /* an empty last output dim (an input narrower than the window): the epilogue still runs over
     * the output's other rows */
    ral_context *empty;
    CHECK(ral_context_create(rt, &empty) == RAL_OK);
    ral_context_enter(empty);
    atomic_int seen[3] = {0};
    epilogue_data e = {.c = &y, .n = 0, .seen = seen};
    disc_ral_conv_f32_epilogue(1, 1, 1, 1, &x, &k, &y, 1, 3, 2, 1, 3, 0, 1, 1, 3, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, add_one, &e, 3, 0);
    CHECK(ral_context_status(empty) == RAL_OK && seen[0] == 1 && seen[2] == 1);
    ral_context_enter(ctx);
    ral_context_destroy(empty);
  } else {
    float x = 1, k = 1, y = 0;
    disc_ral_conv_f32(1, 1, 1, 1, &x, &k, &y, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1);
    CHECK(ral_context_status(ctx) == RAL_ERR_UNAVAILABLE);
  }
  ral_context_enter(prev);
  ral_context_destroy(ctx);
}

int main(int argc, char **argv) {
  const char *blas = argc > 1 ? argv[1] : NULL;
  ral_runtime *rt;
  CHECK(ral_runtime_create("/nonexistent/libblas.so", 2, &rt) == RAL_ERR_UNAVAILABLE);
  CHECK(rt == NULL && strstr(ral_runtime_create_error(), "cannot load BLAS") != NULL);
  const char *gemm = getenv("DISC_GEMM");
  char *kept = gemm ? strdup(gemm) : NULL;
  setenv("DISC_GEMM", "mkl", 1); /* a value the runtime does not know: refused, with its name */
  CHECK(ral_runtime_create(blas, 1, &rt) == RAL_ERR_INVALID_ARGUMENT);
  CHECK(rt == NULL && strstr(ral_runtime_create_error(), "DISC_GEMM is 'mkl'") != NULL);
  if (kept)
    setenv("DISC_GEMM", kept, 1);
  else
    unsetenv("DISC_GEMM");
  free(kept);
  CHECK(ral_runtime_create(blas, 3, &rt) == RAL_OK);
  CHECK(ral_runtime_num_threads(rt) == 3);
  test_allocator_reuse_and_take(rt);
  test_stats_off_until_enabled(rt); /* and on from here */
  test_cache_limits();
  test_allocator_fits_cached_blocks();
  test_generated_code_hooks(rt);
  test_failures_end_the_call(rt);
  test_parallel_for(rt);
  test_threads_share_runtime(rt);
  test_concurrent_loops_overlap(rt);
  test_failures_inside_loops(rt);
  test_fft(rt);
  test_gemm(rt, blas != NULL);
  test_lapack(rt, blas != NULL);
  test_conv(rt, blas != NULL);
  test_grouped_gemm(rt, blas != NULL);
  test_small_gemm_kernel();
  test_packed_gemm_kernel();
  ral_runtime_destroy(rt);
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}
