#ifndef DISC_RAL_SMALL_GEMM_H
#define DISC_RAL_SMALL_GEMM_H

#include <stdint.h>

/* C[m, n] = A[m, k] B[k, n] in single precision, A at strides (sa_m, sa_k), B at (sb_k, sb_n) with
 * one of them 1: B's rows contiguous (sb_n = 1), or B transposed (sb_k = 1) and then A's rows
 * contiguous (sa_k = 1); C's rows contiguous (leading dim ldc); m, n, k > 0. Meant for few rows
 * (see small_gemm.c). */
typedef void (*ral_small_sgemm_fn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k,
                                   const float *b, int64_t sb_k, int64_t sb_n, float *c, int64_t ldc);

/* The kernel for this CPU, or NULL where there is none (no AVX-512: the BLAS does these too). */
ral_small_sgemm_fn ral_small_sgemm_kernel(void);

#endif
