/* Single-precision GEMM for CPUs with AVX2 and FMA, and with AVX-512.
 *
 * The loop structure of the BLIS family: B is copied a block of KC x NC at a time into panels
 * NR columns wide (each element of a panel then read from L1 in order), and a micro-kernel keeps
 * an MR x NR tile of C in vector registers while it walks k, broadcasting one element of A per
 * row. Unlike a BLAS, A is read in place, not packed: the broadcasts of a tile's MR rows are
 * loads of any stride, and the MC rows of a block stay in L2 while the panels pass. Measured on
 * the 2-core AMD EPYC (Zen 3) this project is benchmarked on, one thread, packing A cost about as
 * much as it saved, and more where n is small (256 x 64 x 256: 71 GFLOP/s packed, 93 in place).
 * B read in place for few rows lost where its rows are a power of two apart (all in a few cache
 * sets: 32 x 1024 x 256 at 25 GFLOP/s, packed 58). A transposed B is packed through 8 x 8
 * register transposes.
 *
 * Two tiles over the same panels of 16 columns:
 * - AVX2: 6 x 16, 12 of the 16 registers hold C, two a row of B, one the broadcast element;
 *   Zen 3's two FMA pipes with a latency of 4 need at least 8 independent sums, so tiles of fewer
 *   than 4 rows are latency bound here: the last rows are split in two tiles of 4 to 6 where
 *   they can be.
 * - AVX-512: 8 x 16, a row of C per register. More rows did worse on Zen 4 (14 rows: 62 against
 *   102 GFLOP/s on 4096 x 256 x 1024): A's rows 4 KiB apart then map to more L1 sets' ways than
 *   its 8.
 * A product of one row goes to the BLAS's GEMV (ral.c). */
#include "packed_gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

#define MR_MAX 8         /* rows of the largest tile (AVX-512's) */
#define NR 16
#define KC 256           /* rows of B per block: a panel (KC x NR) is 16 KiB, half of L1 */
#define MC 144           /* rows of A per block: MC x KC is 144 KiB, in L2 while the panels pass */
#define NC 2048          /* columns of B per block: KC x NC is 2 MiB, in L3 */

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,fma")))

/* C[0:ROWS, 0:NR] = (acc ? C : 0) + op(A)[0:ROWS, 0:kc] panel[0:kc, 0:NR] */
#define TILE(ROWS)                                                                                                 \
  AVX2 static void tile_##ROWS(int64_t kc, const float *a, int64_t sa_m, int64_t sa_k, const float *b, float *c,     \
                               int64_t ldc, int acc) {                                                            \
    __m256 sum[ROWS][2];                                                                                           \
    _Pragma("GCC unroll 6") for (int r = 0; r < ROWS; r++) {                                                       \
      sum[r][0] = sum[r][1] = _mm256_setzero_ps();                                                                 \
      _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);                                                      \
      _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);                                             \
    }                                                                                                              \
    for (int64_t p = 0; p < kc; p++) {                                                                             \
      __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);                                                   \
      _mm_prefetch((const char *)(b + 8 * NR), _MM_HINT_T0);                                                       \
      _Pragma("GCC unroll 6") for (int r = 0; r < ROWS; r++) {                                                     \
        __m256 ar = _mm256_broadcast_ss(a + r * sa_m);                                                             \
        sum[r][0] = _mm256_fmadd_ps(ar, b0, sum[r][0]);                                                            \
        sum[r][1] = _mm256_fmadd_ps(ar, b1, sum[r][1]);                                                            \
      }                                                                                                            \
      a += sa_k;                                                                                                   \
      b += NR;                                                                                                     \
    }                                                                                                              \
    _Pragma("GCC unroll 6") for (int r = 0; r < ROWS; r++) {                                                       \
      if (acc) {                                                                                                   \
        sum[r][0] = _mm256_add_ps(sum[r][0], _mm256_loadu_ps(c + r * ldc));                                        \
        sum[r][1] = _mm256_add_ps(sum[r][1], _mm256_loadu_ps(c + r * ldc + 8));                                    \
      }                                                                                                            \
      _mm256_storeu_ps(c + r * ldc, sum[r][0]);                                                                    \
      _mm256_storeu_ps(c + r * ldc + 8, sum[r][1]);                                                                \
    }                                                                                                              \
  }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

/* The same with a row of C per 512-bit register */
#define TILE512(ROWS)                                                                                              \
  AVX512 static void tile512_##ROWS(int64_t kc, const float *a, int64_t sa_m, int64_t sa_k, const float *b,         \
                                    float *c, int64_t ldc, int acc) {                                             \
    __m512 sum[ROWS];                                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) {                                                       \
      sum[r] = _mm512_setzero_ps();                                                                                \
      _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);                                                      \
    }                                                                                                              \
    for (int64_t p = 0; p < kc; p++) {                                                                             \
      __m512 b0 = _mm512_loadu_ps(b);                                                                              \
      _mm_prefetch((const char *)(b + 8 * NR), _MM_HINT_T0);                                                       \
      _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++)                                                       \
        sum[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * sa_m]), b0, sum[r]);                                         \
      a += sa_k;                                                                                                   \
      b += NR;                                                                                                     \
    }                                                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < ROWS; r++) {                                                       \
      if (acc) sum[r] = _mm512_add_ps(sum[r], _mm512_loadu_ps(c + r * ldc));                                       \
      _mm512_storeu_ps(c + r * ldc, sum[r]);                                                                       \
    }                                                                                                              \
  }
TILE512(1) TILE512(2) TILE512(3) TILE512(4) TILE512(5) TILE512(6) TILE512(7) TILE512(8)

typedef void (*tile_fn)(int64_t, const float *, int64_t, int64_t, const float *, float *, int64_t, int);
typedef struct {
  int mr;                    /* rows of the full tile */
  tile_fn tiles[MR_MAX + 1]; /* tiles[r]: r rows */
} tile_set;
static const tile_set avx2_tiles = {6, {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6}};
static const tile_set avx512_tiles = {8, {0, tile512_1, tile512_2, tile512_3, tile512_4, tile512_5, tile512_6, tile512_7,
                                          tile512_8}};

/* A tile of `rows` x `cols` (< NR), through a buffer */
static void edge_tile(const tile_set *ts, int rows, int cols, int64_t kc, const float *a, int64_t sa_m, int64_t sa_k,
                      const float *b, float *c, int64_t ldc, int acc) {
  float t[MR_MAX * NR];
  ts->tiles[rows](kc, a, sa_m, sa_k, b, t, NR, 0);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < cols; j++) c[r * ldc + j] = (acc ? c[r * ldc + j] : 0) + t[r * NR + j];
}

/* 16 columns of kc rows of B (rows contiguous, ldb apart) into a panel */
AVX2 static void pack_rows(int64_t kc, const float *b, int64_t ldb, float *panel) {
  for (int64_t p = 0; p < kc; p++) {
    _mm256_store_ps(panel + p * NR, _mm256_loadu_ps(b + p * ldb));
    _mm256_store_ps(panel + p * NR + 8, _mm256_loadu_ps(b + p * ldb + 8));
  }
}

/* 16 columns of kc rows of a transposed B (column j of op(B) at b + j * ldb, contiguous) into a
 * panel, 8 x 8 at a time through registers */
AVX2 static void pack_columns(int64_t kc, const float *b, int64_t ldb, float *panel) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8)
    for (int h = 0; h < 2; h++) {
      const float *s = b + p + 8 * h * ldb;
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(s + i * ldb);
      for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
      for (int i = 0; i < 2; i++) { /* u[4i..4i+3]: columns 0-3 of rows 4i..4i+3, per lane */
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
      }
      float *d = panel + p * NR + 8 * h;
      for (int i = 0; i < 4; i++) {
        _mm256_store_ps(d + i * NR, _mm256_permute2f128_ps(u[i], u[4 + i], 0x20));
        _mm256_store_ps(d + (4 + i) * NR, _mm256_permute2f128_ps(u[i], u[4 + i], 0x31));
      }
    }
  for (; p < kc; p++)
    for (int j = 0; j < NR; j++) panel[p * NR + j] = b[p + j * ldb];
}

/* `cols` (at most NR) columns of kc rows of op(B) into a panel, zero-padded to NR */
AVX2 static void pack_panel(int64_t kc, int cols, const float *b, int64_t sb_k, int64_t sb_n, float *panel) {
  if (cols == NR && sb_n == 1)
    pack_rows(kc, b, sb_k, panel);
  else if (cols == NR && sb_k == 1)
    pack_columns(kc, b, sb_n, panel);
  else
    for (int64_t p = 0; p < kc; p++)
      for (int j = 0; j < NR; j++) panel[p * NR + j] = j < cols ? b[p * sb_k + j * sb_n] : 0;
}

/* Each thread's panel buffer: grown when a block needs more, freed when the thread ends. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
  float *data;
  size_t floats;
} scratch;

static void scratch_free(void *p) {
  free(((scratch *)p)->data);
  free(p);
}
static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

static float *scratch_get(size_t floats) {
  pthread_once(&scratch_once, scratch_init);
  scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    if (!(s = calloc(1, sizeof *s))) return NULL;
    pthread_setspecific(scratch_key, s);
  }
  if (s->floats < floats) {
    free(s->data);
    s->data = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    s->floats = s->data ? floats : 0;
  }
  return s->data;
}

/* Panels [first, last) of kc rows of op(B)'s nc columns (panel j / NR at panels + j * kc) */
AVX2 static void pack_panels(int64_t kc, int64_t nc, const float *b, int64_t sb_k, int64_t sb_n, float *panels, int64_t first,
                             int64_t last) {
  for (int64_t j = first * NR; j < last * NR && j < nc; j += NR)
    pack_panel(kc, nc - j < NR ? (int)(nc - j) : NR, b + j * sb_n, sb_k, sb_n, panels + j * kc);
}

/* C[0:m, 0:nc] = (acc ? C : 0) + op(A)[0:m, 0:kc] op(B)[0:kc, 0:nc] with op(B) in `panels` (panel
 * j / NR at panels + j * kc), or with panels NULL, each panel packed from b where it is used */
AVX2 static void multiply_block(const tile_set *ts, int64_t m, int64_t nc, int64_t kc, const float *a, int64_t sa_m,
                                int64_t sa_k, const float *panels, const float *b, int64_t sb_k, int64_t sb_n, float *c,
                                int64_t ldc, int acc) {
  float one[KC * NR] __attribute__((aligned(32)));
  for (int64_t ic = 0; ic < m; ic += MC) {
    int64_t mc = m - ic < MC ? m - ic : MC;
    for (int64_t jr = 0; jr < nc; jr += NR) {
      int cols = nc - jr < NR ? (int)(nc - jr) : NR;
      const float *panel = panels ? panels + jr * kc : one;
      if (!panels) pack_panel(kc, cols, b + jr * sb_n, sb_k, sb_n, one);
      for (int64_t ir = 0, rows; ir < mc; ir += rows) {
        /* tiles of mr rows; the last mr + r (0 < r < mr) in two halves, not a tile of r: one of
         * few rows has too few sums in flight, and waits on the FMA latency */
        int mr = ts->mr;
        rows = mc - ir >= 2 * mr || mc - ir <= mr ? (mc - ir < mr ? mc - ir : mr) : (mc - ir + 1) / 2;
        const float *at = a + (ic + ir) * sa_m;
        float *ct = c + (ic + ir) * ldc + jr;
        if (cols == NR)
          ts->tiles[rows](kc, at, sa_m, sa_k, panel, ct, ldc, acc);
        else
          edge_tile(ts, (int)rows, cols, kc, at, sa_m, sa_k, panel, ct, ldc, acc);
      }
    }
  }
}

AVX2 static void product(const tile_set *ts, int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k,
                         const float *b, int64_t sb_k, int64_t sb_n, float *c, int64_t ldc) {
  /* the block's panels, packed before its rows pass; without memory for them, each panel is
   * packed where it is used */
  float *panels = scratch_get((size_t)((n < NC ? n : NC) + NR - 1) / NR * NR * KC);
  for (int64_t jc = 0; jc < n; jc += NC) {
    int64_t nc = n - jc < NC ? n - jc : NC;
    for (int64_t pc = 0; pc < k; pc += KC) {
      int64_t kc = k - pc < KC ? k - pc : KC;
      const float *bk = b + pc * sb_k + jc * sb_n;
      if (panels) pack_panels(kc, nc, bk, sb_k, sb_n, panels, 0, (nc + NR - 1) / NR);
      multiply_block(ts, m, nc, kc, a + pc * sa_k, sa_m, sa_k, panels, bk, sb_k, sb_n, c + jc, ldc, pc > 0);
    }
  }
}

/* The whole op(B) packed once (`ral_packed_sgemm_shared`): the KC-row block starting at row pc at
 * packed + pc * n_pad (n rounded up to NR), its panel j / NR at + j * kc. */
static int64_t padded(int64_t n) { return (n + NR - 1) / NR * NR; }

AVX2 static void pack_shared(int64_t n, int64_t k, const float *b, int64_t sb_k, int64_t sb_n, float *packed, int64_t first,
                             int64_t last) {
  for (int64_t pc = 0; pc < k; pc += KC)
    pack_panels(k - pc < KC ? k - pc : KC, n, b + pc * sb_k, sb_k, sb_n, packed + pc * padded(n), first, last);
}

AVX2 static void multiply_shared(const tile_set *ts, int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m,
                                 int64_t sa_k, const float *packed, float *c, int64_t ldc) {
  for (int64_t pc = 0; pc < k; pc += KC)
    multiply_block(ts, m, n, k - pc < KC ? k - pc : KC, a + pc * sa_k, sa_m, sa_k, packed + pc * padded(n), NULL, 0, 0, c,
                   ldc, pc > 0);
}

static int64_t shared_floats(int64_t n, int64_t k) { return k * padded(n); }

/* each tile set's entry points */
#define ENTRIES(SET, TARGET)                                                                                         \
  TARGET static void product_##SET(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m, int64_t sa_k,     \
                                   const float *b, int64_t sb_k, int64_t sb_n, float *c, int64_t ldc) {             \
    product(&SET##_tiles, m, n, k, a, sa_m, sa_k, b, sb_k, sb_n, c, ldc);                                          \
  }                                                                                                                \
  TARGET static void multiply_shared_##SET(int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_m,          \
                                           int64_t sa_k, const float *packed, float *c, int64_t ldc) {            \
    multiply_shared(&SET##_tiles, m, n, k, a, sa_m, sa_k, packed, c, ldc);                                         \
  }                                                                                                                \
  static const ral_shared_sgemm shared_##SET = {NR, shared_floats, pack_shared, multiply_shared_##SET};
ENTRIES(avx2, AVX2)
ENTRIES(avx512, AVX512)

ral_sgemm_fn ral_packed_sgemm_avx2(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? product_avx2 : NULL;
}

ral_sgemm_fn ral_packed_sgemm_avx512(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") ? product_avx512 : NULL;
}

ral_sgemm_fn ral_packed_sgemm_kernel(void) {
  if (!__builtin_cpu_supports("avx512f")) return ral_packed_sgemm_avx2();
  return __builtin_cpu_is("amd") ? ral_packed_sgemm_avx512() : NULL;
}

const ral_shared_sgemm *ral_packed_sgemm_shared(void) {
  ral_sgemm_fn kernel = ral_packed_sgemm_kernel();
  return kernel == product_avx512 ? &shared_avx512 : kernel == product_avx2 ? &shared_avx2 : NULL;
}

#else

ral_sgemm_fn ral_packed_sgemm_avx2(void) { return NULL; }
ral_sgemm_fn ral_packed_sgemm_avx512(void) { return NULL; }
ral_sgemm_fn ral_packed_sgemm_kernel(void) { return NULL; }
const ral_shared_sgemm *ral_packed_sgemm_shared(void) { return NULL; }

#endif
