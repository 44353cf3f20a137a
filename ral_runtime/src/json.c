/* The JSON reader of json.h: a recursive-descent parser over a bounded buffer. */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *text;
  size_t size, pos;
  int depth;
  char *error;
  size_t error_size;
  int failed;
} parser;

/* Records the first error with where it happened (line and column counted from 1). */
static void fail(parser *p, const char *fmt, ...) {
  if (p->failed) return;
  p->failed = 1;
  if (!p->error || !p->error_size) return;
  size_t line = 1, col = 1;
  for (size_t i = 0; i < p->pos && i < p->size; i++) {
    if (p->text[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(p->error, p->error_size, "malformed JSON: %s at byte %zu (line %zu, column %zu)", what, p->pos, line,
           col);
}

static int at_end(const parser *p) { return p->pos >= p->size; }
static char peek(const parser *p) { return at_end(p) ? '\0' : p->text[p->pos]; }

static void skip_space(parser *p) {
  while (!at_end(p) && (peek(p) == ' ' || peek(p) == '\t' || peek(p) == '\n' || peek(p) == '\r')) p->pos++;
}

/* describes the character at the current position for messages */
static const char *seen(const parser *p, char *buf, size_t n) {
  if (at_end(p)) return "the end of the text";
  unsigned char c = (unsigned char)peek(p);
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, n, "'%c'", c);
  else
    snprintf(buf, n, "byte 0x%02x", c);
  return buf;
}

static int parse_value(parser *p, disc_json *out);

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->size - p->pos < n || memcmp(p->text + p->pos, word, n) != 0) {
    fail(p, "invalid literal (expected %s)", word);
    return 0;
  }
  p->pos += n;
  return 1;
}

static int hex4(parser *p, unsigned *out) {
  if (p->size - p->pos < 4) {
    fail(p, "\\u escape needs 4 hex digits");
    return 0;
  }
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->text[p->pos + i];
    unsigned d;
    if (c >= '0' && c <= '9')
      d = (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = (unsigned)(c - 'A' + 10);
    else {
      fail(p, "\\u escape needs 4 hex digits");
      return 0;
    }
    v = v * 16 + d;
  }
  p->pos += 4;
  *out = v;
  return 1;
}

/* Reads a string (the position is at its opening quote) into a new NUL-terminated buffer. The
 * decoded text is never longer than the source (an escape of n bytes yields at most n bytes of
 * UTF-8), so one allocation of the source's length is enough. */
static char *parse_string(parser *p, size_t *length) {
  p->pos++; /* the quote */
  size_t start = p->pos, end = start;
  while (end < p->size && p->text[end] != '"') end += p->text[end] == '\\' ? 2 : 1;
  if (end >= p->size) {
    fail(p, "unterminated string");
    return NULL;
  }
  char *s = malloc(end - start + 1);
  if (!s) {
    fail(p, "out of memory");
    return NULL;
  }
  size_t n = 0;
  while (p->pos < end) {
    unsigned char c = (unsigned char)p->text[p->pos];
    if (c < 0x20) {
      fail(p, "control character 0x%02x in a string (must be escaped)", c);
      free(s);
      return NULL;
    }
    if (c != '\\') {
      s[n++] = (char)c;
      p->pos++;
      continue;
    }
    p->pos++;
    char e = p->text[p->pos++];
    switch (e) {
      case '"': s[n++] = '"'; break;
      case '\\': s[n++] = '\\'; break;
      case '/': s[n++] = '/'; break;
      case 'b': s[n++] = '\b'; break;
      case 'f': s[n++] = '\f'; break;
      case 'n': s[n++] = '\n'; break;
      case 'r': s[n++] = '\r'; break;
      case 't': s[n++] = '\t'; break;
      case 'u': {
        unsigned cp;
        if (!hex4(p, &cp)) {
          free(s);
          return NULL;
        }
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
          fail(p, "unpaired low surrogate \\u%04X", cp);
          free(s);
          return NULL;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate: a low one must follow */
          unsigned lo;
          if (p->size - p->pos < 2 || p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u') {
            fail(p, "high surrogate \\u%04X without a low surrogate", cp);
            free(s);
            return NULL;
          }
          p->pos += 2;
          if (!hex4(p, &lo)) {
            free(s);
            return NULL;
          }
          if (lo < 0xDC00 || lo > 0xDFFF) {
            fail(p, "high surrogate \\u%04X followed by \\u%04X, not a low surrogate", cp, lo);
            free(s);
            return NULL;
          }
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) {
          fail(p, "\\u0000 in a string is not supported");
          free(s);
          return NULL;
        }
        if (cp < 0x80) {
          s[n++] = (char)cp;
        } else if (cp < 0x800) {
          s[n++] = (char)(0xC0 | (cp >> 6));
          s[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          s[n++] = (char)(0xE0 | (cp >> 12));
          s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
          s[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
          s[n++] = (char)(0xF0 | (cp >> 18));
          s[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
          s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
          s[n++] = (char)(0x80 | (cp & 0x3F));
        }
        break;
      }
      default: {
        char buf[16];
        p->pos--;
        fail(p, "invalid escape: a backslash before %s", seen(p, buf, sizeof buf));
        free(s);
        return NULL;
      }
    }
  }
  p->pos = end + 1; /* the closing quote */
  s[n] = '\0';
  *length = n;
  return s;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, disc_json *out) {
  size_t start = p->pos;
  int negative = 0, integral = 1;
  if (peek(p) == '-') {
    negative = 1;
    p->pos++;
  }
  if (!is_digit(peek(p))) {
    fail(p, "expected a digit");
    return 0;
  }
  if (peek(p) == '0') {
    p->pos++;
    if (is_digit(peek(p))) {
      fail(p, "number with a leading zero");
      return 0;
    }
  } else {
    while (is_digit(peek(p))) p->pos++;
  }
  if (peek(p) == '.') {
    integral = 0;
    p->pos++;
    if (!is_digit(peek(p))) {
      fail(p, "expected a digit after '.'");
      return 0;
    }
    while (is_digit(peek(p))) p->pos++;
  }
  if (peek(p) == 'e' || peek(p) == 'E') {
    integral = 0;
    p->pos++;
    if (peek(p) == '+' || peek(p) == '-') p->pos++;
    if (!is_digit(peek(p))) {
      fail(p, "expected a digit in the exponent");
      return 0;
    }
    while (is_digit(peek(p))) p->pos++;
  }
  size_t len = p->pos - start;
  if (integral) { /* exact int64, accumulated negatively so INT64_MIN fits */
    int64_t v = 0;
    int overflow = 0;
    for (size_t i = start + (size_t)negative; i < p->pos; i++) {
      int d = p->text[i] - '0';
      if (v < (INT64_MIN + d) / 10) {
        overflow = 1;
        break;
      }
      v = v * 10 - d;
    }
    if (!overflow && (negative || v != INT64_MIN)) {
      out->kind = DISC_JSON_INT;
      out->integer = negative ? v : -v;
      out->number = (double)out->integer;
      return 1;
    }
  }
  char buf[128]; /* strtod needs a terminated copy */
  if (len >= sizeof buf) {
    p->pos = start;
    fail(p, "number longer than %zu characters", sizeof buf - 1);
    return 0;
  }
  memcpy(buf, p->text + start, len);
  buf[len] = '\0';
  out->kind = DISC_JSON_NUMBER;
  out->number = strtod(buf, NULL);
  return 1;
}

/* Appends a zeroed item to a growing array of items. */
static disc_json *push_item(parser *p, disc_json *parent, size_t *cap) {
  if (parent->count == *cap) {
    size_t grown = *cap ? 2 * *cap : 4;
    disc_json *items = realloc(parent->items, grown * sizeof(disc_json));
    if (!items) {
      fail(p, "out of memory");
      return NULL;
    }
    parent->items = items;
    *cap = grown;
  }
  disc_json *item = &parent->items[parent->count++];
  memset(item, 0, sizeof *item);
  return item;
}

static int parse_container(parser *p, disc_json *out, int is_object) {
  char close = is_object ? '}' : ']', buf[16];
  out->kind = is_object ? DISC_JSON_OBJECT : DISC_JSON_ARRAY;
  if (++p->depth > DISC_JSON_MAX_DEPTH) {
    fail(p, "nesting deeper than %d", DISC_JSON_MAX_DEPTH);
    return 0;
  }
  p->pos++; /* the opening bracket */
  size_t cap = 0;
  skip_space(p);
  if (peek(p) == close) {
    p->pos++;
    p->depth--;
    return 1;
  }
  for (;;) {
    skip_space(p);
    disc_json *item = push_item(p, out, &cap);
    if (!item) return 0;
    if (is_object) {
      if (peek(p) != '"') {
        fail(p, "expected a string key, saw %s", seen(p, buf, sizeof buf));
        return 0;
      }
      size_t n;
      item->key = parse_string(p, &n);
      if (!item->key) return 0;
      skip_space(p);
      if (peek(p) != ':') {
        fail(p, "expected ':' after the key \"%s\", saw %s", item->key, seen(p, buf, sizeof buf));
        return 0;
      }
      p->pos++;
      skip_space(p);
    }
    if (!parse_value(p, item)) return 0;
    skip_space(p);
    if (peek(p) == ',') {
      p->pos++;
      continue;
    }
    if (peek(p) == close) {
      p->pos++;
      p->depth--;
      return 1;
    }
    fail(p, "expected ',' or '%c' in %s, saw %s", close, is_object ? "an object" : "an array",
         seen(p, buf, sizeof buf));
    return 0;
  }
}

static int parse_value(parser *p, disc_json *out) {
  char buf[16];
  switch (peek(p)) {
    case '{': return parse_container(p, out, 1);
    case '[': return parse_container(p, out, 0);
    case '"':
      out->kind = DISC_JSON_STRING;
      out->string = parse_string(p, &out->count);
      return out->string != NULL;
    case 't':
      out->kind = DISC_JSON_BOOL;
      out->integer = 1;
      return literal(p, "true");
    case 'f':
      out->kind = DISC_JSON_BOOL;
      return literal(p, "false");
    case 'n':
      out->kind = DISC_JSON_NULL;
      return literal(p, "null");
    case 'N': /* NaN and the infinities are not JSON, but Python's json module writes them */
      out->kind = DISC_JSON_NUMBER;
      out->number = NAN;
      return literal(p, "NaN");
    case 'I':
      out->kind = DISC_JSON_NUMBER;
      out->number = INFINITY;
      return literal(p, "Infinity");
    default:
      if (p->size - p->pos >= 2 && p->text[p->pos] == '-' && p->text[p->pos + 1] == 'I') {
        p->pos++;
        out->kind = DISC_JSON_NUMBER;
        out->number = -INFINITY;
        return literal(p, "Infinity");
      }
      if (peek(p) == '-' || is_digit(peek(p))) return parse_number(p, out);
      fail(p, "expected a value, saw %s", seen(p, buf, sizeof buf));
      return 0;
  }
}

static void free_items(disc_json *v) {
  for (size_t i = 0; v->items && i < v->count; i++) free_items(&v->items[i]);
  if (v->kind == DISC_JSON_ARRAY || v->kind == DISC_JSON_OBJECT) free(v->items);
  free(v->string);
  free(v->key);
}

disc_json *disc_json_parse(const char *text, size_t size, char *error, size_t error_size) {
  if (error && error_size) error[0] = '\0';
  parser p = {.text = text, .size = size, .error = error, .error_size = error_size};
  disc_json *root = calloc(1, sizeof *root);
  if (!root) {
    if (error && error_size) snprintf(error, error_size, "out of memory reading JSON");
    return NULL;
  }
  skip_space(&p);
  int ok = parse_value(&p, root);
  if (ok) {
    skip_space(&p);
    if (!at_end(&p)) {
      char buf[16];
      fail(&p, "unexpected %s after the value", seen(&p, buf, sizeof buf));
      ok = 0;
    }
  }
  if (!ok) {
    disc_json_free(root);
    return NULL;
  }
  return root;
}

void disc_json_free(disc_json *root) {
  if (!root) return;
  free_items(root);
  free(root);
}

const disc_json *disc_json_get(const disc_json *object, const char *key) {
  if (!object || object->kind != DISC_JSON_OBJECT) return NULL;
  for (size_t i = 0; i < object->count; i++)
    if (strcmp(object->items[i].key, key) == 0) return &object->items[i];
  return NULL;
}

const char *disc_json_kind_name(disc_json_kind kind) {
  switch (kind) {
    case DISC_JSON_NULL: return "null";
    case DISC_JSON_BOOL: return "a boolean";
    case DISC_JSON_INT: return "an integer";
    case DISC_JSON_NUMBER: return "a number";
    case DISC_JSON_STRING: return "a string";
    case DISC_JSON_ARRAY: return "an array";
    case DISC_JSON_OBJECT: return "an object";
  }
  return "?";
}
