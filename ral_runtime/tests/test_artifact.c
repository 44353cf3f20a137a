/* Tests of the artifact reader: SHA-256, the JSON reader, rejection of damaged or foreign files,
 * and loading and calling artifacts end to end (also from several threads).
 *
 * Built twice from this one file: with DISC_TEST_KERNEL it is a small shared object with the
 * artifact calling convention (docs/artifact.md) that the test embeds in the artifacts it
 * writes; without, it is the test program. */
#ifdef DISC_TEST_KERNEL

/* ---- the embedded shared object ---------------------------------------------------------- */
#include <stdatomic.h>
#include <stdint.h>

#include "ral/ral.h"

typedef struct {
  void *allocated, *aligned;
  int64_t offset;
} memref0;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[1], strides[1];
} memref1;
typedef struct {
  void *allocated, *aligned;
  int64_t offset, sizes[2], strides[2];
} memref2;

/* inputs x f32[b, s], y i32[s, 2]; one parameter p f32[2] */
typedef struct {
  memref2 r0, r1, r2;
  memref1 r3;
  memref2 r4;
  memref0 r5;
} results;

static atomic_long entry_calls; /* per loaded copy of this object */

/* assertion 0: s >= 2 (values: s); assertion 1: b * s <= 4096 (values: b, s) */
void disc_call_guard(void **args, void *out) {
  const memref2 *x = args[0];
  int64_t b = x->sizes[0], s = x->sizes[1];
  int64_t *v = _mlir_memref_to_llvm_alloc(4 * sizeof(int64_t));
  if (!v) return;
  v[0] = s < 2 ? 0 : b * s > 4096 ? 1 : -1;
  v[1] = s;
  v[2] = b;
  v[3] = s;
  *(memref1 *)out = (memref1){v, v, 0, {4}, {1}};
}

/* r0 = x + p[0] + y[:, 0] (a new buffer); r1 = x (an input); r2 = r0 again; r3 = p (a
 * parameter); r4 = r0 transposed (a strided view); r5 = calls of this copy of the object so far */
void disc_call_entry(void **args, void *out) {
  const memref2 *x = args[0], *y = args[1];
  const memref1 *p = args[2];
  int64_t b = x->sizes[0], s = x->sizes[1];
  const float *xd = (const float *)x->aligned + x->offset, *pd = (const float *)p->aligned + p->offset;
  const int32_t *yd = (const int32_t *)y->aligned + y->offset;
  if (s > 0 && yd[0] == -7) { /* a failure inside the call: an allocation the RAL refuses */
    _mlir_memref_to_llvm_alloc(((size_t)1 << 47) + 1);
    return;
  }
  float *r0 = _mlir_memref_to_llvm_alloc((size_t)(b * s) * sizeof(float));
  int64_t *count = _mlir_memref_to_llvm_alloc(sizeof(int64_t));
  if (!r0 || !count) return;
  for (int64_t i = 0; i < b; i++)
    for (int64_t j = 0; j < s; j++) r0[i * s + j] = xd[i * s + j] + pd[0] + (float)yd[2 * j];
  *count = atomic_fetch_add(&entry_calls, 1) + 1;
  results *r = out;
  r->r0 = (memref2){r0, r0, 0, {b, s}, {s, 1}};
  r->r1 = *x;
  r->r2 = r->r0;
  r->r3 = *p;
  r->r4 = (memref2){r0, r0, 0, {s, b}, {1, s}};
  r->r5 = (memref0){count, count, 0};
}

#else

/* ---- the test program -------------------------------------------------------------------- */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "ral/artifact.h"
#include "sha256.h"

#include "check.h"
/* a failed call whose message contains `text` */
#define CHECK_ERROR(call, text)                                                                        \
  do {                                                                                                 \
    int ok_ = (call) != RAL_OK && strstr(disc_last_error(), (text)) != NULL;                           \
    CHECK(ok_ && #call);                                                                               \
    if (!ok_) fprintf(stderr, "  wanted \"%s\" in the message, got \"%s\"\n", (text), disc_last_error()); \
  } while (0)

static void hex(char *out, const uint8_t *d) {
  for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

/* ---- SHA-256 ---- */

static int sha_is(const void *data, size_t n, const char *expected) {
  uint8_t d[32];
  char h[65];
  disc_sha256(data, n, d);
  hex(h, d);
  if (strcmp(h, expected) != 0) fprintf(stderr, "  sha256 %s, expected %s\n", h, expected);
  return strcmp(h, expected) == 0;
}

static void test_sha256(void) {
  CHECK(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  CHECK(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills */
  CHECK(sha_is(two_blocks, strlen(two_blocks), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  /* 1 MiB: byte i = ((i * 31 + 7) & 0xff) ^ ((i >> 11) & 0xff); digest from Python's hashlib */
  size_t n = 1 << 20;
  uint8_t *buf = malloc(n);
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(((i * 31 + 7) & 0xff) ^ ((i >> 11) & 0xff));
  const char *big = "6f888c87e95e89ba6c05b8649778cd6d605ac2710ca041e28c8830b38bd7a8d0";
  CHECK(sha_is(buf, n, big));
  /* the same fed in uneven pieces */
  disc_sha256_ctx c;
  disc_sha256_init(&c);
  for (size_t at = 0, step = 1; at < n; step = step * 7 % 1000 + 1) {
    size_t k = n - at < step ? n - at : step;
    disc_sha256_update(&c, buf + at, k);
    at += k;
  }
  uint8_t d[32];
  char h[65];
  disc_sha256_final(&c, d);
  hex(h, d);
  CHECK(strcmp(h, big) == 0);
  memset(buf, 'a', 1000000); /* FIPS 180-4's million 'a's */
  CHECK(sha_is(buf, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
  free(buf);
}

/* ---- JSON ---- */

static disc_json *parse(const char *text, char *error) { return disc_json_parse(text, strlen(text), error, 256); }

static void test_json_valid(void) {
  char error[256];
  const char *text =
      " {\"a\": [1, -2, 0, -0, 9223372036854775807, -9223372036854775808, 9223372036854775808, 1.5e3, -0.25],\n"
      "  \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20AC\\ud83d\\ude00\", \"t\": true, \"f\": false,\n"
      "  \"n\": null, \"e\": {}, \"ea\": [], \"nested\": {\"k\": [[{\"x\": \"\"}]]}, \"a\": \"dup\"} ";
  disc_json *root = parse(text, error);
  CHECK(root != NULL);
  if (!root) {
    fprintf(stderr, "  %s\n", error);
    return;
  }
  CHECK(root->kind == DISC_JSON_OBJECT && root->count == 9);
  const disc_json *a = disc_json_get(root, "a"); /* the first of two "a" */
  CHECK(a && a->kind == DISC_JSON_ARRAY && a->count == 9);
  if (a && a->count == 9) {
    CHECK(a->items[0].kind == DISC_JSON_INT && a->items[0].integer == 1);
    CHECK(a->items[1].integer == -2 && a->items[2].integer == 0 && a->items[3].integer == 0);
    CHECK(a->items[4].kind == DISC_JSON_INT && a->items[4].integer == INT64_MAX);
    CHECK(a->items[5].kind == DISC_JSON_INT && a->items[5].integer == INT64_MIN);
    CHECK(a->items[6].kind == DISC_JSON_NUMBER && a->items[6].number == 9223372036854775808.0);
    CHECK(a->items[7].kind == DISC_JSON_NUMBER && a->items[7].number == 1500.0);
    CHECK(a->items[8].kind == DISC_JSON_NUMBER && a->items[8].number == -0.25);
  }
  const disc_json *s = disc_json_get(root, "s");
  const char *want = "q\"\\/\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  CHECK(s && s->kind == DISC_JSON_STRING && strcmp(s->string, want) == 0 && s->count == strlen(want));
  CHECK(disc_json_get(root, "t")->kind == DISC_JSON_BOOL && disc_json_get(root, "t")->integer == 1);
  CHECK(disc_json_get(root, "f")->kind == DISC_JSON_BOOL && disc_json_get(root, "f")->integer == 0);
  CHECK(disc_json_get(root, "n")->kind == DISC_JSON_NULL);
  CHECK(disc_json_get(root, "e")->kind == DISC_JSON_OBJECT && disc_json_get(root, "e")->count == 0);
  CHECK(disc_json_get(root, "ea")->kind == DISC_JSON_ARRAY && disc_json_get(root, "ea")->count == 0);
  const disc_json *k = disc_json_get(disc_json_get(root, "nested"), "k");
  CHECK(k && k->items[0].items[0].kind == DISC_JSON_OBJECT &&
        strcmp(disc_json_get(&k->items[0].items[0], "x")->string, "") == 0);
  CHECK(disc_json_get(root, "missing") == NULL && disc_json_get(a, "x") == NULL);
  disc_json_free(root);

  /* only `size` bytes are read: what follows them does not count */
  root = disc_json_parse("[1, 2]garbage", 6, error, sizeof error);
  CHECK(root && root->count == 2);
  disc_json_free(root);
  root = disc_json_parse("truex", 4, error, sizeof error);
  CHECK(root && root->kind == DISC_JSON_BOOL);
  disc_json_free(root);
  root = disc_json_parse("12345", 2, error, sizeof error);
  CHECK(root && root->integer == 12);
  disc_json_free(root);
  root = parse("[NaN, Infinity, -Infinity]", error); /* as Python's json module writes them */
  CHECK(root && root->count == 3 && root->items[0].number != root->items[0].number &&
        root->items[1].number > 1e308 && root->items[2].number < -1e308);
  disc_json_free(root);
  /* nesting at the limit is fine */
  char deep[2 * DISC_JSON_MAX_DEPTH + 1];
  for (int i = 0; i < DISC_JSON_MAX_DEPTH; i++) {
    deep[i] = '[';
    deep[DISC_JSON_MAX_DEPTH + i] = ']';
  }
  deep[2 * DISC_JSON_MAX_DEPTH] = '\0';
  root = parse(deep, error);
  CHECK(root != NULL);
  disc_json_free(root);
}

static void test_json_malformed(void) {
  static const struct {
    const char *text;
    const char *message;
  } cases[] = {
      {"", "expected a value"},
      {"   ", "expected a value"},
      {"{", "expected a string key"},
      {"[1,]", "expected a value"},
      {"[1 2]", "expected ',' or ']'"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\": 1,}", "expected a string key"},
      {"{1: 2}", "expected a string key"},
      {"\"abc", "unterminated string"},
      {"\"abc\\", "unterminated string"},
      {"\"\\x\"", "invalid escape: a backslash before 'x'"},
      {"\"\\u12\"", "4 hex digits"},
      {"\"\\u12G4\"", "4 hex digits"},
      {"\"\\ud800\"", "without a low surrogate"},
      {"\"\\ud800\\u0041\"", "not a low surrogate"},
      {"\"\\udc00\"", "unpaired low surrogate"},
      {"\"\\u0000\"", "\\u0000"},
      {"\"a\tb\"", "control character"},
      {"01", "leading zero"},
      {"1.", "after '.'"},
      {"1e", "exponent"},
      {"-", "expected a digit"},
      {"+1", "expected a value"},
      {"tru", "invalid literal"},
      {"nul", "invalid literal"},
      {"Nan", "invalid literal"},
      {"-Inf", "invalid literal"},
      {"[1] 2", "after the value"},
      {"{\"a\": [1, {\"b\": nulL}]}", "invalid literal"},
  };
  char error[256];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    disc_json *root = parse(cases[i].text, error);
    int ok = root == NULL && strstr(error, cases[i].message) && strstr(error, "at byte");
    CHECK(ok);
    if (!ok) fprintf(stderr, "  JSON %s: wanted \"%s\", got \"%s\"\n", cases[i].text, cases[i].message, error);
    disc_json_free(root);
  }
  /* an error's position */
  disc_json *root = parse("{\"a\": 1,\n \"b\" 2}", error);
  CHECK(root == NULL && strstr(error, "line 2, column 6"));
  /* too deep */
  char deep[2 * DISC_JSON_MAX_DEPTH + 3];
  memset(deep, '[', DISC_JSON_MAX_DEPTH + 1);
  memset(deep + DISC_JSON_MAX_DEPTH + 1, ']', DISC_JSON_MAX_DEPTH + 1);
  deep[2 * DISC_JSON_MAX_DEPTH + 2] = '\0';
  root = parse(deep, error);
  CHECK(root == NULL && strstr(error, "nesting deeper"));
  /* a string cut by the size: no read past it */
  root = disc_json_parse("\"abc\"", 4, error, sizeof error);
  CHECK(root == NULL && strstr(error, "unterminated"));
  root = disc_json_parse("[\"\\u00e9\"]", 6, error, sizeof error);
  CHECK(root == NULL);
}

/* ---- artifacts ---- */

#define PARAM_OFFSET 8192
#define OBJECT_OFFSET 8256

static uint8_t *kernel_so;
static size_t kernel_size;
static char dir[64];

static uint8_t *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

typedef struct {
  const char *target;     /* target.name */
  const char *flag;       /* one entry of target.cpu_flags */
  long long object_size;  /* sections.object's size; 0: the kernel's */
  const char *header;     /* the whole header text instead of the usual one */
  uint32_t version, abi;  /* 0: the right ones */
} variant;

/* The usual header (the test kernel's signature) with the variant's changes. */
static void header_text(char *buf, size_t n, const variant *v) {
  snprintf(buf, n,
           "{\"package_version\": \"test\",\n"
           " \"target\": {\"name\": \"%s\", \"triple\": \"x86_64-unknown-linux-gnu\", \"cpu\": \"generic\",\n"
           "            \"cpu_flags\": [\"%s\"]},\n"
           " \"entry\": \"disc_call_entry\", \"guard\": \"disc_call_guard\",\n"
           " \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"shape\": [\"b\", \"s\"]},\n"
           "            {\"name\": \"y\", \"dtype\": \"i32\", \"shape\": [\"s\", 2]}],\n"
           " \"outputs\": [{\"name\": \"r0\", \"dtype\": \"f32\", \"shape\": [\"b\", \"s\"]},\n"
           "             {\"name\": \"r1\", \"dtype\": \"f32\", \"shape\": [\"b\", \"s\"]},\n"
           "             {\"name\": \"r2\", \"dtype\": \"f32\", \"shape\": [\"b\", \"s\"]},\n"
           "             {\"name\": \"r3\", \"dtype\": \"f32\", \"shape\": [2]},\n"
           "             {\"name\": \"r4\", \"dtype\": \"f32\", \"shape\": [\"s\", \"b\"]},\n"
           "             {\"name\": \"r5\", \"dtype\": \"i64\", \"shape\": []}],\n"
           " \"params\": [{\"dtype\": \"f32\", \"shape\": [2], \"offset\": %d, \"nbytes\": 8}],\n"
           " \"assertions\": [{\"message\": \"s must be >= 2, got s = {0}\", \"num_values\": 1},\n"
           "                {\"message\": \"b * s = {0} * {1} must be <= 4096 ({2} {x} stays)\", \"num_values\": 2}],\n"
           " \"sections\": {\"object\": [%d, %lld], \"llvm_ir\": [%d, 0]},\n"
           " \"info\": {\"kernels\": [], \"note\": \"caf\\u00e9 \\ud83d\\ude00\", \"ratio\": 0.5, \"shape_report\": \"\"}}",
           v->target ? v->target : "x86", v->flag ? v->flag : "sse2", PARAM_OFFSET, OBJECT_OFFSET,
           v->object_size ? v->object_size : (long long)kernel_size, PARAM_OFFSET);
}

/* The artifact's bytes: prefix, header, the parameter p = [10, 20], the object. */
static uint8_t *build(const variant *v, size_t *size) {
  char header[PARAM_OFFSET];
  if (v->header)
    snprintf(header, sizeof header, "%s", v->header);
  else
    header_text(header, sizeof header, v);
  size_t header_size = strlen(header);
  if (64 + header_size > PARAM_OFFSET) abort();
  *size = OBJECT_OFFSET + kernel_size;
  uint8_t *f = calloc(1, *size);
  memcpy(f, "DISCSHLO", 8);
  put32(f + 8, v->version ? v->version : DISC_ARTIFACT_FORMAT_VERSION);
  put32(f + 12, v->abi ? v->abi : RAL_ABI_VERSION);
  put64(f + 16, header_size);
  put64(f + 24, *size);
  memcpy(f + 64, header, header_size);
  float p[2] = {10, 20};
  memcpy(f + PARAM_OFFSET, p, sizeof p);
  memcpy(f + OBJECT_OFFSET, kernel_so, kernel_size);
  disc_sha256(f + 64, *size - 64, f + 32);
  return f;
}

static void write_bytes(const char *path, const uint8_t *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(data, 1, n, f) == n);
  fclose(f);
}

static void path_of(char *out, const char *name) { snprintf(out, 256, "%s/%s", dir, name); }

static void write_variant(const char *name, const variant *v) {
  char path[256];
  size_t n;
  uint8_t *f = build(v, &n);
  path_of(path, name);
  write_bytes(path, f, n);
  free(f);
}

/* Loading `name` fails with `text` in the message. */
static void rejects(ral_runtime *rt, const char *name, const char *text, int line) {
  char path[256];
  path_of(path, name);
  disc_artifact *a = (disc_artifact *)1;
  ral_status s = disc_artifact_load(rt, path, &a);
  int ok = s != RAL_OK && a == NULL && strstr(disc_last_error(), text) && strstr(disc_last_error(), path);
  CHECK(ok);
  if (!ok) fprintf(stderr, "  line %d: %s: wanted \"%s\", got status %d \"%s\"\n", line, name, text, s, disc_last_error());
  disc_artifact_free(a);
}
#define REJECTS(rt, name, text) rejects(rt, name, text, __LINE__)

static void test_rejections(ral_runtime *rt) {
  variant good = {0};
  size_t n;
  uint8_t *f = build(&good, &n);
  char path[256];

  /* each damage in a file of its own, the rest of the file right */
  uint8_t *g = malloc(n + 1);
  memcpy(g, f, n);
  g[0] = 'X';
  path_of(path, "magic.disc");
  write_bytes(path, g, n);
  REJECTS(rt, "magic.disc", "bad magic");
  g[8] = 9; /* also a bad version: the magic is reported, it is checked first */
  write_bytes(path, g, n);
  REJECTS(rt, "magic.disc", "bad magic");
  path_of(path, "short.disc");
  write_bytes(path, f, 5);
  REJECTS(rt, "short.disc", "shorter than the magic");
  path_of(path, "empty.disc");
  write_bytes(path, f, 0);
  REJECTS(rt, "empty.disc", "bad magic");

  memcpy(g, f, n);
  put32(g + 8, 2);
  path_of(path, "version.disc");
  write_bytes(path, g, n);
  REJECTS(rt, "version.disc", "unsupported format version 2");
  write_bytes(path, g, n - 100); /* truncated as well: the version comes first */
  REJECTS(rt, "version.disc", "format version 2");

  path_of(path, "truncated.disc");
  write_bytes(path, f, n - 1000);
  REJECTS(rt, "truncated.disc", "truncated");
  write_bytes(path, f, 40);
  REJECTS(rt, "truncated.disc", "truncated");
  memcpy(g, f, n);
  g[n] = 0;
  path_of(path, "extended.disc");
  write_bytes(path, g, n + 1);
  REJECTS(rt, "extended.disc", "extended");

  memcpy(g, f, n);
  g[OBJECT_OFFSET + kernel_size / 2] ^= 0x10; /* a flipped bit in the object */
  path_of(path, "flipped.disc");
  write_bytes(path, g, n);
  REJECTS(rt, "flipped.disc", "corrupted");
  memcpy(g, f, n);
  g[100] ^= 1; /* in the header */
  write_bytes(path, g, n);
  REJECTS(rt, "flipped.disc", "corrupted");
  memcpy(g, f, n);
  g[40] ^= 1; /* in the stored checksum */
  write_bytes(path, g, n);
  REJECTS(rt, "flipped.disc", "corrupted");
  free(g);
  free(f);

  /* checks after the checksum, on files with a right checksum */
  write_variant("abi.disc", &(variant){.abi = RAL_ABI_VERSION + 7});
  REJECTS(rt, "abi.disc", "RAL ABI");
  write_variant("json.disc", &(variant){.header = "{\"entry\": \"disc_call_entry\",, }"});
  REJECTS(rt, "json.disc", "header: malformed JSON: expected a string key, saw ',' at byte 28");
  write_variant("notobject.disc", &(variant){.header = "[1]"});
  REJECTS(rt, "notobject.disc", "expected an object");
  write_variant("noinputs.disc", &(variant){.header = "{\"outputs\": []}"});
  REJECTS(rt, "noinputs.disc", "header: inputs is missing, expected an array");
  write_variant("badshape.disc", &(variant){.header = "{\"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"shape\": [-1]}]}"});
  REJECTS(rt, "badshape.disc", "inputs[0].shape[0] is negative");
  write_variant("baddtype.disc", &(variant){.header = "{\"inputs\": [{\"name\": \"x\", \"dtype\": \"f7\", \"shape\": []}]}"});
  REJECTS(rt, "baddtype.disc", "\"f7\" is not an element type");
  write_variant("section.disc", &(variant){.object_size = (long long)kernel_size + 1});
  REJECTS(rt, "section.disc", "run past the end of the file");
  write_variant("huge.disc", &(variant){.object_size = 0x7fffffffffffffffLL});
  REJECTS(rt, "huge.disc", "run past the end of the file");
  write_variant("target.disc", &(variant){.target = "cuda"});
  REJECTS(rt, "target.disc", "wrong target: the artifact was compiled for 'cuda'");
  write_variant("flag.disc", &(variant){.flag = "no_such_flag"});
  REJECTS(rt, "flag.disc", "needs the CPU flag 'no_such_flag'");
  REJECTS(rt, "does-not-exist.disc", "cannot open");
  REJECTS(rt, ".", "not a regular file");
}

/* ---- calls ---- */

static disc_artifact *load_good(ral_runtime *rt) {
  char path[256];
  path_of(path, "good.disc");
  disc_artifact *a = NULL;
  if (disc_artifact_load(rt, path, &a) != RAL_OK) fprintf(stderr, "  load: %s\n", disc_last_error());
  CHECK(a != NULL);
  return a;
}

/* Binds x = i * 100 + j and y[j] = (j, -j) at (b, s), runs, checks every output. */
static int run_and_check(disc_call *c, int64_t b, int64_t s, int64_t *calls_seen) {
  float *x = malloc(sizeof(float) * (size_t)(b * s + 1));
  int32_t *y = malloc(sizeof(int32_t) * (size_t)(2 * s + 1));
  for (int64_t i = 0; i < b; i++)
    for (int64_t j = 0; j < s; j++) x[i * s + j] = (float)(i * 100 + j);
  for (int64_t j = 0; j < s; j++) {
    y[2 * j] = (int32_t)j;
    y[2 * j + 1] = (int32_t)-j;
  }
  int64_t xs[2] = {b, s}, ys[2] = {s, 2};
  int ok = disc_call_bind_input(c, 0, x, DISC_F32, 2, xs, NULL) == RAL_OK &&
           disc_call_bind_input(c, 1, y, DISC_I32, 2, ys, NULL) == RAL_OK && disc_call_run(c) == RAL_OK;
  if (!ok) fprintf(stderr, "  run (%lld, %lld): %s\n", (long long)b, (long long)s, disc_last_error());
  free(x); /* the outputs are the call's own: none may point into the inputs */
  free(y);
  if (!ok) return 0;
  const void *out[6];
  int rank[6];
  const int64_t *shape[6];
  for (int k = 0; k < 6; k++) ok &= disc_call_output(c, k, &out[k], &rank[k], &shape[k]) == RAL_OK;
  if (!ok) return 0;
  ok &= rank[0] == 2 && shape[0][0] == b && shape[0][1] == s && rank[4] == 2 && shape[4][0] == s && shape[4][1] == b;
  ok &= rank[3] == 1 && shape[3][0] == 2 && rank[5] == 0;
  const float *r0 = out[0], *r1 = out[1], *r2 = out[2], *r3 = out[3], *r4 = out[4];
  ok &= (b * s == 0) == (r0 == NULL);
  for (int64_t i = 0; i < b && ok; i++)
    for (int64_t j = 0; j < s; j++) {
      float xv = (float)(i * 100 + j), r = xv + 10 + (float)j;
      ok &= r0[i * s + j] == r && r1[i * s + j] == xv && r2[i * s + j] == r && r4[j * b + i] == r;
    }
  ok &= r3[0] == 10 && r3[1] == 20;
  ok &= b * s == 0 || r0 != r2;
  if (calls_seen) *calls_seen = *(const int64_t *)out[5];
  return ok;
}

static void test_queries(disc_artifact *a) {
  CHECK(disc_artifact_num_inputs(a) == 2 && disc_artifact_num_outputs(a) == 6);
  const disc_tensor_spec *x = disc_artifact_input(a, 0), *y = disc_artifact_input(a, 1);
  CHECK(x && strcmp(x->name, "x") == 0 && x->dtype == DISC_F32 && strcmp(x->dtype_name, "f32") == 0 && x->rank == 2);
  CHECK(x && x->dims[0] == -1 && strcmp(x->dim_names[0], "b") == 0 && x->dims[1] == -1 &&
        strcmp(x->dim_names[1], "s") == 0);
  CHECK(y && y->dtype == DISC_I32 && y->dims[1] == 2 && y->dim_names[1] == NULL);
  const disc_tensor_spec *r5 = disc_artifact_output(a, 5);
  CHECK(r5 && r5->rank == 0 && r5->dtype == DISC_I64 && strcmp(r5->name, "r5") == 0);
  CHECK(disc_artifact_input(a, 2) == NULL && strstr(disc_last_error(), "out of range"));
  CHECK(disc_artifact_output(a, -1) == NULL);
  CHECK(disc_artifact_symbol(a, "disc_call_entry") != NULL);
  CHECK(disc_artifact_symbol(a, "no_such_symbol") == NULL);
  CHECK(disc_dtype_from_name("complex<f64>") == DISC_COMPLEX_F64 && disc_dtype_size(DISC_COMPLEX_F64) == 16);
  CHECK(disc_dtype_from_name("f8") == DISC_DTYPE_INVALID && disc_dtype_size(DISC_DTYPE_INVALID) == 0);
  CHECK(disc_dtype_size(DISC_I1) == 1 && strcmp(disc_dtype_name(DISC_BF16), "bf16") == 0);
}

static void test_calls(ral_runtime *rt) {
  disc_artifact *a = load_good(rt);
  if (!a) return;
  test_queries(a);
  disc_call *c;
  CHECK(disc_call_create(a, &c) == RAL_OK);
  CHECK_ERROR(disc_call_run(c), "input 'x' (0) is not bound");
  CHECK_ERROR(disc_call_output(c, 0, NULL, NULL, NULL), "no outputs");
  int64_t seen = 0;
  CHECK(run_and_check(c, 3, 5, &seen) && seen == 1);
  CHECK(run_and_check(c, 1, 2, &seen) && seen == 2); /* run again: the previous outputs are released */
  CHECK(run_and_check(c, 0, 4, &seen) && seen == 3); /* empty outputs */
  CHECK(run_and_check(c, 64, 64, &seen) && seen == 4);
  CHECK_ERROR(disc_call_output(c, 6, NULL, NULL, NULL), "output 6 out of range");

  /* what binding checks */
  float x[64] = {0};
  int32_t y[64] = {0};
  int64_t xs[2] = {4, 4}, ys[2] = {4, 2}, strides[2] = {1, 4}, unit[2] = {4, 1};
  CHECK_ERROR(disc_call_bind_input(c, 2, x, DISC_F32, 2, xs, NULL), "input 2 out of range");
  CHECK_ERROR(disc_call_bind_input(c, 0, x, DISC_F64, 2, xs, NULL), "input 'x' (0): expected element type f32 (f32[b, s]), got f64");
  CHECK_ERROR(disc_call_bind_input(c, 0, x, DISC_F32, 1, xs, NULL), "expected rank 2 (f32[b, s]), got rank 1");
  CHECK_ERROR(disc_call_bind_input(c, 1, y, DISC_I32, 2, (int64_t[]){4, 3}, NULL),
              "input 'y' (1) dim 1: expected size 2 (i32[s, 2]), got 3 (shape [4, 3])");
  CHECK_ERROR(disc_call_bind_input(c, 0, x, DISC_F32, 2, (int64_t[]){-1, 4}, NULL), "dim 0: negative size -1");
  CHECK_ERROR(disc_call_bind_input(c, 0, x, DISC_F32, 2, xs, strides), "not contiguous: dim 1 has stride 4");
  CHECK_ERROR(disc_call_bind_input(c, 0, NULL, DISC_F32, 2, xs, NULL), "data is NULL");
  CHECK(disc_call_bind_input(c, 0, x, DISC_F32, 2, xs, unit) == RAL_OK);
  CHECK(disc_call_bind_input(c, 0, x, DISC_F32, 2, (int64_t[]){1, 4}, (int64_t[]){99, 1}) == RAL_OK); /* size-1 dim */
  CHECK(disc_call_bind_input(c, 0, NULL, DISC_F32, 2, (int64_t[]){0, 4}, strides) == RAL_OK); /* empty */
  CHECK_ERROR(disc_call_run(c), "input 'y' (1) is not bound"); /* the failed binds left y unbound */

  /* a dimension variable with two values */
  CHECK(disc_call_bind_input(c, 0, x, DISC_F32, 2, xs, NULL) == RAL_OK);
  CHECK(disc_call_bind_input(c, 1, y, DISC_I32, 2, (int64_t[]){3, 2}, NULL) == RAL_OK);
  CHECK_ERROR(disc_call_run(c),
              "input 'y' (1) dim 0: dimension variable 's' is 4 from input 'x' (0) dim 1, but 3 here (shape [3, 2])");
  /* the guard: its messages with their values */
  CHECK(disc_call_bind_input(c, 0, x, DISC_F32, 2, (int64_t[]){4, 1}, NULL) == RAL_OK);
  CHECK(disc_call_bind_input(c, 1, y, DISC_I32, 2, (int64_t[]){1, 2}, NULL) == RAL_OK);
  CHECK_ERROR(disc_call_run(c), "s must be >= 2, got s = 1");
  float *big = calloc(4097 * 2, sizeof(float));
  int32_t *bigy = calloc(4097 * 2, sizeof(int32_t));
  CHECK(disc_call_bind_input(c, 0, big, DISC_F32, 2, (int64_t[]){2, 4097}, NULL) == RAL_OK);
  CHECK(disc_call_bind_input(c, 1, bigy, DISC_I32, 2, (int64_t[]){4097, 2}, NULL) == RAL_OK);
  CHECK_ERROR(disc_call_run(c), "b * s = 2 * 4097 must be <= 4096 ({2} {x} stays)");
  free(big);
  free(bigy);
  /* a failure inside the entry */
  y[0] = -7;
  CHECK(disc_call_bind_input(c, 0, x, DISC_F32, 2, xs, NULL) == RAL_OK);
  CHECK(disc_call_bind_input(c, 1, y, DISC_I32, 2, ys, NULL) == RAL_OK);
  CHECK_ERROR(disc_call_run(c), "out of memory allocating");
  CHECK_ERROR(disc_call_output(c, 0, NULL, NULL, NULL), "no outputs");
  CHECK(run_and_check(c, 2, 3, &seen) && seen == 5); /* and the call object still works */
  disc_call_free(c);
  ral_memory_stats st;
  ral_runtime_memory_stats(rt, &st);
  CHECK(st.bytes_in_use == 0); /* every output went back */
  disc_artifact_free(a);
}

/* Two loads of one file, one after the other, are two objects with state of their own (dlopen
 * must not hand the second load the first one's handle). */
static void test_two_loads(ral_runtime *rt) {
  disc_artifact *a = load_good(rt), *b = load_good(rt);
  if (!a || !b) return;
  CHECK(disc_artifact_symbol(a, "disc_call_entry") != disc_artifact_symbol(b, "disc_call_entry"));
  disc_call *ca, *cb;
  CHECK(disc_call_create(a, &ca) == RAL_OK && disc_call_create(b, &cb) == RAL_OK);
  int64_t seen = 0;
  for (int i = 0; i < 3; i++) CHECK(run_and_check(ca, 2, 2, &seen) && seen == i + 1);
  CHECK(run_and_check(cb, 2, 2, &seen) && seen == 1);
  disc_call_free(ca);
  disc_call_free(cb);
  disc_artifact_free(a);
  /* loads and frees in a row: each one fresh, no descriptor or file left behind */
  int fds_before = 0, fds_after = 0;
  DIR *d = opendir("/proc/self/fd");
  while (d && readdir(d)) fds_before++;
  if (d) closedir(d);
  for (int i = 0; i < 10; i++) {
    disc_artifact *c = load_good(rt);
    disc_call *cc;
    CHECK(c && disc_call_create(c, &cc) == RAL_OK);
    CHECK(run_and_check(cc, 2, 2, &seen) && seen == 1);
    disc_call_free(cc);
    disc_artifact_free(c);
  }
  d = opendir("/proc/self/fd");
  while (d && readdir(d)) fds_after++;
  if (d) closedir(d);
  CHECK(fds_before == fds_after);
  disc_artifact_free(b);
}

typedef struct {
  disc_artifact *a;
  int thread, ok;
} thread_arg;

static void *caller(void *p) {
  thread_arg *t = p;
  disc_call *c;
  t->ok = disc_call_create(t->a, &c) == RAL_OK;
  for (int i = 0; i < 30 && t->ok; i++) t->ok = run_and_check(c, 1 + (t->thread + i) % 7, 2 + (t->thread * 3 + i) % 40, NULL);
  disc_call_free(c);
  return NULL;
}

static void test_threads(ral_runtime *rt) {
  disc_artifact *a = load_good(rt);
  if (!a) return;
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){a, i, 0};
    pthread_create(&th[i], NULL, caller, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(args[i].ok);
  }
  disc_artifact_free(a);
}

static void remove_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[512];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(dir);
}

int main(void) {
  test_sha256();
  test_json_valid();
  test_json_malformed();
  kernel_so = read_file(DISC_TEST_KERNEL_PATH, &kernel_size);
  CHECK(kernel_so != NULL);
  snprintf(dir, sizeof dir, "/tmp/disc-test-artifact-XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  ral_runtime *rt = NULL;
  CHECK(ral_runtime_create(NULL, 4, &rt) == RAL_OK);
  if (kernel_so && rt) {
    write_variant("good.disc", &(variant){0});
    test_rejections(rt);
    test_calls(rt);
    test_two_loads(rt);
    test_threads(rt);
  }
  ral_runtime_destroy(rt);
  remove_dir();
  free(kernel_so);
  printf("test_artifact: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}

#endif
