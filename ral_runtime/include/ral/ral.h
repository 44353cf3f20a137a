/* disc_stablehlo runtime abstraction layer (RAL): the C ABI that compiled artifacts call.
 *
 * Ownership rules:
 *  - A ral_runtime owns the caching allocator, the thread pool and the loaded BLAS. Create one
 *    per process (or per device) and share it between threads: every entry point is thread-safe.
 *  - A ral_context belongs to ONE call of a compiled function on ONE thread. Every buffer the
 *    generated code allocates during that call is recorded in the context and returned to the
 *    runtime's cache by ral_context_destroy, except buffers handed to the caller with
 *    ral_context_take, which the caller later gives back with ral_buffer_free (host buffers) or
 *    ral_gpu_free (device buffers).
 *  - Errors never abort: they are recorded in the context (first error wins) and read back with
 *    ral_context_status / ral_context_message after the call.
 */
#ifndef RAL_RAL_H
#define RAL_RAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  RAL_OK = 0,
  RAL_ERR_INVALID_ARGUMENT = 1,
  RAL_ERR_OUT_OF_MEMORY = 2,
  RAL_ERR_UNAVAILABLE = 3, /* a library (BLAS, driver) could not be loaded */
  RAL_ERR_INTERNAL = 4,
  RAL_ERR_SHAPE = 5, /* a size the program computed at run time is negative or overflows */
} ral_status;

/* Version of this C ABI (the entry points below and their behaviour). A compiled object records
 * the version it was linked against; a runtime refuses objects of another version. */
#define RAL_ABI_VERSION 8
/* RAL_ABI_VERSION of the library actually loaded (which may differ from the header's). */
int ral_abi_version(void);

typedef struct ral_runtime ral_runtime;
typedef struct ral_context ral_context;

/* Creates a runtime. blas_path may be NULL (GEMM calls then fail with RAL_ERR_UNAVAILABLE, but
 * for single precision on CPUs with the runtime's own kernel: AVX2 and FMA, no AVX-512).
 * num_threads <= 0 uses every core the process may run on (its CPU affinity). The environment
 * variable DISC_GEMM=blas gives single precision to the BLAS too; any other non-empty value is
 * RAL_ERR_INVALID_ARGUMENT. On failure *out is NULL and the status says why. */
ral_status ral_runtime_create(const char *blas_path, int num_threads, ral_runtime **out);
void ral_runtime_destroy(ral_runtime *rt);
int ral_runtime_num_threads(const ral_runtime *rt);
/* Message of the last ral_runtime_create, ral_runtime_enable_gpu or ral_gpu_alloc failure on this
 * thread (static storage). */
const char *ral_runtime_create_error(void);

typedef struct {
  int64_t bytes_in_use;   /* held by live buffers (contexts and taken results) */
  int64_t peak_bytes;     /* high-water mark of bytes_in_use */
  int64_t bytes_cached;   /* free blocks kept for reuse */
  int64_t allocations;    /* requests served */
  int64_t cache_hits;     /* requests served from the cache */
} ral_memory_stats;
void ral_runtime_memory_stats(ral_runtime *rt, ral_memory_stats *out);
/* Starts a new high-water mark: peak_bytes = bytes_in_use. */
void ral_runtime_reset_peak(ral_runtime *rt);
/* Host memory given back is kept for reuse (size classes wasting under a quarter of a request)
 * up to `max_cached_bytes` in all (default 1 GiB; a block past it is freed at once) and for
 * `idle_ms` (default 10000): blocks cached longer are freed, looked for at most once a second as
 * memory is given back and, with a thread pool, while it waits for work. */
void ral_runtime_set_cache_limits(ral_runtime *rt, int64_t max_cached_bytes, int64_t idle_ms);
/* Frees every cached block, host and device. */
void ral_runtime_trim(ral_runtime *rt);

ral_status ral_context_create(ral_runtime *rt, ral_context **out);
/* Frees every buffer the context still owns. */
void ral_context_destroy(ral_context *ctx);
/* Makes ctx the current context of the calling thread (generated code finds it there) and
 * returns the previous one, so calls can nest. */
ral_context *ral_context_enter(ral_context *ctx);
ral_status ral_context_status(const ral_context *ctx);
const char *ral_context_message(const ral_context *ctx);
/* Records an error in the context; the first one is kept. */
void ral_context_fail(ral_context *ctx, ral_status status, const char *message);
/* Calls a packed entry point of generated code, `entry(args, results)`, with ctx current (entered
 * by the caller) and returns the context's status. An allocation, size check or library call that
 * fails ends the call there: nothing after it runs, and the buffers allocated so far stay owned by
 * the context. Inside a parallel loop (on any thread) the failing chunk ends, no other chunk
 * starts, and the call ends when the loop's running chunks are done. */
typedef void (*ral_entry)(void *args, void *results);
ral_status ral_context_call(ral_context *ctx, ral_entry entry, void *args, void *results);
/* Transfers a buffer allocated in this context (host, or device: disc_ral_gpu_alloc) to the
 * caller: returns 1 and forgets it, or 0 if the pointer was not allocated by this context (an
 * argument, a constant, or taken already). */
int ral_context_take(ral_context *ctx, void *ptr);
/* Gives a buffer obtained through ral_context_take back to the runtime. */
void ral_buffer_free(ral_runtime *rt, void *ptr);

/* Allocates from the runtime's cache on behalf of ctx (64-byte aligned). NULL on failure, with
 * the error recorded in ctx. */
void *ral_alloc(ral_context *ctx, size_t bytes);

/* Runs body(data, lo, hi) over [begin, end) split into chunks of at least `grain` iterations on
 * the runtime's thread pool, and returns when all chunks are done. Loops of concurrent calls run
 * at the same time (each caller runs chunks of its own loop, the pool's threads help them all);
 * called inside a chunk it runs inline. */
typedef void (*ral_parallel_body)(void *data, int64_t lo, int64_t hi);
void ral_parallel_for(ral_context *ctx, ral_parallel_body body, void *data, int64_t begin,
                      int64_t end, int64_t grain);

/* ---- entry points called by generated code (current context from ral_context_enter) ---- */

/* memref allocation hooks of MLIR's finalize-memref-to-llvm{use-generic-functions}. */
void *_mlir_memref_to_llvm_alloc(size_t bytes);
void *_mlir_memref_to_llvm_aligned_alloc(size_t alignment, size_t bytes);
void _mlir_memref_to_llvm_free(void *ptr);

/* Before an allocation of generated code: `status` 0 (the size is valid), 1 (a dim is negative:
 * `value`) or 2 (the byte count overflows 63 bits); `what` names the buffer (op, location, dims).
 * Fails the call with RAL_ERR_SHAPE, and ends it as ral_context_call says. */
void disc_ral_check_alloc(int64_t status, int64_t value, const char *what);
/* A shape contract of an op checked at run time (what the analysis could not prove: a slice
 * within its operand, a reshape keeping the element count, operands of equal dims, ...): when
 * `failed` is nonzero, fails the call with RAL_ERR_SHAPE, the message `what` (the op, its
 * location, the contract) with "{0}" and "{1}" replaced by `a` and `b` (the values seen), and
 * ends it as ral_context_call says. */
void disc_ral_check_shape(int64_t failed, const char *what, int64_t a, int64_t b);

/* StableHLO's fft over the last `rank` (1-3) dims of contiguous row-major data [batch, n0[,
 * n1[, n2]]]: `kind` 0 FFT and 1 IFFT (complex to complex, IFFT scaled by 1 / the points), 2
 * RFFT (real to complex: the last dim's n/2+1 first points), 3 IRFFT (complex, the last dim n/2+1
 * points, to real); `is_double`: f64 / complex<f64>, else f32 / complex<f32>; n0..n2 the
 * transform's lengths (unused ones ignored). Any lengths; computed in double precision. */
void disc_ral_fft(int64_t kind, int64_t is_double, int64_t batch, int64_t rank, int64_t n0, int64_t n1, int64_t n2,
                  const void *in, void *out);

/* LAPACK (and BLAS trsm) on a batch of `batch` row-major matrices, through the BLAS the runtime
 * loaded: `type` a DISC_LAPACK_F32..C128, `flags` the routine's character arguments (byte i the
 * i-th). Per matrix (m x n unless said; k = min(m, n); vectors of the real type for s and w):
 *   GETRF  a -> r0 LU factors, r1 pivots (k, int32, 1-based), r2 info (int32)
 *   POTRF  a (n x n) -> r0 factor (the other triangle a's), r1 info; flags: uplo
 *   GEQRF  a -> r0 Householder form, r1 tau (k)
 *   ORGQR  a, b tau (p) -> r0 Q (m x n, m >= n >= p)
 *   TRSM   a (m x m, side 'L'; n x n, 'R'), b -> r0 the solution; flags: side, uplo, trans, diag
 *   SYEVD  a (n x n) -> r0 vectors, r1 values (n), r2 info; flags: jobz, uplo
 *   GESDD, GESVD  a -> r0 a as overwritten, r1 s (k), r2 u (m x p), r3 vt (q x n), r4 info;
 *          flags: mode 'A' (p = m, q = n), 'S' (p = q = k) or 'N' (no vectors: u, vt zeros)
 *   GEEV   a (n x n) -> real types: r0, r1 values' real and imaginary parts (n), r2 left and r3
 *          right vectors (complex, n x n), r4 info; complex: r0 values, r1, r2 vectors, r3
 *          info; flags: left, right ('V' computed, 'N' zeros)
 * info > 0 (singular, not positive definite, no convergence) is a result; a size past 32-bit
 * integers or a routine the BLAS lacks fails the call. */
enum { DISC_LAPACK_GETRF, DISC_LAPACK_POTRF, DISC_LAPACK_GEQRF, DISC_LAPACK_ORGQR, DISC_LAPACK_TRSM, DISC_LAPACK_SYEVD,
       DISC_LAPACK_GESDD, DISC_LAPACK_GESVD, DISC_LAPACK_GEEV };
enum { DISC_LAPACK_F32, DISC_LAPACK_F64, DISC_LAPACK_C64, DISC_LAPACK_C128 };
void disc_ral_lapack(int64_t routine, int64_t type, int64_t flags, int64_t batch, int64_t m, int64_t n, int64_t p, int64_t q,
                     const void *a, const void *b, void *r0, void *r1, void *r2, void *r3, void *r4);

/* Runs body(data, lo, hi) over [0, n) on the current context's thread pool; runs inline when
 * `work` (an estimate of the loop's scalar iterations) is too small to pay for the threads. */
void disc_ral_parallel_for(ral_parallel_body body, void *data, int64_t n, int64_t work);

/* Statistics of a kernel (a parallel loop body, or a library entry such as disc_ral_gemm_f32)
 * over the whole process: calls, calls that used the thread pool, calls that ran as a GEMM
 * epilogue behind its row blocks (the rest ran inline: the small-size version), and wall time
 * in nanoseconds. Zeros for a kernel never called. Counted only while collection is on
 * (ral_kernel_stats_enable(1); off at start: calls then write no shared state). */
void ral_kernel_stats_enable(int on);
typedef struct {
  int64_t calls, pool_calls, fused_calls, ns;
} ral_kernel_stat;
void ral_kernel_stats(const void *kernel, ral_kernel_stat *out);

/* Strided copy between memrefs of any rank, called by MLIR's lowering of memref.copy when a
 * layout is not contiguous. Both arguments are MLIR unranked memrefs {rank, descriptor*}. */
typedef struct {
  int64_t rank;
  void *descriptor;
} ral_unranked_memref;
void memrefCopy(int64_t element_size, ral_unranked_memref *src, ral_unranked_memref *dst);

/* Batched GEMM C[i, j] = op(A[i, j]) x op(B[i, j]) on row-major strided views, over batch
 * entries (i, j) in [0, batch) x [0, inner) (two batch levels with strides of their own, so a
 * transposed view, e.g. attention heads inside a [batch, seq, heads, dim] buffer, needs no copy).
 * A: [batch, inner / a_group, m, k] with strides (sa_b, sa_i, sa_m, sa_k), its inner entry
 * j / a_group serving C's j (a_group >= 1 consecutive entries share one: grouped-query
 * attention's keys and values, read once per group instead of repeated per head); B: [batch,
 * inner / b_group, k, n] likewise; C: [batch, inner, m, n] with strides (sc_b, sc_i, ldc, 1) (a
 * transposed result, e.g. attention's context written straight into [batch, seq, heads, dim]).
 * Strides are in elements. */
void disc_ral_gemm_f32(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const float *a,
                       int64_t sa_b, int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const float *b, int64_t sb_b,
                       int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, float *c, int64_t sc_b, int64_t sc_i,
                       int64_t ldc);
void disc_ral_gemm_f64(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const double *a,
                       int64_t sa_b, int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const double *b, int64_t sb_b,
                       int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, double *c, int64_t sc_b, int64_t sc_i,
                       int64_t ldc);

/* The grouped GEMM of mixture-of-experts layers: rows [offs[g - 1], offs[g]) of A ([rows, k],
 * contiguous; from row 0 for g = 0) times B's group g ([groups, k, n] at strides (sb_g, sb_k,
 * sb_n)) into the same rows of C ([rows, n], contiguous), each group's product by
 * disc_ral_gemm_f32 / _f64; C's rows from offs[groups - 1] on are zeros. Offsets that decrease or
 * pass `rows` fail the call with RAL_ERR_INVALID_ARGUMENT before anything is written. */
void disc_ral_grouped_gemm_f32(int64_t rows, int64_t n, int64_t k, int64_t groups, const float *a, const float *b, int64_t sb_g,
                               int64_t sb_k, int64_t sb_n, const int64_t *offs, float *c);
void disc_ral_grouped_gemm_f64(int64_t rows, int64_t n, int64_t k, int64_t groups, const double *a, const double *b, int64_t sb_g,
                               int64_t sb_k, int64_t sb_n, const int64_t *offs, double *c);

/* The same with an epilogue: a parallel loop body over the rows of a contiguous C ([0, rows),
 * rows == batch * inner * m) that reads C only in its own rows. When the product runs on the pool in
 * blocks of whole rows, at least 4 per thread (so the pool balances them: batched products such
 * as attention scores), it runs on each block right after the block is computed, by the same
 * thread, while the block is in cache; otherwise (a small product, one row block per thread,
 * or few rows split into column blocks) after the product, as disc_ral_parallel_for(epilogue,
 * data, rows, work). */
void disc_ral_gemm_f32_epilogue(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const float *a,
                                int64_t sa_b, int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const float *b,
                                int64_t sb_b, int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, float *c,
                                int64_t sc_b, int64_t sc_i, int64_t ldc, ral_parallel_body epilogue, void *epilogue_data, int64_t rows, int64_t work);
void disc_ral_gemm_f64_epilogue(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const double *a,
                                int64_t sa_b, int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const double *b,
                                int64_t sb_b, int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, double *c,
                                int64_t sc_b, int64_t sc_i, int64_t ldc, ral_parallel_body epilogue, void *epilogue_data, int64_t rows, int64_t work);

/* Channels-first convolution y = x (*) w, up to three spatial dims (fewer: leading ones of size
 * 1): x [batch, x_c, in0, in1, in2], w [out_c, in_c, win0, win1, win2], y [batch, out_c, out0,
 * out1, out2], all contiguous. Output position o of a spatial dim reads input index
 * (o * stride + z * rhs - pad) / lhs at window position z, zero where that is outside the input
 * or not a multiple of the input dilation `lhs` (pad: the low padding, may be negative). Runs as
 * GEMMs of the kernel (out_c x in_c * window) by blocks of patch columns built into cache, on
 * the pool. Negative sizes, strides or dilations below 1, and an input whose feature count x_c
 * is not the kernel's in_c fail the context with RAL_ERR_INVALID_ARGUMENT before anything runs. */
#define DISC_RAL_CONV_ARGS(T)                                                                              \
  int64_t batch, int64_t x_c, int64_t in_c, int64_t out_c, const T *x, const T *w, T *y, int64_t in0,      \
      int64_t in1, int64_t in2, int64_t out0, int64_t out1, int64_t out2, int64_t win0, int64_t win1,      \
      int64_t win2, int64_t stride0, int64_t stride1, int64_t stride2, int64_t pad0, int64_t pad1,         \
      int64_t pad2, int64_t lhs0, int64_t lhs1, int64_t lhs2, int64_t rhs0, int64_t rhs1, int64_t rhs2
void disc_ral_conv_f32(DISC_RAL_CONV_ARGS(float));
void disc_ral_conv_f64(DISC_RAL_CONV_ARGS(double));
/* The same with an epilogue: a parallel loop body over the output's rows (all dims but the last,
 * [0, rows), rows == batch * out_c * out0 * out1) that reads the output only in its own rows. It
 * runs on each block of patch columns right after the block's product, by the same thread, for
 * each output feature of the block, while the block is in cache (when the blocks hold whole
 * rows); otherwise after the convolution, as disc_ral_parallel_for(epilogue, data, rows, work). */
void disc_ral_conv_f32_epilogue(DISC_RAL_CONV_ARGS(float), ral_parallel_body epilogue, void *epilogue_data, int64_t rows,
                                int64_t work);
void disc_ral_conv_f64_epilogue(DISC_RAL_CONV_ARGS(double), ral_parallel_body epilogue, void *epilogue_data, int64_t rows,
                                int64_t work);

/* ---- GPU device (CUDA or ROCm) ----------------------------------------------------------------
 * CUDA's driver and cuBLAS, or ROCm's HIP runtime and hipBLAS, are loaded with dlopen: the RAL
 * builds without either, and chooses the API at run time by the driver library it is given. What
 * follows says "driver", "cuBLAS", "cubin", "CUstream" and names CUDA's calls: on ROCm read the
 * HIP runtime, hipBLAS, the code object (HSACO), hipStream_t and HIP's calls (messages name the
 * calls made, e.g. "hipModuleLaunchKernel(...)" and "hipErrorOutOfMemory"). All GPU work of a
 * context (launches, copies, GEMMs) goes on the context's stream, in order; the host does not
 * wait for it except where said. Device memory comes from a caching allocator whose cached
 * blocks are reused only on the stream that freed them (stream order makes that safe), like
 * PyTorch's: a buffer used on another stream than the one it was allocated for must be freed only
 * after that work is done (ral_context_synchronize). Every entry point is thread-safe; each makes
 * the device's primary context current on the calling thread. */

/* Loads the driver library driver_path (NULL: "libcuda.so.1", CUDA's driver): one with cuInit is
 * driven as CUDA's driver, one with hipInit as HIP's runtime (ROCm: "libamdhip64.so"). Initialises
 * it and retains the primary context of device `ordinal` (the one PyTorch and JAX use: memory is
 * shared with them), and loads the BLAS from blas_path if it is not NULL: cuBLAS
 * ("libcublas.so.12") for CUDA, hipBLAS ("libhipblas.so") for ROCm; where it is NULL or does not
 * load, GEMMs fail with RAL_ERR_UNAVAILABLE, saying why. Failure: RAL_ERR_UNAVAILABLE, the message
 * in ral_runtime_create_error(). Calling it again is a no-op for the same device (RAL_OK), and
 * RAL_ERR_INVALID_ARGUMENT for another device, or for a driver_path of the other API. The runtime
 * releases the device when destroyed, freeing every device buffer it still knows (taken ones not
 * given back included). */
ral_status ral_runtime_enable_gpu(ral_runtime *rt, const char *driver_path, const char *blas_path, int ordinal);
int ral_runtime_has_gpu(const ral_runtime *rt);
enum { RAL_GPU_NONE = 0, RAL_GPU_CUDA = 1, RAL_GPU_ROCM = 2 };
/* The API of the runtime's GPU: RAL_GPU_CUDA, RAL_GPU_ROCM, or RAL_GPU_NONE before
 * ral_runtime_enable_gpu succeeds. */
int ral_runtime_gpu_kind(const ral_runtime *rt);
/* Device memory: held by live buffers (bytes_in_use: those of contexts, taken ones, constants and
 * ral_gpu_alloc's), cached free blocks, and so on as for host memory. Zeros without a GPU. */
void ral_runtime_gpu_memory_stats(ral_runtime *rt, ral_memory_stats *out);
/* Drops the cached modules (and their functions) and constants whose key (the image, PTX or host
 * data pointer given to disc_ral_gpu_launch / disc_ral_gpu_constant) lies in [begin, begin +
 * bytes). Call it before unloading a host object that called them with this runtime: another
 * object loaded at the same address would otherwise find the first one's kernels and constants.
 * No work using them may be pending. */
void ral_runtime_gpu_forget(ral_runtime *rt, const void *begin, size_t bytes);

/* The CUstream (hipStream_t) of the context's GPU work (NULL, the default: the legacy default stream). Set it
 * before the context's first GPU work. */
void ral_context_set_stream(ral_context *ctx, void *stream);
/* Waits for the context's stream. A driver error is recorded in the context and returned. */
ral_status ral_context_synchronize(ral_context *ctx);

/* Device memory for one call's own use (e.g. the copy of a host argument), from the runtime's
 * cache, for the context's stream: freed with the context, to that stream's pool (work the
 * context queued is done with it before other work on that stream reuses it). Failure:
 * RAL_ERR_OUT_OF_MEMORY (or RAL_ERR_UNAVAILABLE without a GPU), recorded in the context. */
ral_status ral_context_gpu_alloc(ral_context *ctx, size_t bytes, void **out);
/* Device memory for the caller (e.g. a call's inputs), from the runtime's cache, for the legacy
 * default stream. Failure: RAL_ERR_OUT_OF_MEMORY (or RAL_ERR_UNAVAILABLE without a GPU), the
 * message in ral_runtime_create_error(). */
ral_status ral_gpu_alloc(ral_runtime *rt, size_t bytes, void **out);
/* Gives back memory from ral_gpu_alloc, or a device buffer taken from a context with
 * ral_context_take. Other pointers are ignored. */
void ral_gpu_free(ral_runtime *rt, void *ptr);

/* A device buffer the caller owns (ral_gpu_alloc's, or one taken from a context) handed to
 * another framework without a copy: a DLPack DLManagedTensor (dlpack.h's layout) on the runtime's
 * device (kDLCUDA or kDLROCM) over `ndim` dims of `shape` and `strides` (in elements), of DLPack
 * type (`code`, `bits`). Its deleter gives the buffer back (ral_gpu_free); the runtime lives until
 * then (ral_runtime_destroy waits for every exported buffer's deleter). NULL without a GPU or
 * memory. */
void *ral_gpu_dlpack(ral_runtime *rt, void *ptr, int32_t ndim, const int64_t *shape, const int64_t *strides, uint8_t code,
                     uint8_t bits);
/* Calls the deleter of a DLManagedTensor (one nobody took). */
void ral_dlpack_delete(void *managed);

enum { RAL_COPY_HOST_TO_DEVICE = 0, RAL_COPY_DEVICE_TO_HOST = 1, RAL_COPY_DEVICE_TO_DEVICE = 2 };
/* Copies `bytes` on the context's stream. Host to device: pageable host memory may be reused on
 * return, page-locked memory only once the stream has done the copy. Device to host waits for the
 * stream: the data is there on return. Errors (a driver error: its name and description) are
 * recorded in the context and returned. */
ral_status ral_gpu_copy(ral_context *ctx, void *dst, const void *src, size_t bytes, int direction);

/* -- called by generated host code (current context from ral_context_enter). A failure fails the
 * context and ends the call as a failed allocation does (see ral_context_call); without a GPU
 * enabled they fail with RAL_ERR_UNAVAILABLE. */

/* A device buffer owned by the current context (given back by ral_context_destroy unless taken),
 * 256-byte aligned; 0 bytes gives a unique pointer too. Fails with RAL_ERR_OUT_OF_MEMORY (the
 * size and the driver's message) after a failed cuMemAlloc retried once with the cache freed. */
void *disc_ral_gpu_alloc(int64_t bytes);
/* Gives a buffer of disc_ral_gpu_alloc back early; a pointer the current context does not own
 * (an argument, a constant, freed already) is ignored. */
void disc_ral_gpu_free(void *ptr);
/* A device copy of read-only host data (a constant of the host object), made on first use and
 * kept by the runtime for every context and thread until the runtime is destroyed (or
 * ral_runtime_gpu_forget). */
void *disc_ral_gpu_constant(const void *host, int64_t bytes);
/* The host code's reads and writes of single elements of device buffers (indices, conditions):
 * copies of `bytes` on the context's stream (a read waits for the stream); a failure ends the call. */
void disc_ral_gpu_read(void *host, const void *device, int64_t bytes);
void disc_ral_gpu_write(void *device, const void *host, int64_t bytes);
/* Launches `kernel` of the module `image` (a cubin of image_size bytes, or NULL when there is only
 * PTX) with min(ceil(threads / block), 2^20) blocks of `block` threads in x (kernels loop
 * grid-stride), no dynamic shared memory, on the context's stream; threads <= 0 launches nothing.
 * `params`: num_params 8-byte slots, kernel parameter i in slot i. Modules are loaded once per
 * runtime, keyed by the image pointer (the PTX pointer without an image): the cubin, or where the
 * driver refuses it (built for another GPU) the NUL-terminated PTX text, compiled by the driver.
 * On ROCm `image` is the code object (an HSACO) and `ptx` is ignored: there is no fallback.
 * Driver errors fail with RAL_ERR_INTERNAL: "cuLaunchKernel(<kernel>, grid <g>, block <b>):
 * <error name>: <description>" (likewise for loading; on ROCm "hipModuleLaunchKernel(...)"). */
void disc_ral_gpu_launch(const void *image, int64_t image_size, const char *ptx, const char *kernel, void *params,
                         int64_t num_params, int64_t threads, int64_t block);
/* disc_ral_gemm_f32 / _f64 (same arguments and meaning) on device pointers, by cuBLAS on the
 * context's stream (default math: exact FP32, no TF32; hipBLAS on ROCm), counted in ral_kernel_stats (`ns`: the
 * time to enqueue). Each of A and B needs a unit stride in one of its dims (else
 * RAL_ERR_INVALID_ARGUMENT); RAL_ERR_UNAVAILABLE without the BLAS. */
void disc_ral_gpu_gemm_f32(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_b,
                           int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const float *b, int64_t sb_b,
                           int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, float *c, int64_t sc_b,
                           int64_t sc_i, int64_t ldc);
void disc_ral_gpu_gemm_f64(int64_t batch, int64_t inner, int64_t m, int64_t n, int64_t k, const double *a, int64_t sa_b,
                           int64_t sa_i, int64_t a_group, int64_t sa_m, int64_t sa_k, const double *b, int64_t sb_b,
                           int64_t sb_i, int64_t b_group, int64_t sb_k, int64_t sb_n, double *c, int64_t sc_b,
                           int64_t sc_i, int64_t ldc);
/* disc_ral_grouped_gemm_f32 / _f64 (same arguments and meaning) on device pointers: the offsets
 * read back to the host (the call waits for the stream) and checked, a cuBLAS product per group. */
void disc_ral_gpu_grouped_gemm_f32(int64_t rows, int64_t n, int64_t k, int64_t groups, const float *a, const float *b,
                                   int64_t sb_g, int64_t sb_k, int64_t sb_n, const int64_t *offs, float *c);
void disc_ral_gpu_grouped_gemm_f64(int64_t rows, int64_t n, int64_t k, int64_t groups, const double *a, const double *b,
                                   int64_t sb_g, int64_t sb_k, int64_t sb_n, const int64_t *offs, double *c);

#ifdef __cplusplus
}
#endif
#endif
