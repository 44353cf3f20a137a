/* The RAL: caching allocator, per-call contexts, thread pool and BLAS calls. See ral/ral.h. */
#define _GNU_SOURCE
#include "ral/ral.h"
#include "ral_internal.h"
#include "packed_gemm.h"
#include "small_gemm.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RAL_ALIGN 64
#define RAL_HEADER 64    /* keeps user pointers 64-byte aligned */
#define RAL_MIN_SHIFT 4  /* the smallest size class: 4 << 4 = 64 bytes */
#define RAL_NUM_BINS 160 /* up to 7 << 43 bytes */
#define RAL_SWEEP_NS 1000000000 /* idle blocks are looked for at most once a second */
#define RAL_DEFAULT_MAX_CACHED ((int64_t)1 << 30)
#define RAL_DEFAULT_IDLE_MS 10000

/* ------------------------------------------------------------------------------------------ */
/* size classes (host and device allocators)                                                  */

int size_class(size_t bytes, int min_shift, int bins) {
  if (bytes <= (size_t)4 << min_shift) return 0;
  int e = 63 - __builtin_clzll(bytes) - 2; /* bytes in [4 << e, 8 << e) */
  size_t m = (bytes >> e) + ((bytes & (((size_t)1 << e) - 1)) != 0);
  if (m == 8) m = 4, e++;
  int bin = (e - min_shift) * 4 + (int)(m - 4);
  return bin < bins ? bin : -1;
}

size_t class_bytes(int bin, int min_shift) { return (size_t)(4 + bin % 4) << (bin / 4 + min_shift); }

int fit_last_class(int bin, int bins) { return bin + 4 < bins ? bin + 4 : bins - 1; }

/* ------------------------------------------------------------------------------------------ */
/* caching allocator                                                                          */

typedef struct block_header {
  int64_t bin;       /* size class: capacity class_bytes(bin) */
  int64_t used;      /* bytes requested */
  int64_t cached_ns; /* when it was last given back */
  struct block_header *next_free;
} block_header;

typedef struct {
  pthread_mutex_t lock;
  block_header *free_list[RAL_NUM_BINS]; /* the most recently given back first */
  ral_memory_stats stats;
  int64_t max_cached; /* bytes: a block that would take bytes_cached past it is freed */
  int64_t idle_ns;    /* a block cached longer is freed */
  int64_t swept_ns;   /* the last look for idle blocks */
} allocator;

static void *allocator_get(allocator *a, size_t bytes) {
  int bin = size_class(bytes, RAL_MIN_SHIFT, RAL_NUM_BINS);
  if (bin < 0) return NULL;
  size_t size = class_bytes(bin, RAL_MIN_SHIFT);
  pthread_mutex_lock(&a->lock);
  int fit = bin, last = fit_last_class(bin, RAL_NUM_BINS);
  while (fit < last && !a->free_list[fit]) fit++;
  block_header *h = a->free_list[fit];
  if (h) {
    a->free_list[fit] = h->next_free;
    a->stats.bytes_cached -= (int64_t)class_bytes(fit, RAL_MIN_SHIFT);
    a->stats.cache_hits++;
  }
  a->stats.allocations++;
  a->stats.bytes_in_use += (int64_t)bytes;
  if (a->stats.bytes_in_use > a->stats.peak_bytes) a->stats.peak_bytes = a->stats.bytes_in_use;
  pthread_mutex_unlock(&a->lock);
  if (!h) {
    h = aligned_alloc(RAL_ALIGN, (size + RAL_HEADER + RAL_ALIGN - 1) / RAL_ALIGN * RAL_ALIGN); /* a multiple of the alignment */
    if (!h) {
      pthread_mutex_lock(&a->lock);
      a->stats.bytes_in_use -= (int64_t)bytes;
      pthread_mutex_unlock(&a->lock);
      return NULL;
    }
    h->bin = bin;
  }
  h->used = (int64_t)bytes;
  h->next_free = NULL;
  return (char *)h + RAL_HEADER;
}

/* Unlinks the cached blocks given back before `before_ns` (all: INT64_MAX) into a list, with the
 * lock held. */
static block_header *allocator_take_cached(allocator *a, int64_t before_ns) {
  block_header *out = NULL;
  for (int bin = 0; bin < RAL_NUM_BINS; bin++) {
    for (block_header **p = &a->free_list[bin]; *p;) {
      block_header *h = *p;
      if (h->cached_ns < before_ns) {
        *p = h->next_free;
        a->stats.bytes_cached -= (int64_t)class_bytes((int)h->bin, RAL_MIN_SHIFT);
        h->next_free = out;
        out = h;
      } else {
        p = &h->next_free;
      }
    }
  }
  return out;
}

static void free_blocks(block_header *h) {
  while (h) {
    block_header *next = h->next_free;
    free(h);
    h = next;
  }
}

/* Frees the blocks cached longer than the idle time: at most once a second, or (`now_anyway`: a
 * pool worker that waited a second for work) at once. */
static void allocator_sweep(allocator *a, int64_t now, int now_anyway) {
  block_header *idle = NULL;
  pthread_mutex_lock(&a->lock);
  if (now_anyway || now - a->swept_ns >= RAL_SWEEP_NS || a->idle_ns == 0) {
    a->swept_ns = now;
    idle = allocator_take_cached(a, now - a->idle_ns);
  }
  pthread_mutex_unlock(&a->lock);
  free_blocks(idle);
}

static void allocator_put(allocator *a, void *ptr) {
  if (!ptr) return;
  block_header *h = (block_header *)((char *)ptr - RAL_HEADER);
  int64_t size = (int64_t)class_bytes((int)h->bin, RAL_MIN_SHIFT), now = now_ns();
  pthread_mutex_lock(&a->lock);
  a->stats.bytes_in_use -= h->used;
  if (a->stats.bytes_cached + size <= a->max_cached) {
    h->cached_ns = now;
    h->next_free = a->free_list[h->bin];
    a->free_list[h->bin] = h;
    a->stats.bytes_cached += size;
    h = NULL;
  }
  pthread_mutex_unlock(&a->lock);
  free(h);
  allocator_sweep(a, now, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* thread pool                                                                                */

typedef struct parallel_job {
  ral_parallel_body body;
  void *data;
  ral_context *ctx;
  int64_t end, grain;
  atomic_int_fast64_t next; /* next unclaimed iteration */
  atomic_int active;         /* workers that joined the job and have not left it */
  atomic_int failed;         /* a chunk failed the call: no more chunks start */
  struct parallel_job *next_open;
} parallel_job;

/* Any number of jobs are open at once (one per call running a parallel loop): each caller runs
 * chunks of its own job, and the workers help the open jobs, the oldest first. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  parallel_job *open; /* the open jobs, oldest first (a job closes once its caller ran out of chunks) */
  atomic_int_fast64_t generation; /* bumped once per job opened, after it is in `open` */
  atomic_int stopping;
  int num_workers;
  pthread_t *workers;
  void (*idle)(void *arg); /* called by a worker that waited a second for work */
  void *idle_arg;
} thread_pool;

/* Spin this many rounds on an atomic before sleeping: waking a sleeping thread costs tens of
 * microseconds, which a model with dozens of parallel loops per call pays every loop. */
#define RAL_SPIN_ROUNDS 20000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static _Thread_local ral_context *tls_context;
/* Set while the thread runs chunks of a parallel loop: a failure there (context_exit) leaves the
 * chunk through it; parallel loops nested in a chunk run inline. */
static _Thread_local jmp_buf *tls_chunk_exit;

static void run_chunks(parallel_job *job) {
  ral_context *saved = tls_context;
  jmp_buf *saved_exit = tls_chunk_exit;
  jmp_buf exit;
  tls_context = job->ctx;
  if (setjmp(exit) == 0) {
    tls_chunk_exit = &exit;
    for (;;) {
      int64_t lo = atomic_fetch_add(&job->next, job->grain);
      if (lo >= job->end) break;
      int64_t hi = lo + job->grain < job->end ? lo + job->grain : job->end;
      job->body(job->data, lo, hi);
    }
  } else { /* the chunk failed the call: nothing more of the loop runs */
    atomic_store(&job->failed, 1);
    atomic_store(&job->next, job->end);
  }
  tls_chunk_exit = saved_exit;
  tls_context = saved;
}

/* The oldest open job with chunks left, joined (NULL: none); with the pool's lock held. */
static parallel_job *join_open_job(thread_pool *pool) {
  parallel_job *job = pool->open;
  while (job && atomic_load(&job->next) >= job->end) job = job->next_open;
  if (job) atomic_fetch_add(&job->active, 1);
  return job;
}

static void *worker_main(void *arg) {
  thread_pool *pool = arg;
  int64_t seen = 0;
  for (;;) {
    int64_t gen = atomic_load(&pool->generation);
    for (int i = 0; i < RAL_SPIN_ROUNDS && gen == seen && !atomic_load(&pool->stopping); i++) {
      cpu_relax();
      gen = atomic_load(&pool->generation);
    }
    if (gen == seen) {
      int waited = 0;
      pthread_mutex_lock(&pool->lock);
      while (!atomic_load(&pool->stopping) && atomic_load(&pool->generation) == seen && !waited) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        waited = pthread_cond_timedwait(&pool->wake, &pool->lock, &until) == ETIMEDOUT;
      }
      pthread_mutex_unlock(&pool->lock);
      if (waited) { /* idle: a chance to give cached memory back; then wait again */
        if (pool->idle) pool->idle(pool->idle_arg);
        continue;
      }
    }
    if (atomic_load(&pool->stopping)) break;
    seen = atomic_load(&pool->generation);
    /* join jobs only while they are open: a worker that wakes late (descheduled on a busy
     * machine) finds them closed and goes back to waiting, and no caller waits for it */
    for (;;) {
      pthread_mutex_lock(&pool->lock);
      parallel_job *job = join_open_job(pool);
      pthread_mutex_unlock(&pool->lock);
      if (!job) break;
      run_chunks(job);
      if (atomic_fetch_sub(&job->active, 1) == 1) { /* the job may be gone after this */
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->done);
        pthread_mutex_unlock(&pool->lock);
      }
    }
  }
  return NULL;
}

static int pool_start(thread_pool *pool, int num_workers) {
  pthread_mutex_init(&pool->lock, NULL);
  pthread_cond_init(&pool->wake, NULL);
  pthread_cond_init(&pool->done, NULL);
  pool->workers = calloc((size_t)(num_workers > 0 ? num_workers : 1), sizeof(pthread_t));
  if (!pool->workers) return 0;
  for (int i = 0; i < num_workers; i++) {
    if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0) break;
    pool->num_workers++;
  }
  return 1;
}

static void pool_stop(thread_pool *pool) {
  pthread_mutex_lock(&pool->lock);
  atomic_store(&pool->stopping, 1);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->num_workers; i++) pthread_join(pool->workers[i], NULL);
  free(pool->workers);
  pthread_cond_destroy(&pool->wake);
  pthread_cond_destroy(&pool->done);
  pthread_mutex_destroy(&pool->lock);
}

/* ------------------------------------------------------------------------------------------ */
/* runtime and contexts                                                                       */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);

struct ral_runtime {
  allocator alloc;
  thread_pool pool;
  void *blas;
  sgemm_fn sgemm;
  dgemm_fn dgemm;
  ral_sgemm_fn packed_sgemm;      /* NULL: the BLAS does single precision */
  const ral_shared_sgemm *shared_sgemm; /* the same kernel with op(B) packed once for all row blocks */
  ral_small_sgemm_fn small_sgemm; /* NULL: the BLAS (or packed_sgemm) does every product */
  int64_t l2_bytes;                /* one core's L2 cache */
  _Atomic(ral_gpu *) gpu;          /* NULL: no GPU enabled */
  atomic_int refs;                 /* the owner's, and one per device buffer exported (ral_gpu_dlpack) */
};

int ral_abi_version(void) { return RAL_ABI_VERSION; }

static void runtime_idle(void *arg) { allocator_sweep(&((ral_runtime *)arg)->alloc, now_ns(), 1); }

static _Thread_local char create_error[512];

const char *ral_runtime_create_error(void) { return create_error; }

void runtime_error(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(create_error, sizeof create_error, fmt, args);
  va_end(args);
}

ral_gpu *runtime_gpu(const ral_runtime *rt) { return atomic_load_explicit(&rt->gpu, memory_order_acquire); }

ral_gpu *runtime_install_gpu(ral_runtime *rt, ral_gpu *gpu) {
  ral_gpu *expected = NULL;
  return atomic_compare_exchange_strong(&rt->gpu, &expected, gpu) ? gpu : expected;
}

void *runtime_blas_symbol(const ral_runtime *rt, const char *name) {
  if (!rt->blas) return NULL;
  char prefixed[64];
  snprintf(prefixed, sizeof prefixed, "scipy_%s", name);
  void *sym = dlsym(rt->blas, prefixed);
  return sym ? sym : dlsym(rt->blas, name);
}

ral_status ral_runtime_create(const char *blas_path, int num_threads, ral_runtime **out) {
  *out = NULL;
  create_error[0] = 0;
  /* DISC_GEMM=blas: the BLAS does single precision too (to compare the two); anything else is a mistake */
  const char *gemm = getenv("DISC_GEMM");
  if (gemm && gemm[0] && strcmp(gemm, "blas") != 0) {
    runtime_error("DISC_GEMM is '%s': set it to 'blas' (single-precision GEMMs on the BLAS) or leave it unset", gemm);
    return RAL_ERR_INVALID_ARGUMENT;
  }
  ral_runtime *rt = calloc(1, sizeof(*rt));
  if (!rt) {
    runtime_error("out of memory creating the runtime");
    return RAL_ERR_OUT_OF_MEMORY;
  }
  pthread_mutex_init(&rt->alloc.lock, NULL);
  rt->alloc.max_cached = RAL_DEFAULT_MAX_CACHED;
  rt->alloc.idle_ns = (int64_t)RAL_DEFAULT_IDLE_MS * 1000000;
  atomic_init(&rt->refs, 1);
  if (blas_path && blas_path[0]) {
    rt->blas = dlopen(blas_path, RTLD_NOW | RTLD_LOCAL);
    if (!rt->blas) {
      runtime_error("cannot load BLAS '%s': %s", blas_path, dlerror());
      pthread_mutex_destroy(&rt->alloc.lock);
      free(rt);
      return RAL_ERR_UNAVAILABLE;
    }
    rt->sgemm = (sgemm_fn)runtime_blas_symbol(rt, "cblas_sgemm");
    rt->dgemm = (dgemm_fn)runtime_blas_symbol(rt, "cblas_dgemm");
    /* GEMMs are split over the RAL's own pool: a second pool of spinning BLAS threads would
     * fight it for the cores */
    void (*set_threads)(int) = (void (*)(int))runtime_blas_symbol(rt, "openblas_set_num_threads");
    if (set_threads) set_threads(1);
    /* MKL's single dynamic library picks its threading layer at the first call: the sequential one */
    int (*mkl_threading)(int) = (int (*)(int))dlsym(rt->blas, "MKL_Set_Threading_Layer");
    if (mkl_threading) mkl_threading(1 /* MKL_THREADING_SEQUENTIAL */);
  }
  rt->small_sgemm = ral_small_sgemm_kernel();
  rt->packed_sgemm = gemm && gemm[0] ? NULL : ral_packed_sgemm_kernel();
  rt->shared_sgemm = rt->packed_sgemm ? ral_packed_sgemm_shared() : NULL;
  long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE /* glibc's; elsewhere the 1 MiB below */
  l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  rt->l2_bytes = l2 > 0 ? l2 : 1 << 20;
  if (num_threads <= 0) { /* the cores this process may run on (a container's or taskset's share) */
    cpu_set_t allowed;
    num_threads = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  }
  if (num_threads < 1) num_threads = 1;
  rt->pool.idle = runtime_idle;
  rt->pool.idle_arg = rt;
  /* the calling thread works too, so the pool holds one thread fewer */
  if (!pool_start(&rt->pool, num_threads - 1)) {
    runtime_error("cannot start the thread pool");
    ral_runtime_destroy(rt);
    return RAL_ERR_INTERNAL;
  }
  *out = rt;
  return RAL_OK;
}

void runtime_retain(ral_runtime *rt) { atomic_fetch_add(&rt->refs, 1); }

void ral_runtime_destroy(ral_runtime *rt) {
  if (!rt || atomic_fetch_sub(&rt->refs, 1) > 1) return;
  if (rt->pool.workers) pool_stop(&rt->pool);
  if (runtime_gpu(rt)) gpu_destroy(runtime_gpu(rt));
  free_blocks(allocator_take_cached(&rt->alloc, INT64_MAX));
  pthread_mutex_destroy(&rt->alloc.lock);
  if (rt->blas) dlclose(rt->blas);
  free(rt);
}

int ral_runtime_num_threads(const ral_runtime *rt) { return rt->pool.num_workers + 1; }

void ral_runtime_memory_stats(ral_runtime *rt, ral_memory_stats *out) {
  pthread_mutex_lock(&rt->alloc.lock);
  *out = rt->alloc.stats;
  pthread_mutex_unlock(&rt->alloc.lock);
}

void ral_runtime_set_cache_limits(ral_runtime *rt, int64_t max_cached_bytes, int64_t idle_ms) {
  pthread_mutex_lock(&rt->alloc.lock);
  rt->alloc.max_cached = max_cached_bytes < 0 ? 0 : max_cached_bytes;
  rt->alloc.idle_ns = (idle_ms < 0 ? 0 : idle_ms) * 1000000;
  block_header *over = rt->alloc.stats.bytes_cached > rt->alloc.max_cached ? allocator_take_cached(&rt->alloc, INT64_MAX) : NULL;
  pthread_mutex_unlock(&rt->alloc.lock);
  free_blocks(over);
  allocator_sweep(&rt->alloc, now_ns(), 0);
}

void ral_runtime_trim(ral_runtime *rt) {
  pthread_mutex_lock(&rt->alloc.lock);
  block_header *cached = allocator_take_cached(&rt->alloc, INT64_MAX);
  pthread_mutex_unlock(&rt->alloc.lock);
  free_blocks(cached);
  if (runtime_gpu(rt)) gpu_trim(runtime_gpu(rt));
}

void ral_runtime_reset_peak(ral_runtime *rt) {
  pthread_mutex_lock(&rt->alloc.lock);
  rt->alloc.stats.peak_bytes = rt->alloc.stats.bytes_in_use;
  pthread_mutex_unlock(&rt->alloc.lock);
}

ral_status ral_context_create(ral_runtime *rt, ral_context **out) {
  *out = calloc(1, sizeof(ral_context));
  if (!*out) return RAL_ERR_OUT_OF_MEMORY;
  (*out)->rt = rt;
  pthread_mutex_init(&(*out)->lock, NULL);
  return RAL_OK;
}

void ral_context_destroy(ral_context *ctx) {
  if (!ctx) return;
  for (size_t i = 0; i < ctx->buffers.count; i++) allocator_put(&ctx->rt->alloc, ctx->buffers.items[i]);
  free(ctx->buffers.items);
  gpu_release_context(ctx);
  free(ctx->device_buffers.items);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

ral_context *ral_context_enter(ral_context *ctx) {
  ral_context *prev = tls_context;
  tls_context = ctx;
  return prev;
}

ral_context *current_context(void) { return tls_context; }

ral_status ral_context_status(const ral_context *ctx) {
  pthread_mutex_lock((pthread_mutex_t *)&ctx->lock);
  ral_status status = ctx->status;
  pthread_mutex_unlock((pthread_mutex_t *)&ctx->lock);
  return status;
}

const char *ral_context_message(const ral_context *ctx) { return ctx->message; }

void ral_context_fail(ral_context *ctx, ral_status status, const char *message) {
  if (!ctx) return;
  pthread_mutex_lock(&ctx->lock);
  if (ctx->status == RAL_OK) {
    ctx->status = status;
    snprintf(ctx->message, sizeof ctx->message, "%s", message);
  }
  pthread_mutex_unlock(&ctx->lock);
}

ral_status ral_context_call(ral_context *ctx, ral_entry entry, void *args, void *results) {
  ctx->in_call = 1;
  if (setjmp(ctx->exit) == 0) entry(args, results);
  ctx->in_call = 0;
  return ctx->status;
}

/* After a failure, the rest of the entry is skipped: inside a parallel loop the chunk is left
 * (on any thread) and the loop ends the call once its chunks are done; in the entry's own code
 * on the thread that called it, the call ends at once. */
void context_exit(ral_context *ctx) {
  if (!ctx || tls_context != ctx) return;
  if (tls_chunk_exit) longjmp(*tls_chunk_exit, 1);
  if (ctx->in_call) longjmp(ctx->exit, 1);
}

static void context_raise(ral_context *ctx, ral_status status, const char *message) {
  ral_context_fail(ctx, status, message);
  context_exit(ctx);
}

int ptr_list_add(ral_ptr_list *list, void *ptr) {
  if (list->count == list->cap) {
    size_t cap = list->cap ? 2 * list->cap : 16;
    void **grown = realloc(list->items, cap * sizeof(void *));
    if (!grown) return 0;
    list->items = grown;
    list->cap = cap;
  }
  list->items[list->count++] = ptr;
  return 1;
}

int ptr_list_remove(ral_ptr_list *list, const void *ptr) {
  for (size_t i = list->count; i-- > 0;) { /* newest first: generated code frees recent temporaries */
    if (list->items[i] == ptr) {
      list->items[i] = list->items[--list->count];
      return 1;
    }
  }
  return 0;
}

/* Whether `ptr` points into a host buffer the context allocated (an intermediate of the call, not
 * an argument or a parameter). */
static int context_owns(ral_context *ctx, const void *ptr) {
  int owns = 0;
  pthread_mutex_lock(&ctx->lock);
  for (size_t i = 0; i < ctx->buffers.count && !owns; i++) {
    const char *base = ctx->buffers.items[i];
    const block_header *h = (const block_header *)(base - RAL_HEADER);
    owns = (const char *)ptr >= base && (const char *)ptr < base + h->used;
  }
  pthread_mutex_unlock(&ctx->lock);
  return owns;
}

int ral_context_take(ral_context *ctx, void *ptr) {
  pthread_mutex_lock(&ctx->lock);
  int taken = ptr_list_remove(&ctx->buffers, ptr) || ptr_list_remove(&ctx->device_buffers, ptr);
  pthread_mutex_unlock(&ctx->lock);
  return taken;
}

void context_free(ral_context *ctx, void *ptr) {
  pthread_mutex_lock(&ctx->lock);
  int owned = ptr_list_remove(&ctx->buffers, ptr);
  pthread_mutex_unlock(&ctx->lock);
  if (owned) allocator_put(&ctx->rt->alloc, ptr);
}

void ral_buffer_free(ral_runtime *rt, void *ptr) { allocator_put(&rt->alloc, ptr); }

void *ral_alloc(ral_context *ctx, size_t bytes) {
  void *ptr = allocator_get(&ctx->rt->alloc, bytes ? bytes : 1);
  if (!ptr) {
    char msg[128];
    snprintf(msg, sizeof msg, "out of memory allocating %zu bytes", bytes);
    context_raise(ctx, RAL_ERR_OUT_OF_MEMORY, msg);
    return NULL;
  }
  pthread_mutex_lock(&ctx->lock);
  int recorded = ptr_list_add(&ctx->buffers, ptr);
  pthread_mutex_unlock(&ctx->lock);
  if (!recorded) {
    allocator_put(&ctx->rt->alloc, ptr);
    context_raise(ctx, RAL_ERR_OUT_OF_MEMORY, "out of memory recording a buffer");
    return NULL;
  }
  return ptr;
}

void ral_parallel_for(ral_context *ctx, ral_parallel_body body, void *data, int64_t begin,
                      int64_t end, int64_t grain) {
  if (end <= begin) return;
  if (grain < 1) grain = 1;
  thread_pool *pool = &ctx->rt->pool;
  if (tls_chunk_exit || pool->num_workers == 0 || end - begin <= grain) {
    body(data, begin, end);
    return;
  }
  int64_t per_thread = (end - begin + pool->num_workers) / (pool->num_workers + 1);
  if (grain < per_thread / 4) grain = per_thread / 4 > 0 ? per_thread / 4 : 1;
  parallel_job job = {.body = body, .data = data, .ctx = ctx, .end = end, .grain = grain};
  atomic_init(&job.next, begin);
  atomic_init(&job.active, 0);
  atomic_init(&job.failed, 0);
  pthread_mutex_lock(&pool->lock);
  parallel_job **tail = &pool->open;
  while (*tail) tail = &(*tail)->next_open;
  *tail = &job;
  atomic_fetch_add(&pool->generation, 1);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  run_chunks(&job);
  pthread_mutex_lock(&pool->lock);
  for (tail = &pool->open; *tail != &job;) tail = &(*tail)->next_open;
  *tail = job.next_open; /* closed: only the workers that joined are waited for */
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < RAL_SPIN_ROUNDS && atomic_load(&job.active) > 0; i++) cpu_relax();
  pthread_mutex_lock(&pool->lock);
  while (atomic_load(&job.active) > 0) pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
  if (atomic_load(&job.failed)) context_exit(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* hooks for generated code                                                                   */

void *_mlir_memref_to_llvm_alloc(size_t bytes) {
  if (!tls_context) return NULL;
  return ral_alloc(tls_context, bytes);
}

void *_mlir_memref_to_llvm_aligned_alloc(size_t alignment, size_t bytes) {
  (void)alignment; /* every RAL buffer is 64-byte aligned */
  return _mlir_memref_to_llvm_alloc(bytes);
}

/* float and double -> bfloat16 for generated code: the conversions LLVM calls on x86 processors
 * without AVX-512 BF16 (compiler-rt's names; libgcc before GCC 13 has none). Round to nearest
 * even, a NaN stays a quiet NaN; the result's bits are in the low half of a float register, where
 * the x86-64 ABI returns a bfloat16. */
static float bf16_result(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  float r;
  memcpy(&r, &u, sizeof r);
  return r;
}

float __truncsfbf2(float x) { return bf16_result(x); }

float __truncdfbf2(double x) {
  float f = (float)x; /* rounded once more below: made round-to-odd first, so the second rounding is exact */
  if (x == x && (double)f != x) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (fabs((double)f) > fabs(x)) u -= 1; /* rounded away from zero: the value toward zero */
    u |= 1u;
    memcpy(&f, &u, sizeof f);
  }
  return bf16_result(f);
}

void disc_ral_check_alloc(int64_t status, int64_t value, const char *what) {
  if (status == 0 || !tls_context) return;
  char msg[512];
  if (status == 1)
    snprintf(msg, sizeof msg, "%s: a dim is negative (%lld)", what, (long long)value);
  else
    snprintf(msg, sizeof msg, "%s: its size in bytes overflows 63 bits", what);
  context_raise(tls_context, RAL_ERR_SHAPE, msg);
}

void disc_ral_check_shape(int64_t failed, const char *what, int64_t a, int64_t b) {
  if (!failed || !tls_context) return;
  char msg[512];
  size_t n = 0;
  for (const char *p = what; *p && n < sizeof msg - 24; p++) {
    if (p[0] == '{' && (p[1] == '0' || p[1] == '1') && p[2] == '}') {
      n += (size_t)snprintf(msg + n, sizeof msg - n, "%lld", (long long)(p[1] == '0' ? a : b));
      p += 2;
    } else {
      msg[n++] = *p;
    }
  }
  msg[n] = 0;
  context_raise(tls_context, RAL_ERR_SHAPE, msg);
}

/* Buffers live until the end of the call (or are taken as results); a free from generated
 * code returns a block early only when the current context owns it. */
void _mlir_memref_to_llvm_free(void *ptr) {
  if (tls_context && ptr) context_free(tls_context, ptr);
}

/* ------------------------------------------------------------------------------------------ */
/* per-kernel statistics: a process-wide open-addressing table keyed by the kernel's address    */

#define RAL_STATS_SLOTS 4096 /* a power of two */

typedef struct {
  _Atomic(const void *) key;
  atomic_llong calls, pool_calls, fused_calls, ns;
} kernel_stat;

static kernel_stat kernel_stats[RAL_STATS_SLOTS];

static kernel_stat *stat_slot(const void *key, int insert) {
  uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < RAL_STATS_SLOTS; i++) {
    kernel_stat *s = &kernel_stats[(h + i) & (RAL_STATS_SLOTS - 1)];
    const void *k = atomic_load_explicit(&s->key, memory_order_acquire);
    if (k == key) return s;
    if (k == NULL) {
      if (!insert) return NULL;
      const void *expected = NULL;
      if (atomic_compare_exchange_strong(&s->key, &expected, key) || expected == key) return s;
    }
  }
  return NULL; /* full: the call is not counted */
}

int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static atomic_int stats_on; /* off until asked for: no writes to the shared table */

void ral_kernel_stats_enable(int on) { atomic_store(&stats_on, on != 0); }

void stat_record(const void *key, int pooled, int64_t start_ns) {
  if (!atomic_load_explicit(&stats_on, memory_order_relaxed)) return;
  kernel_stat *s = stat_slot(key, 1);
  if (!s) return;
  atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->pool_calls, pooled, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->ns, now_ns() - start_ns, memory_order_relaxed);
}

/* a kernel that ran as a GEMM epilogue, `ns` in total over the row blocks */
static void stat_fused(const void *key, int64_t ns) {
  if (!atomic_load_explicit(&stats_on, memory_order_relaxed)) return;
  kernel_stat *s = stat_slot(key, 1);
  if (!s) return;
  atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->fused_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->ns, ns, memory_order_relaxed);
}

void ral_kernel_stats(const void *kernel, ral_kernel_stat *out) {
  kernel_stat *s = stat_slot(kernel, 0);
  out->calls = s ? atomic_load(&s->calls) : 0;
  out->pool_calls = s ? atomic_load(&s->pool_calls) : 0;
  out->fused_calls = s ? atomic_load(&s->fused_calls) : 0;
  out->ns = s ? atomic_load(&s->ns) : 0;
}

/* below this many scalar iterations, waking the pool costs more than it saves */
#define RAL_PARALLEL_MIN_WORK 16384

void disc_ral_parallel_for(ral_parallel_body body, void *data, int64_t n, int64_t work) {
  int64_t start = now_ns();
  int pooled = tls_context && work >= RAL_PARALLEL_MIN_WORK && n >= 2;
  if (pooled)
    ral_parallel_for(tls_context, body, data, 0, n, 1);
  else
    body(data, 0, n); /* the small-size version: no thread pool */
  stat_record((const void *)body, pooled, start);
}

void memrefCopy(int64_t element_size, ral_unranked_memref *src, ral_unranked_memref *dst) {
  /* descriptor: allocated, aligned, offset, sizes[rank], strides[rank] */
  int64_t rank = src->rank;
  char **sp = src->descriptor, **dp = dst->descriptor;
  char *s = sp[1], *d = dp[1];
  const int64_t *sm = (const int64_t *)(sp + 2), *dm = (const int64_t *)(dp + 2);
  const int64_t *sizes = sm + 1, *s_strides = sm + 1 + rank, *d_strides = dm + 1 + rank;
  s += sm[0] * element_size;
  d += dm[0] * element_size;
  int64_t total = 1;
  for (int64_t i = 0; i < rank; i++) total *= sizes[i];
  if (total == 0) return;
  int64_t index[16] = {0};
  if (rank > 16) {
    context_raise(tls_context, RAL_ERR_INVALID_ARGUMENT, "memrefCopy: rank above 16");
    return;
  }
  for (int64_t n = 0; n < total; n++) {
    int64_t so = 0, doff = 0;
    for (int64_t i = 0; i < rank; i++) {
      so += index[i] * s_strides[i];
      doff += index[i] * d_strides[i];
    }
    memcpy(d + doff * element_size, s + so * element_size, (size_t)element_size);
    for (int64_t i = rank - 1; i >= 0; i--) {
      if (++index[i] < sizes[i]) break;
      index[i] = 0;
    }
  }
}

/* BLAS wants a unit stride in one of the two dims of each operand: pick the layout flag. */
int blas_layout(int64_t s_rows, int64_t s_cols, int64_t rows, int64_t cols, int *trans, int64_t *ld) {
  if (s_cols == 1 || cols == 1) {
    *trans = NO_TRANS;
    *ld = s_rows > cols ? s_rows : (cols > 0 ? cols : 1);
    return 1;
  }
  if (s_rows == 1 || rows == 1) {
    *trans = TRANS;
    *ld = s_cols > rows ? s_cols : (rows > 0 ? rows : 1);
    return 1;
  }
  return 0;
}

/* An operand whose rows and columns both stride past 1 (a view of every other element: the real
 * parts of complex pairs) copied into a row-major buffer of its distinct entries (`outers` of
 * `entries` each), its strides made those of the copy. Returns the buffer (NULL: out of memory,
 * raised). */
static void *gemm_packed_operand(ral_context *ctx, size_t elem, const void **base, int64_t outers, int64_t entries,
                                 int64_t *s_outer, int64_t *s_entry, int64_t rows, int64_t cols, int64_t *s_rows,
                                 int64_t *s_cols) {
  char *copy = ral_alloc(ctx, (size_t)(outers * entries * rows * cols) * elem);
  if (!copy) return NULL;
  const char *src = *base;
  char *dst = copy;
  for (int64_t o = 0; o < outers; o++)
    for (int64_t e = 0; e < entries; e++)
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++, dst += elem)
          memcpy(dst, src + (o * *s_outer + e * *s_entry + r * *s_rows + c * *s_cols) * (int64_t)elem, elem);
  *base = copy;
  *s_outer = entries * rows * cols;
  *s_entry = rows * cols;
  *s_rows = cols;
  *s_cols = 1;
  return copy;
}

/* One GEMM split into blocks of rows (or, for few rows, of columns) of every batch entry, run
 * on the pool; with an epilogue, each row block of C is handed to it as soon as it is written
 * (while it is in cache). */
typedef struct {
  ral_runtime *rt;
  int is_double;
  int64_t inner, m, n, k, lda, ldb, sa_b, sa_i, a_group, sb_b, sb_i, b_group, sc_b, sc_i, ldc, rows_per_task, row_tasks, cols_per_task, col_tasks;
  int ta, tb;
  int small; /* by the runtime's kernel for few rows, not the BLAS */
  float *packed; /* NULL, or op(B) packed once for every row block (`ral_shared_sgemm`) */
  const void *a, *b;
  void *c;
  ral_parallel_body epilogue; /* NULL: none, or run after the whole product */
  void *epilogue_data;
  atomic_llong epilogue_ns;
} gemm_job;

/* Whether the runtime's packed kernel takes a single-precision product of m x n: where the CPU
 * has one, except a matrix-vector product where there is a BLAS: its GEMV streams B at 1 x 1024 x
 * 1024 twice as fast as the kernel's tile, whose two sums per row are latency bound, and a
 * product of one column fills one of the tile's 16 ([1000, 2048] x [2048, 1] on two threads:
 * 772 us on the kernel, 87-245 on MKL's GEMV; from 2 columns the kernel is ahead of MKL). */
static int packed_kernel_takes(const ral_runtime *rt, int64_t m, int64_t n) {
  return rt->packed_sgemm && ((m > 1 && n > 1) || !rt->sgemm);
}

/* One block of a single-precision product, C = op(A) op(B) with the BLAS's row-major conventions:
 * by the runtime's packed kernel where it takes it, else by the BLAS. */
static void sgemm_block(const ral_runtime *rt, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float *c, int64_t ldc) {
  if (packed_kernel_takes(rt, m, n))
    rt->packed_sgemm(m, n, k, a, ta == NO_TRANS ? lda : 1, ta == NO_TRANS ? 1 : lda, b, tb == NO_TRANS ? ldb : 1,
                     tb == NO_TRANS ? 1 : ldb, c, ldc);
  else
    rt->sgemm(ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, 1, a, (int)lda, b, (int)ldb, 0, c, (int)ldc);
}

static int runtime_has_gemm(const ral_runtime *rt, int is_double) {
  return is_double ? rt->dgemm != NULL : rt->sgemm != NULL || rt->packed_sgemm != NULL;
}

#define RAL_GEMM_ROWS_MIN 32 /* rows per task: below this, BLAS kernels lose efficiency */
#define RAL_GEMM_COLS_MIN 64 /* columns per task, when splitting columns */
#define RAL_GEMM_COLS_ALIGN 16 /* column blocks start at multiples of this (a vector of floats) */
/* Products of 2 to this many rows whose B is not transposed, is an input of the call (a weight:
 * an argument or a parameter, not an intermediate the call wrote) and is larger than one core's
 * L2 go to the runtime's own kernel. The BLAS packs B first, which costs about as much as the
 * product when few rows use it and B comes from memory (at 32 x 768 x 3072 on two threads: 1.0
 * ms against MKL's 1.5). Where B is in cache MKL's packed kernel is faster (an im2col patch
 * matrix of 64 x 576 x 3136: 0.95 ms against 1.23), and one row is a GEMV MKL streams faster
 * (0.43 ms against 0.57 at 1 x 768 x 3072). A transposed B (PyTorch's linear layers) goes there
 * for 2 to half as many rows, in cache or not: packing it costs more (the RAL's own packed kernel,
 * one thread of a Zen 4: 8 x 3072 x 768 465 us against 1208, 8 x 1024 x 256 51 against 101, 32 x
 * 1024 x 256 201 against 204; 64 rows 461 against 321). */
#define RAL_SMALL_GEMM_ROWS 64
#define RAL_EPILOGUE_TASKS_PER_THREAD 4
/* A single-precision product of at least twice this many rows, on the runtime's kernel and the
 * pool, packs op(B) once (the pool's threads share the panels) into a buffer of at most
 * RAL_SHARED_PACK_BYTES, and its row blocks of about this many rows (about the kernel's block of
 * A in L2) all read it: blocks of whole rows each packing all of B were two per thread at most,
 * too few for the pool to balance on a busy machine or for an epilogue to run behind them. */
#define RAL_SHARED_ROWS 128
#define RAL_SHARED_PACK_BYTES ((int64_t)16 << 20)

static void gemm_tasks(void *data, int64_t lo, int64_t hi) {
  gemm_job *g = data;
  int64_t per_batch = g->row_tasks * g->col_tasks;
  /* op(A)'s rows advance by lda when A is not transposed, by 1 when it is; k the other way */
  int64_t a_row = g->ta == NO_TRANS ? g->lda : 1, a_k = g->ta == NO_TRANS ? 1 : g->lda;
  for (int64_t t = lo; t < hi; t++) {
    int64_t batch = t / per_batch, block = t % per_batch;
    int64_t row0 = (block / g->col_tasks) * g->rows_per_task, col0 = (block % g->col_tasks) * g->cols_per_task;
    int64_t rows = g->m - row0 < g->rows_per_task ? g->m - row0 : g->rows_per_task;
    int64_t cols = g->n - col0 < g->cols_per_task ? g->n - col0 : g->cols_per_task;
    /* columns of op(B) advance by 1 when B is not transposed, by ldb when it is */
    int64_t outer = batch / g->inner, in = batch % g->inner;
    int64_t a_off = outer * g->sa_b + in / g->a_group * g->sa_i + row0 * a_row;
    int64_t b_off = outer * g->sb_b + in / g->b_group * g->sb_i + col0 * (g->tb == NO_TRANS ? 1 : g->ldb);
    int64_t c_off = outer * g->sc_b + in * g->sc_i + row0 * g->ldc + col0;
    if (g->packed)
      g->rt->shared_sgemm->multiply(rows, cols, g->k, (const float *)g->a + a_off, a_row, a_k, g->packed, (float *)g->c + c_off,
                                    g->ldc);
    else if (g->small)
      g->rt->small_sgemm(rows, cols, g->k, (const float *)g->a + a_off, a_row, a_k, (const float *)g->b + b_off,
                         g->tb == NO_TRANS ? g->ldb : 1, g->tb == NO_TRANS ? 1 : g->ldb, (float *)g->c + c_off, g->ldc);
    else if (g->is_double)
      g->rt->dgemm(ROW_MAJOR, g->ta, g->tb, (int)rows, (int)cols, (int)g->k, 1, (const double *)g->a + a_off, (int)g->lda,
                   (const double *)g->b + b_off, (int)g->ldb, 0, (double *)g->c + c_off, (int)g->ldc);
    else
      sgemm_block(g->rt, g->ta, g->tb, rows, cols, g->k, (const float *)g->a + a_off, g->lda, (const float *)g->b + b_off,
                  g->ldb, (float *)g->c + c_off, g->ldc);
    if (g->epilogue) { /* whole rows only: column blocks leave the epilogue to after the product */
      int64_t start = now_ns();
      g->epilogue(g->epilogue_data, batch * g->m + row0, batch * g->m + row0 + rows);
      atomic_fetch_add_explicit(&g->epilogue_ns, now_ns() - start, memory_order_relaxed);
    }
  }
}

/* The pool's share of packing op(B) once: its panels [lo, hi). */
static void pack_tasks(void *data, int64_t lo, int64_t hi) {
  gemm_job *g = data;
  g->rt->shared_sgemm->pack(g->n, g->k, g->b, g->tb == NO_TRANS ? g->ldb : 1, g->tb == NO_TRANS ? 1 : g->ldb, g->packed, lo, hi);
}

/* One block per `min_len` started in `len`, at most `most`. */
static int64_t gemm_blocks(int64_t len, int64_t min_len, int64_t most) {
  int64_t blocks = (len + min_len - 1) / min_len;
  return blocks < most ? blocks : most;
}

/* Blocks for `threads` workers: whole batch entries when there are enough, else blocks of the
 * longer of the two dims of C (each block packs the whole other operand: splitting rows has
 * every thread pack all of B, splitting columns all of A), then of the other. */
static void gemm_split(gemm_job *g, int64_t batch, int threads) {
  int64_t row_blocks = 1, col_blocks = 1;
  if (batch < threads && g->n > g->m) {
    col_blocks = gemm_blocks(g->n, RAL_GEMM_COLS_MIN, threads);
    row_blocks = gemm_blocks(g->m, RAL_GEMM_ROWS_MIN, threads / col_blocks);
  } else if (batch < threads) {
    row_blocks = gemm_blocks(g->m, RAL_GEMM_ROWS_MIN, threads);
    col_blocks = gemm_blocks(g->n, RAL_GEMM_COLS_MIN, threads / row_blocks);
  }
  g->rows_per_task = (g->m + row_blocks - 1) / row_blocks;
  g->row_tasks = (g->m + g->rows_per_task - 1) / g->rows_per_task;
  g->cols_per_task = ((g->n + col_blocks - 1) / col_blocks + RAL_GEMM_COLS_ALIGN - 1) / RAL_GEMM_COLS_ALIGN * RAL_GEMM_COLS_ALIGN;
  g->col_tasks = (g->n + g->cols_per_task - 1) / g->cols_per_task;
}

/* The GEMM entries: check the layout, split, run; `epilogue` (or NULL) runs over the rows of a
 * contiguous C [0, rows) with `epilogue_data`, behind the row blocks when they are whole rows,
 * pooled and at least RAL_EPILOGUE_TASKS_PER_THREAD per thread, else after the product as an
 * ordinary parallel loop of `work` scalar iterations. */
static void gemm_run(const void *key, const char *name, gemm_job *g, int64_t batch, int64_t sa_m, int64_t sa_k,
                     int64_t sb_k, int64_t sb_n, int64_t rows, int64_t work) {
  ral_context *ctx = tls_context;
  char message[160];
  if (!ctx || !runtime_has_gemm(ctx->rt, g->is_double)) {
    snprintf(message, sizeof message, "%s: no BLAS loaded in the runtime", name);
    context_raise(ctx, RAL_ERR_UNAVAILABLE, message);
    return;
  }
  if (g->epilogue && (rows != batch * g->m || g->ldc != g->n || (g->inner > 1 && g->sc_i != g->m * g->n) ||
                      g->sc_b != g->inner * g->m * g->n)) {
    snprintf(message, sizeof message, "%s: epilogue over %lld rows of a product with %lld contiguous ones", name, (long long)rows,
             (long long)(batch * g->m));
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  if (g->a_group < 1 || g->b_group < 1) {
    snprintf(message, sizeof message, "%s: operands shared by groups of %lld and %lld entries", name, (long long)g->a_group,
             (long long)g->b_group);
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  ral_parallel_body epilogue = g->epilogue;
  if (g->inner == batch && g->sb_i == 0 && g->a_group == 1 && batch > g->m && sa_k == 1 && g->sa_i >= g->k && g->sc_i >= g->n) {
    /* one batch level sharing B (a weight), A's rows contiguous: entries and rows are
     * interchangeable, and the more numerous become the rows (a seq-first projection, [seq,
     * batch, k] x [k, n], is seq GEMMs of batch rows each; swapped, batch GEMMs of seq rows). The
     * epilogue then runs after. */
    int64_t entries = batch, entry_stride = g->sa_i, c_entry_stride = g->sc_i;
    batch = g->m;
    g->inner = g->m;
    g->m = entries;
    g->sa_i = sa_m;
    sa_m = entry_stride;
    g->sc_i = g->ldc;
    g->ldc = c_entry_stride;
    g->epilogue = NULL;
  }
  int empty = g->m == 0 || g->n == 0 || batch == 0;
  size_t elem = g->is_double ? sizeof(double) : sizeof(float);
  void *copy_a = NULL, *copy_b = NULL;
  if (!empty && !blas_layout(sa_m, sa_k, g->m, g->k, &g->ta, &g->lda)) {
    if (!(copy_a = gemm_packed_operand(ctx, elem, &g->a, batch / g->inner, (g->inner + g->a_group - 1) / g->a_group, &g->sa_b,
                                       &g->sa_i, g->m, g->k, &sa_m, &sa_k)))
      return;
    blas_layout(sa_m, sa_k, g->m, g->k, &g->ta, &g->lda);
  }
  if (!empty && !blas_layout(sb_k, sb_n, g->k, g->n, &g->tb, &g->ldb)) {
    if (!(copy_b = gemm_packed_operand(ctx, elem, &g->b, batch / g->inner, (g->inner + g->b_group - 1) / g->b_group, &g->sb_b,
                                       &g->sb_i, g->k, g->n, &sb_k, &sb_n)))
      return;
    blas_layout(sb_k, sb_n, g->k, g->n, &g->tb, &g->ldb);
  }
  if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->lda > INT32_MAX || g->ldb > INT32_MAX ||
      g->ldc > INT32_MAX) {
    snprintf(message, sizeof message, "%s: dims exceed the 32-bit BLAS", name);
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  /* B not transposed: larger than L2 (in cache, packing it paid); transposed (PyTorch's weights), wherever it is,
   * for up to 32 rows (packing it paid from 64) and k of at least 128 (each dot product is summed across its
   * vector once: 64 paid too little for that) */
  g->small = !g->is_double && ctx->rt->small_sgemm && g->m >= 2 && !context_owns(ctx, g->b) &&
             (g->tb == NO_TRANS ? g->m <= RAL_SMALL_GEMM_ROWS && g->k * g->ldb * (int64_t)sizeof(float) > ctx->rt->l2_bytes
                                : g->ta == NO_TRANS && g->m <= RAL_SMALL_GEMM_ROWS / 2 && g->k >= 128);
  int64_t start = now_ns();
  if (empty || g->k == 0) {
    for (int64_t e = 0; !empty && e < batch; e++) /* zeros, row by row (C may be a strided view) */
      for (int64_t r = 0; r < g->m; r++)
        memset((char *)g->c + ((e / g->inner) * g->sc_b + (e % g->inner) * g->sc_i + r * g->ldc) * elem, 0, (size_t)g->n * elem);
    g->epilogue = NULL;
  } else {
    int threads = ral_runtime_num_threads(ctx->rt);
    gemm_split(g, batch, threads);
    int large = batch * g->m * g->n * g->k >= (1 << 18); /* enough work for the pool */
    const ral_shared_sgemm *shared = ctx->rt->shared_sgemm;
    int64_t shared_bytes = shared ? shared->floats(g->n, g->k) * (int64_t)sizeof(float) : 0;
    if (shared && !g->is_double && !g->small && packed_kernel_takes(ctx->rt, g->m, g->n) && batch == 1 && threads > 1 &&
        g->m >= 2 * RAL_SHARED_ROWS && large &&
        shared_bytes <= RAL_SHARED_PACK_BYTES && (g->packed = ral_alloc(ctx, (size_t)shared_bytes))) {
      g->row_tasks = (g->m + RAL_SHARED_ROWS - 1) / RAL_SHARED_ROWS;
      g->rows_per_task = (g->m + g->row_tasks - 1) / g->row_tasks;
      g->cols_per_task = g->n;
      g->col_tasks = 1;
      ral_parallel_for(ctx, pack_tasks, g, 0, (g->n + shared->nr - 1) / shared->nr, 1);
    }
    int64_t tasks = batch * g->row_tasks * g->col_tasks;
    int pooled = large && tasks > 1;
    /* behind the blocks only with whole rows and enough tasks for the pool to balance them (a
     * thread that runs late would otherwise hold back its block's epilogue too); else after the
     * product, on the pool or not by its own work */
    if (g->col_tasks > 1 || !pooled || tasks < RAL_EPILOGUE_TASKS_PER_THREAD * threads) g->epilogue = NULL;
    if (pooled)
      ral_parallel_for(ctx, gemm_tasks, g, 0, tasks, 1);
    else
      gemm_tasks(g, 0, tasks);
    if (g->packed) context_free(ctx, g->packed);
    stat_record(key, pooled, start);
  }
  if (copy_a) context_free(ctx, copy_a);
  if (copy_b) context_free(ctx, copy_b);
  if (!epilogue) return;
  if (g->epilogue) /* ran behind the row blocks */
    stat_fused(epilogue, atomic_load(&g->epilogue_ns));
  else
    disc_ral_parallel_for(epilogue, g->epilogue_data, rows, work);
}

#define DEFINE_GEMM(NAME, T, IS_DOUBLE)                                                              \
  void NAME##_epilogue(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const T *a,    \
                       int64_t sa_b, int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k,      \
                       const T *b, int64_t sb_b, int64_t sb_i, int64_t b_group, int64_t sb_k,        \
                       int64_t sb_n, T *c, int64_t sc_b, int64_t sc_i, int64_t ldc,                  \
                       ral_parallel_body epilogue, void *epilogue_data, int64_t rows, int64_t work) { \
    gemm_job g = {.is_double = IS_DOUBLE, .inner = inner > 0 ? inner : 1, .m = m, .n = n, .k = k,    \
                  .sa_b = sa_b, .sa_i = sa_i, .a_group = a_group, .sb_b = sb_b, .sb_i = sb_i,        \
                  .b_group = b_group, .sc_b = sc_b, .sc_i = sc_i, .ldc = ldc > 0 ? ldc : 1,          \
                  .a = a, .b = b, .c = c, .epilogue = epilogue, .epilogue_data = epilogue_data};     \
    g.rt = tls_context ? tls_context->rt : NULL;                                                     \
    atomic_init(&g.epilogue_ns, 0);                                                                  \
    gemm_run((const void *)NAME, #NAME, &g, batch * inner, sa_m, sa_k, sb_k, sb_n, rows, work);      \
  }                                                                                                  \
  void NAME(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const T *a, int64_t sa_b, \
            int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const T *b, int64_t sb_b,     \
            int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, T *c, int64_t sc_b,           \
            int64_t sc_i, int64_t ldc) {                                                             \
    NAME##_epilogue(batch, inner, m, n, k, a, sa_b, sa_i, a_group, sa_m, sa_k, b, sb_b, sb_i,        \
                    b_group, sb_k, sb_n, c, sc_b, sc_i, ldc, NULL, NULL, 0, 0);                      \
  }

DEFINE_GEMM(disc_ral_gemm_f32, float, 0)
DEFINE_GEMM(disc_ral_gemm_f64, double, 1)

int grouped_offsets_invalid(const int64_t *offs, int64_t groups, int64_t rows) {
  int64_t start = 0;
  for (int64_t g = 0; g < groups; start = offs[g++]) {
    if (offs[g] >= start && offs[g] <= rows) continue;
    if (tls_context) {
      char msg[256];
      snprintf(msg, sizeof msg, "grouped GEMM: offset %lld is %lld, after %lld; the offsets must not decrease and must be at most "
               "the input's %lld rows", (long long)g, (long long)offs[g], (long long)start, (long long)rows);
      context_raise(tls_context, RAL_ERR_INVALID_ARGUMENT, msg);
    }
    return 1;
  }
  return 0;
}

#define DEFINE_GROUPED_GEMM(NAME, T, GEMM)                                                          \
  void NAME(int64_t rows, int64_t n, int64_t k, int64_t groups, const T *a, const T *b, int64_t sb_g, \
            int64_t sb_k, int64_t sb_n, const int64_t *offs, T *c) {                                \
    if (grouped_offsets_invalid(offs, groups, rows)) return;                                        \
    int64_t start = 0;                                                                              \
    for (int64_t g = 0; g < groups; start = offs[g++])                                              \
      if (offs[g] > start)                                                                          \
        GEMM(1, 1, offs[g] - start, n, k, a + start * k, 0, 0, 1, k, 1, b + g * sb_g, 0, 0, 1, sb_k, sb_n, \
             c + start * n, 0, 0, n);                                                               \
    if (rows > start) memset(c + start * n, 0, (size_t)((rows - start) * n) * sizeof(T));           \
  }

DEFINE_GROUPED_GEMM(disc_ral_grouped_gemm_f32, float, disc_ral_gemm_f32)
DEFINE_GROUPED_GEMM(disc_ral_grouped_gemm_f64, double, disc_ral_gemm_f64)

/* ------------------------------------------------------------------------------------------ */
/* channels-first convolutions: GEMMs over blocks of patches that stay in cache                 */

/* One spatial dim: sizes of the input and output and window, window stride, low padding (may be
 * negative), input (lhs) and window (rhs) dilation. */
typedef struct {
  int64_t in, out, window, stride, pad, lhs_dil, rhs_dil;
} conv_dim;

typedef struct {
  ral_runtime *rt;
  int is_double;
  int64_t batch, in_c, out_c, k, positions;
  conv_dim d[3]; /* outermost first; unused leading dims have size 1 */
  const void *x, *w;
  void *y;
  int direct; /* a 1x1 window with unit strides and dilations and no padding: no patches */
  int64_t cols_per_block, col_blocks, rows_per_block, row_blocks, tasks;
  char *scratch; /* one patch block per slot (none when direct) */
  size_t slot_bytes;
  atomic_int_fast64_t next; /* next unclaimed task */
  ral_parallel_body epilogue; /* NULL: none, or run after the whole convolution */
  void *epilogue_data;
  atomic_llong epilogue_ns;
} conv_job;

/* Output positions [lo, hi) of a dim whose input index o * stride + off falls in [0, in) (unit
 * input dilation). */
static void conv_valid(const conv_dim *d, int64_t off, int64_t *lo, int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + d->stride - 1) / d->stride;
  int64_t b = d->in - 1 - off < 0 ? 0 : (d->in - 1 - off) / d->stride + 1;
  *lo = a < d->out ? a : d->out;
  *hi = b < *lo ? *lo : (b < d->out ? b : d->out);
}

/* The input index of output position o at window position z, or -1 in the padding (or between
 * dilated input elements). */
static int64_t conv_index(const conv_dim *d, int64_t o, int64_t z) {
  int64_t i = o * d->stride + z * d->rhs_dil - d->pad;
  if (i < 0 || i % d->lhs_dil) return -1;
  i /= d->lhs_dil;
  return i < d->in ? i : -1;
}

/* patches[r, p - p0] for rows r = (input feature, window position) and output positions p in
 * [p0, p1) of image b: the input element each window position reads, zero in the padding. */
#define DEFINE_PATCHES(NAME, T)                                                                   \
  static void NAME(const conv_job *g, int64_t b, int64_t p0, int64_t p1, T *patches) {           \
    const conv_dim *d = g->d;                                                                     \
    int64_t plane = d[0].in * d[1].in * d[2].in, n = p1 - p0;                                     \
    int64_t windows = d[0].window * d[1].window * d[2].window;                                    \
    for (int64_t r = 0; r < g->k; r++) {                                                          \
      int64_t c = r / windows, z = r % windows;                                                   \
      int64_t z2 = z % d[2].window, z1 = z / d[2].window % d[1].window, z0 = z / d[2].window / d[1].window; \
      const T *x = (const T *)g->x + (b * g->in_c + c) * plane;                                   \
      T *dst = patches + r * n;                                                                   \
      int64_t lo2 = 0, hi2 = 0, off2 = z2 * d[2].rhs_dil - d[2].pad;                              \
      if (d[2].lhs_dil == 1) conv_valid(&d[2], off2, &lo2, &hi2);                                 \
      for (int64_t p = p0; p < p1;) {                                                             \
        int64_t o2 = p % d[2].out, o1 = p / d[2].out % d[1].out, o0 = p / d[2].out / d[1].out;    \
        int64_t run = d[2].out - o2 < p1 - p ? d[2].out - o2 : p1 - p, end = o2 + run;            \
        int64_t i0 = conv_index(&d[0], o0, z0), i1 = conv_index(&d[1], o1, z1);                   \
        if (i0 < 0 || i1 < 0) {                                                                   \
          memset(dst, 0, (size_t)run * sizeof(T));                                                \
        } else {                                                                                  \
          const T *row = x + (i0 * d[1].in + i1) * d[2].in;                                       \
          if (d[2].lhs_dil != 1) {                                                                \
            for (int64_t o = o2; o < end; o++) {                                                  \
              int64_t i = conv_index(&d[2], o, z2);                                               \
              dst[o - o2] = i < 0 ? 0 : row[i];                                                   \
            }                                                                                     \
          } else {                                                                                \
            int64_t lo = lo2 < o2 ? o2 : (lo2 < end ? lo2 : end), hi = hi2 < lo ? lo : (hi2 < end ? hi2 : end); \
            for (int64_t o = o2; o < lo; o++) dst[o - o2] = 0;                                    \
            if (d[2].stride == 1 && hi > lo)                                                      \
              memcpy(dst + lo - o2, row + lo + off2, (size_t)(hi - lo) * sizeof(T));              \
            else if (d[2].stride != 1)                                                            \
              for (int64_t o = lo; o < hi; o++) dst[o - o2] = row[o * d[2].stride + off2];        \
            for (int64_t o = hi; o < end; o++) dst[o - o2] = 0;                                   \
          }                                                                                       \
        }                                                                                         \
        dst += run;                                                                               \
        p += run;                                                                                 \
      }                                                                                           \
    }                                                                                             \
  }
DEFINE_PATCHES(conv_patches_f32, float)
DEFINE_PATCHES(conv_patches_f64, double)

/* Slots [lo, hi): each claims tasks (image, column block, row block) in order and runs them
 * with its own patch block, built once for the row blocks of one column block that follow. */
static void conv_slots(void *data, int64_t lo, int64_t hi) {
  conv_job *g = data;
  (void)hi;
  void *patches = g->scratch ? g->scratch + (size_t)lo * g->slot_bytes : NULL;
  int64_t built = -1; /* image x column block whose patches the block holds */
  for (int64_t t; (t = atomic_fetch_add(&g->next, 1)) < g->tasks;) {
    int64_t piece = t / g->row_blocks, rb = t % g->row_blocks;
    int64_t b = piece / g->col_blocks, p0 = (piece % g->col_blocks) * g->cols_per_block;
    int64_t p1 = p0 + g->cols_per_block < g->positions ? p0 + g->cols_per_block : g->positions;
    int64_t row0 = rb * g->rows_per_block, rows = g->out_c - row0 < g->rows_per_block ? g->out_c - row0 : g->rows_per_block;
    const void *b_ptr = patches;
    int64_t ldb = p1 - p0;
    if (g->direct) { /* the input is the patch matrix: [in_c, positions] per image */
      b_ptr = (const char *)g->x + (size_t)(b * g->k * g->positions + p0) * (g->is_double ? sizeof(double) : sizeof(float));
      ldb = g->positions;
    } else if (piece != built) {
      if (g->is_double)
        conv_patches_f64(g, b, p0, p1, patches);
      else
        conv_patches_f32(g, b, p0, p1, patches);
      built = piece;
    }
    int64_t c_off = (b * g->out_c + row0) * g->positions + p0;
    if (g->is_double)
      g->rt->dgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, (int)rows, (int)(p1 - p0), (int)g->k, 1, (const double *)g->w + row0 * g->k,
                   (int)g->k, b_ptr, (int)ldb, 0, (double *)g->y + c_off, (int)g->positions);
    else
      sgemm_block(g->rt, NO_TRANS, NO_TRANS, rows, p1 - p0, g->k, (const float *)g->w + row0 * g->k, g->k, b_ptr, ldb,
                  (float *)g->y + c_off, g->positions);
    if (g->epilogue) { /* the block's output rows (whole ones), feature by feature, while in cache */
      int64_t start = now_ns(), row = g->d[2].out, per_feature = g->positions / row;
      for (int64_t o = row0; o < row0 + rows; o++) {
        int64_t first = (b * g->out_c + o) * per_feature + p0 / row;
        g->epilogue(g->epilogue_data, first, first + (p1 - p0) / row);
      }
      atomic_fetch_add_explicit(&g->epilogue_ns, now_ns() - start, memory_order_relaxed);
    }
  }
}

/* columns per patch block at least (fewer make the BLAS pack the kernel once per few columns) */
#define RAL_CONV_COLS_MIN 256

/* The convolution entries: check, split, run; `epilogue` (or NULL) runs over the output's rows
 * (all dims but the last) [0, rows) with `epilogue_data`: behind each block of patch columns
 * when the blocks hold whole rows, else after the convolution as an ordinary parallel loop of
 * `work` scalar iterations. */
static void conv_run(const void *key, const char *name, conv_job *g, int64_t x_c, int64_t rows, int64_t work) {
  ral_context *ctx = tls_context;
  char message[192];
  size_t elem = g->is_double ? sizeof(double) : sizeof(float);
  int valid = g->batch >= 0 && g->in_c >= 0 && g->out_c >= 0;
  for (int i = 0; i < 3; i++)
    valid &= g->d[i].in >= 0 && g->d[i].out >= 0 && g->d[i].window >= 0 && g->d[i].stride >= 1 && g->d[i].lhs_dil >= 1 &&
             g->d[i].rhs_dil >= 1;
  if (!valid || x_c != g->in_c) {
    snprintf(message, sizeof message, valid ? "%s: the input has %lld features, the kernel %lld" : "%s: invalid sizes, strides or dilations",
             name, (long long)x_c, (long long)g->in_c);
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  g->positions = g->d[0].out * g->d[1].out * g->d[2].out;
  g->k = g->in_c * g->d[0].window * g->d[1].window * g->d[2].window;
  int64_t output_rows = g->batch * g->out_c * g->d[0].out * g->d[1].out; /* the rows of the output's last dim */
  if (g->epilogue && rows != output_rows) {
    snprintf(message, sizeof message, "%s: epilogue over %lld rows of an output with %lld", name, (long long)rows,
             (long long)output_rows);
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  ral_parallel_body epilogue = g->epilogue;
  if (g->batch == 0 || g->out_c == 0 || g->positions == 0 || g->k == 0) {
    if (g->k == 0) memset(g->y, 0, (size_t)(g->batch * g->out_c * g->positions) * elem);
    if (epilogue) disc_ral_parallel_for(epilogue, g->epilogue_data, rows, work);
    return;
  }
  if (!ctx || !runtime_has_gemm(ctx->rt, g->is_double)) {
    snprintf(message, sizeof message, "%s: no BLAS loaded in the runtime", name);
    context_raise(ctx, RAL_ERR_UNAVAILABLE, message);
    return;
  }
  g->rt = ctx->rt;
  if (g->k > INT32_MAX || g->positions > INT32_MAX || g->out_c > INT32_MAX) {
    snprintf(message, sizeof message, "%s: dims exceed the 32-bit BLAS", name);
    context_raise(ctx, RAL_ERR_INVALID_ARGUMENT, message);
    return;
  }
  int64_t start = now_ns();
  int threads = ral_runtime_num_threads(ctx->rt);
  /* columns: half an L2 of patches, whole output rows where a block holds more than one */
  int64_t row = g->d[2].out, cols = (int64_t)((size_t)ctx->rt->l2_bytes / 2 / ((size_t)g->k * elem));
  if (cols < RAL_CONV_COLS_MIN) cols = RAL_CONV_COLS_MIN;
  if (cols > g->positions) cols = g->positions;
  g->col_blocks = (g->positions + cols - 1) / cols;
  cols = (g->positions + g->col_blocks - 1) / g->col_blocks;
  if (cols > row) cols = (cols + row - 1) / row * row;
  g->cols_per_block = cols;
  g->col_blocks = (g->positions + cols - 1) / cols;
  if (cols % row) g->epilogue = NULL; /* blocks of parts of rows: the epilogue runs after */
  /* fewer pieces than threads: output features split too (each block builds its own patches) */
  int64_t pieces = g->batch * g->col_blocks;
  g->row_blocks = pieces < threads ? gemm_blocks(g->out_c, RAL_GEMM_ROWS_MIN, (threads + pieces - 1) / pieces) : 1;
  g->rows_per_block = (g->out_c + g->row_blocks - 1) / g->row_blocks;
  g->row_blocks = (g->out_c + g->rows_per_block - 1) / g->rows_per_block;
  g->tasks = pieces * g->row_blocks;
  int pooled = g->tasks > 1 && (double)g->batch * (double)g->out_c * (double)g->positions * (double)g->k >= (1 << 18);
  int slots = pooled ? threads : 1;
  g->direct = 1;
  for (int i = 0; i < 3; i++)
    g->direct &= g->d[i].window == 1 && g->d[i].stride == 1 && g->d[i].pad == 0 && g->d[i].lhs_dil == 1 && g->d[i].in == g->d[i].out;
  g->slot_bytes = g->direct ? 0 : ((size_t)g->k * (size_t)cols * elem + RAL_ALIGN - 1) / RAL_ALIGN * RAL_ALIGN;
  g->scratch = g->direct ? NULL : ral_alloc(ctx, g->slot_bytes * (size_t)slots);
  if (!g->direct && !g->scratch) return;
  atomic_init(&g->next, 0);
  if (pooled)
    ral_parallel_for(ctx, conv_slots, g, 0, slots, 1);
  else
    conv_slots(g, 0, 1);
  if (g->scratch) context_free(ctx, g->scratch);
  stat_record(key, pooled, start);
  if (g->epilogue) /* ran behind the blocks */
    stat_fused(epilogue, atomic_load(&g->epilogue_ns));
  else if (epilogue)
    disc_ral_parallel_for(epilogue, g->epilogue_data, rows, work);
}

#define DEFINE_CONV(NAME, T, IS_DOUBLE)                                                                  \
  void NAME##_epilogue(DISC_RAL_CONV_ARGS(T), ral_parallel_body epilogue, void *epilogue_data, int64_t rows, \
                       int64_t work) {                                                                   \
    conv_job g = {.is_double = IS_DOUBLE, .batch = batch, .in_c = in_c, .out_c = out_c, .x = x, .w = w, .y = y, \
                  .d = {{in0, out0, win0, stride0, pad0, lhs0, rhs0},                                    \
                        {in1, out1, win1, stride1, pad1, lhs1, rhs1},                                    \
                        {in2, out2, win2, stride2, pad2, lhs2, rhs2}},                                   \
                  .epilogue = epilogue, .epilogue_data = epilogue_data};                                 \
    atomic_init(&g.epilogue_ns, 0);                                                                      \
    conv_run((const void *)NAME, #NAME, &g, x_c, rows, work);                                            \
  }                                                                                                      \
  void NAME(DISC_RAL_CONV_ARGS(T)) {                                                                     \
    NAME##_epilogue(batch, x_c, in_c, out_c, x, w, y, in0, in1, in2, out0, out1, out2, win0, win1, win2, stride0, \
                    stride1, stride2, pad0, pad1, pad2, lhs0, lhs1, lhs2, rhs0, rhs1, rhs2, NULL, NULL, 0, 0); \
  }

DEFINE_CONV(disc_ral_conv_f32, float, 0)
DEFINE_CONV(disc_ral_conv_f64, double, 1)
