#ifndef DISC_RAL_PACKED_GEMM_H
#define DISC_RAL_PACKED_GEMM_H

#include <stdint.h>

/* C[m, n] = op(A)[m, k] op(B)[k, n] in single precision: op(A)[i, p] = a[i * sa_m + p * sa_k],
 * op(B)[p, j] = b[p * sb_k + j * sb_n] (one of sb_k, sb_n is 1), C's rows contiguous (leading
 * dim ldc); m, n, k > 0. Reads and writes nothing outside those elements. */
typedef void (*ral_sgemm_fn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k, const float *b,
                             int64_t sb_k, int64_t sb_n, float *c, int64_t ldc);

/* The runtime's own kernel for this CPU, or NULL: the BLAS does these. Where it was measured
 * faster than MKL: the AVX2 tile on CPUs without AVX-512 (Zen 3), the AVX-512 tile on AMD's CPUs
 * with AVX-512 (Zen 4). Intel's CPUs with AVX-512 keep MKL, which is tuned for them. */
ral_sgemm_fn ral_packed_sgemm_kernel(void);

/* The kernel with each tile whatever the CPU's vendor (NULL without the tile's instructions):
 * for tests. */
ral_sgemm_fn ral_packed_sgemm_avx2(void);
ral_sgemm_fn ral_packed_sgemm_avx512(void);

/* The kernel `ral_packed_sgemm_kernel` picks, for a product whose row blocks run on several
 * threads: op(B) is packed once into a buffer of `floats(n, k)` floats, 32-byte aligned (`pack`:
 * its panels [first, last) of `nr` columns, so the threads can share the work), and every row
 * block reads it (`multiply`: C[m, n] = op(A)[m, k] op(B), strides as above). Each block would
 * otherwise pack all of B itself. NULL where the runtime has no kernel for this CPU. */
typedef struct {
  int64_t nr;
  int64_t (*floats)(int64_t n, int64_t k);
  void (*pack)(int64_t n, int64_t k, const float *b, int64_t sb_k, int64_t sb_n, float *packed, int64_t first, int64_t last);
  void (*multiply)(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k, const float *packed, float *c,
                   int64_t ldc);
} ral_shared_sgemm;

const ral_shared_sgemm *ral_packed_sgemm_shared(void);

#endif
