#ifndef DISC_RAL_PACKED_GEMM_H
#define DISC_RAL_PACKED_GEMM_H

#include <stdint.h>

/* C[m, n] = op(A)[m, k] op(B)[k, n] in single precision: op(A)[i, p] = a[i * sa_m + p * sa_k],
 * op(B)[p, j] = b[p * sb_k + j * sb_n] (one of sb_k, sb_n is 1), C's rows contiguous (leading
 * dim ldc); m, n, k > 0. Reads and writes nothing outside those elements. */
typedef void (*ral_sgemm_fn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k, const float *b,
                             int64_t sb_k, int64_t sb_n, float *c, int64_t ldc);

/* The runtime's own kernel for this CPU (AVX2 and FMA without AVX-512, where it was measured
 * faster than MKL), or NULL: the BLAS does these. */
ral_sgemm_fn ral_packed_sgemm_kernel(void);

/* The same kernel whatever the CPU's other features (NULL without AVX2 and FMA): for tests. */
ral_sgemm_fn ral_packed_sgemm_avx2(void);

#endif
