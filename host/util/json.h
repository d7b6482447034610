/* A small JSON reader and writer for the library's own needs (JSON Schema to grammar, tool
 * definitions and tool calls): libvkinfer does not link a JSON library.
 *
 * json_parse builds a read-only tree in one arena (json_free releases it at once). Object members
 * keep their order (a schema's property order is the order the grammar writes them) and a
 * duplicate key is an error. Strings are decoded to UTF-8 (they may hold NUL bytes: use the
 * lengths); numbers keep their source text next to the double. Every value remembers its byte
 * offset in the source, so callers can point at the place that is wrong. Depth is limited
 * (JSON_MAX_DEPTH) so hostile input cannot exhaust the stack. O(input) time and memory. */
#ifndef VKI_HOST_JSON_H
#define VKI_HOST_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "host/util/strbuf.h"
#include "vkinfer.h"

#define JSON_MAX_DEPTH 256

typedef enum json_type {
    JSON_NULL = 0,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_member json_member;
typedef struct json_value json_value;

struct json_value {
    json_type type;
    size_t off;                   /* byte offset of the value's first character in the source */
    const char *s;                /* STRING: decoded bytes [len], NUL-terminated;
                                     NUMBER: the source text [len] */
    size_t len;
    double num;                   /* NUMBER */
    const json_value *items;      /* ARRAY: [n] */
    const json_member *members;   /* OBJECT: [n], in source order, keys distinct */
    size_t n;
};

struct json_member {
    const char *key;              /* decoded, NUL-terminated, [key_len] bytes */
    size_t key_len;
    json_value value;
};

typedef struct json_doc json_doc;

/* Parses text[0, len) (one value, surrounding whitespace allowed). VKI_ERR_INVALID_ARG with
 * err = "at byte N: what was expected" for malformed input, VKI_ERR_OUT_OF_HOST_MEMORY. */
vki_status json_parse(const char *text, size_t len, json_doc **out, char *err, size_t n_err);
const json_value *json_root(const json_doc *d);
void json_free(json_doc *d); /* NULL is fine */

/* The member `key` of an object, or NULL (absent, or v is not an object). O(members). */
const json_value *json_get(const json_value *v, const char *key);
bool json_is_str(const json_value *v, const char *s); /* a string equal to s */
/* Deep equality (numbers by value, objects regardless of member order). */
bool json_equal(const json_value *a, const json_value *b);

/* The value of a hexadecimal digit, -1 for anything else (also the GBNF parser's escapes). */
int json_hexval(char c);

/* Writers append to b and return false when it could not grow. The spacing is Python's
 * json.dumps default (", " and ": "), which chat templates reproduce with `| tojson`; strings
 * escape '"', '\\' and control characters only (ensure_ascii=False); numbers are written as
 * their source text. */
bool json_write(strbuf *b, const json_value *v);
bool json_write_str(strbuf *b, const char *s, size_t n);
/* The same with Python's indent=N layout (tojson(indent=4)): one member per line. */
bool json_write_indent(strbuf *b, const json_value *v, int indent);

#endif
