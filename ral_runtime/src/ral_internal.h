/* What ral.c and gpu.c share: the context's layout and a few helpers (hidden: not in the
 * library's ABI). */
#ifndef RAL_INTERNAL_H
#define RAL_INTERNAL_H

#include "ral/ral.h"

#include <pthread.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#define RAL_INTERNAL __attribute__((visibility("hidden")))

/* A growable array of pointers: the buffers a context owns. */
typedef struct {
  void **items;
  size_t count, cap;
} ral_ptr_list;
RAL_INTERNAL int ptr_list_add(ral_ptr_list *list, void *ptr); /* 0: out of memory */
RAL_INTERNAL int ptr_list_remove(ral_ptr_list *list, const void *ptr); /* 1: it was there */

struct ral_context {
  ral_runtime *rt;
  pthread_mutex_t lock;        /* status, message and `buffers`: pool threads allocate and fail too */
  ral_ptr_list buffers;        /* host buffers from the runtime's allocator */
  ral_ptr_list device_buffers; /* device buffers from the runtime's GPU cache */
  void *stream;                /* the CUstream of the context's GPU work (NULL: the legacy default stream) */
  ral_status status;
  char message[512];
  jmp_buf exit; /* back to ral_context_call, valid while `in_call` */
  int in_call;
};

/* The calling thread's current context (ral_context_enter). */
RAL_INTERNAL ral_context *current_context(void);
/* A host buffer of the context given back before the end of the call (nothing if the context
 * does not own it). */
RAL_INTERNAL void context_free(ral_context *ctx, void *ptr);
/* Ends the current call after a failure where ral_context_call says it does (else returns). */
RAL_INTERNAL void context_exit(ral_context *ctx);
/* Offsets of a grouped GEMM (disc_ral_grouped_gemm_f32) that do not rise from 0 to at most `rows`:
 * fails the current call, naming the offset, and ends it; returns 1 where it returns at all. Such
 * offsets would have rows read and written out of bounds or twice, so nothing is computed. */
RAL_INTERNAL int grouped_offsets_invalid(const int64_t *offs, int64_t groups, int64_t rows);
/* Sets the message ral_runtime_create_error returns on this thread. */
RAL_INTERNAL void runtime_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An entry of the BLAS the runtime loaded, by its Fortran or C name (scipy-openblas's prefixed
 * one first); NULL without a BLAS or where it lacks the entry. */
RAL_INTERNAL void *runtime_blas_symbol(const ral_runtime *rt, const char *name);

/* One more reference to the runtime: ral_runtime_destroy frees it at the last one. */
RAL_INTERNAL void runtime_retain(ral_runtime *rt);

/* The runtime's GPU device (gpu.c): NULL until ral_runtime_enable_gpu. */
typedef struct ral_gpu ral_gpu;
RAL_INTERNAL ral_gpu *runtime_gpu(const ral_runtime *rt);
/* Installs `gpu` unless the runtime has one already; returns the one it has now. */
RAL_INTERNAL ral_gpu *runtime_install_gpu(ral_runtime *rt, ral_gpu *gpu);
RAL_INTERNAL void gpu_destroy(ral_gpu *gpu);
/* Gives the context's device buffers back to the GPU cache. */
RAL_INTERNAL void gpu_release_context(ral_context *ctx);

/* Size classes m * 2^e for m in 4..7 (a block wastes under a quarter of its request), the
 * smallest 4 << min_shift bytes: the class of `bytes` (-1 past `bins` classes) and its capacity. */
RAL_INTERNAL int size_class(size_t bytes, int min_shift, int bins);
RAL_INTERNAL size_t class_bytes(int bin, int min_shift);
/* A request of class `bin` takes a cached block of its class or of the next ones, up to this one
 * (twice its capacity): a new shape's buffers reuse the memory other shapes' buffers gave back
 * instead of faulting in fresh pages (an encoder's trace of 149 new shapes: 0.4 s of 3.5). */
RAL_INTERNAL int fit_last_class(int bin, int bins);
/* Frees the GPU's cached blocks (gpu.c). */
RAL_INTERNAL void gpu_trim(ral_gpu *gpu);

/* Per-kernel statistics (ral_kernel_stats): a call of `key` that began at `start_ns`. */
RAL_INTERNAL int64_t now_ns(void);
RAL_INTERNAL void stat_record(const void *key, int pooled, int64_t start_ns);

/* BLAS's layout of a row-major operand [rows, cols] with strides (s_rows, s_cols): NO_TRANS with
 * leading dim *ld when its columns are contiguous, TRANS when its rows are; 0 when neither. */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
RAL_INTERNAL int blas_layout(int64_t s_rows, int64_t s_cols, int64_t rows, int64_t cols, int *trans, int64_t *ld);

#endif
