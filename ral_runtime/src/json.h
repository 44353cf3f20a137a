/* A small JSON reader for the header of .disc artifacts. Internal to the RAL.
 *
 * disc_json_parse reads exactly `size` bytes (no terminating NUL needed, never reads past them)
 * into a tree that the caller frees with disc_json_free. It accepts RFC 8259 JSON: objects,
 * arrays, strings (escapes including \uXXXX and surrogate pairs, stored as UTF-8), numbers,
 * true, false and null; also NaN, Infinity and -Infinity, which Python's json module writes. Limits: nesting deeper than DISC_JSON_MAX_DEPTH and the escape \u0000
 * (strings are C strings) are rejected. Malformed input gives NULL and a message that names
 * the problem and its byte offset, line and column. */
#ifndef RAL_JSON_H
#define RAL_JSON_H

#include <stddef.h>
#include <stdint.h>

#define DISC_JSON_MAX_DEPTH 64

typedef enum {
  DISC_JSON_NULL,
  DISC_JSON_BOOL,
  DISC_JSON_INT,    /* a number without fraction or exponent that fits int64 */
  DISC_JSON_NUMBER, /* any other number */
  DISC_JSON_STRING,
  DISC_JSON_ARRAY,
  DISC_JSON_OBJECT,
} disc_json_kind;

typedef struct disc_json {
  disc_json_kind kind;
  int64_t integer;          /* INT, and BOOL (0 or 1) */
  double number;            /* INT and NUMBER */
  char *string;             /* STRING: NUL-terminated UTF-8 */
  size_t count;             /* STRING: bytes; ARRAY, OBJECT: items */
  struct disc_json *items;  /* ARRAY: elements; OBJECT: members, in file order */
  char *key;                /* a member of an object: its key; NULL otherwise */
} disc_json;

disc_json *disc_json_parse(const char *text, size_t size, char *error, size_t error_size);
void disc_json_free(disc_json *root);
/* The first member of `object` called `key`, or NULL (also when `object` is not an object). */
const disc_json *disc_json_get(const disc_json *object, const char *key);
/* "null", "a boolean", "an integer", ... for messages. */
const char *disc_json_kind_name(disc_json_kind kind);

#endif
