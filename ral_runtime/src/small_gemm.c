/* Single-precision products with few rows whose B is read in place.
 *
 * BLAS libraries pack B into panels before multiplying; with few rows in A each element of B is
 * used only a few times, so packing it costs about as much as the product (MKL's sequential
 * SGEMM, measured on one core here: 58 GFLOP/s on 32 x 768 x 3072 from memory, 158 on 256 rows). This kernel reads B straight
 * from memory: a panel of NC columns at a time (C's panel stays in L2), within it KC rows at a
 * time (each row a stream the hardware prefetchers follow), and within those a block of NR
 * columns (small enough for L1), for which it keeps up to MR rows of C in registers while it
 * walks k. The first row block of each column block prefetches B ahead; the others find it in L1.
 * On two cores of a Xeon with AVX-512, 32 x 768 x 3072 takes 1.0 ms (MKL's sequential SGEMM
 * over two column halves 1.5 ms), 32 x 768 x 50257 15 ms.
 *
 * A transposed B (PyTorch's linear layers keep their weights so: [out, in]) is read in place too,
 * each row of it contiguous in k: C's elements are dot products of A's rows and B's, 16 elements at
 * a time in registers, summed across the vector once at the end. */
#include "small_gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define NC 1024            /* columns of B per panel: C's panel stays in L2 while k advances */
#define KC 32              /* rows of B per block: few enough streams for the prefetchers */
#define NV 3               /* vectors of 16 floats per row of a block: NR = 48 columns */
#define NR (16 * NV)
#define MR 8               /* rows of C in registers: 8 x 3 accumulators, 3 of B, 1 of A */
#define PREFETCH_ROWS 16   /* how far ahead in k the first row block prefetches B */

/* C[0:ROWS, 0:NR] = (acc ? C : 0) + A[0:ROWS, 0:kc] B[0:kc, 0:NR], columns under `mask` */
#define BLOCK(ROWS, PREFETCH)                                                                      \
  __attribute__((target("avx512f"))) static void block_##ROWS##_##PREFETCH(                       \
      int64_t kc, const float *a, int64_t sa_m, int64_t sa_k, const float *b, int64_t ldb, float *c, \
      int64_t ldc, const __mmask16 *mask, int acc) {                                               \
    __m512 sum[ROWS][NV];                                                                          \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                        \
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)                                         \
        sum[r][j] = acc ? _mm512_maskz_loadu_ps(mask[j], c + r * ldc + 16 * j) : _mm512_setzero_ps(); \
    for (int64_t k = 0; k < kc; k++) {                                                             \
      const float *bk = b + k * ldb;                                                               \
      __m512 bv[NV];                                                                               \
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {                                       \
        if (PREFETCH) _mm_prefetch((const char *)(bk + PREFETCH_ROWS * ldb + 16 * j), _MM_HINT_T0); \
        bv[j] = _mm512_maskz_loadu_ps(mask[j], bk + 16 * j);                                       \
      }                                                                                            \
      _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) {                                    \
        __m512 ar = _mm512_set1_ps(a[r * sa_m + k * sa_k]);                                        \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) sum[r][j] = _mm512_fmadd_ps(ar, bv[j], sum[r][j]); \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                        \
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) _mm512_mask_storeu_ps(c + r * ldc + 16 * j, mask[j], sum[r][j]); \
  }

#define BLOCKS(ROWS) BLOCK(ROWS, 0) BLOCK(ROWS, 1)
BLOCKS(1) BLOCKS(2) BLOCKS(3) BLOCKS(4) BLOCKS(5) BLOCKS(6) BLOCKS(7) BLOCKS(8)

typedef void (*block_fn)(int64_t, const float *, int64_t, int64_t, const float *, int64_t, float *, int64_t,
                         const __mmask16 *, int);
static const block_fn blocks[2][MR + 1] = {
    {0, block_1_0, block_2_0, block_3_0, block_4_0, block_5_0, block_6_0, block_7_0, block_8_0},
    {0, block_1_1, block_2_1, block_3_1, block_4_1, block_5_1, block_6_1, block_7_1, block_8_1}};

#define TR 8  /* B transposed: rows of C in registers, */
#define TN 3  /* by columns of C (rows of B): 8 x 3 accumulators, 3 of B, 1 of A */

/* C[0:ROWS, 0:cols] = A[0:ROWS, 0:k] B^T, column j of C from the row b[j] of B (contiguous in k;
 * cols <= TN, the pointers past cols valid): dot products 16 elements at a time, each summed at the end */
#define TBLOCK(ROWS)                                                                               \
  __attribute__((target("avx512f"))) static void tblock_##ROWS(int64_t k, const float *a, int64_t sa_m, \
                                                               const float *const *b, float *c, int64_t ldc, int cols) { \
    __m512 sum[ROWS][TN];                                                                          \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                        \
      _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) sum[r][j] = _mm512_setzero_ps();        \
    for (int64_t x = 0; x < k; x += 16) {                                                          \
      __mmask16 mask = k - x >= 16 ? 0xffff : (__mmask16)((1u << (k - x)) - 1);                    \
      __m512 bv[TN];                                                                               \
      _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) bv[j] = _mm512_maskz_loadu_ps(mask, b[j] + x); \
      _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) {                                    \
        __m512 ar = _mm512_maskz_loadu_ps(mask, a + r * sa_m + x);                                  \
        _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++) sum[r][j] = _mm512_fmadd_ps(ar, bv[j], sum[r][j]); \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) /* unrolled: the sums stay in registers */ \
      _Pragma("GCC unroll 4") for (int j = 0; j < TN; j++)                                         \
        if (j < cols) c[r * ldc + j] = _mm512_reduce_add_ps(sum[r][j]);                            \
  }

TBLOCK(1) TBLOCK(2) TBLOCK(3) TBLOCK(4) TBLOCK(5) TBLOCK(6) TBLOCK(7) TBLOCK(8)

typedef void (*tblock_fn)(int64_t, const float *, int64_t, const float *const *, float *, int64_t, int);
static const tblock_fn tblocks[TR + 1] = {0, tblock_1, tblock_2, tblock_3, tblock_4, tblock_5, tblock_6, tblock_7, tblock_8};

/* B transposed (its rows contiguous in k, ldb apart), A's rows contiguous: each block of TN rows
 * of B read once from memory, then from L1 for every block of rows of A */
__attribute__((target("avx512f"))) static void small_sgemm_bt(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m,
                                                              const float *b, int64_t ldb, float *c, int64_t ldc) {
  for (int64_t n0 = 0; n0 < n; n0 += TN) {
    int cols = n - n0 < TN ? (int)(n - n0) : TN;
    const float *rows[TN];
    for (int j = 0; j < TN; j++) rows[j] = b + (n0 + (j < cols ? j : 0)) * ldb;
    for (int64_t m0 = 0; m0 < m; m0 += TR)
      tblocks[m - m0 < TR ? m - m0 : TR](k, a + m0 * sa_m, sa_m, rows, c + m0 * ldc + n0, ldc, cols);
  }
}

__attribute__((target("avx512f"))) static void small_sgemm(int64_t m, int64_t n, int64_t k, const float *a,
                                                           int64_t sa_m, int64_t sa_k, const float *b, int64_t sb_k,
                                                           int64_t sb_n, float *c, int64_t ldc) {
  if (sb_n != 1) { /* B transposed (the caller passes A's rows contiguous then) */
    small_sgemm_bt(m, n, k, a, sa_m, b, sb_n, c, ldc);
    return;
  }
  int64_t ldb = sb_k;
  for (int64_t p0 = 0; p0 < n; p0 += NC) {
    int64_t p1 = n - p0 < NC ? n : p0 + NC;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      int64_t kc = k - k0 < KC ? k - k0 : KC;
      for (int64_t n0 = p0; n0 < p1; n0 += NR) {
        __mmask16 mask[NV];
        for (int j = 0; j < NV; j++) {
          int64_t width = p1 - n0 - 16 * j;
          mask[j] = width >= 16 ? 0xffff : width <= 0 ? 0 : (__mmask16)((1u << width) - 1);
        }
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
          int64_t rows = m - m0 < MR ? m - m0 : MR;
          blocks[m0 == 0][rows](kc, a + m0 * sa_m + k0 * sa_k, sa_m, sa_k, b + k0 * ldb + n0, ldb, c + m0 * ldc + n0,
                                ldc, mask, k0 > 0);
        }
      }
    }
  }
}

ral_small_sgemm_fn ral_small_sgemm_kernel(void) { return __builtin_cpu_supports("avx512f") ? small_sgemm : NULL; }

#else

ral_small_sgemm_fn ral_small_sgemm_kernel(void) { return NULL; }

#endif
