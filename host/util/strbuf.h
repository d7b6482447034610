/* A growable byte string: the one append buffer of the HTTP server (request bodies, SSE bytes,
 * metrics text), the chat renderer, the text stream and the load generator. */
#ifndef VKI_HOST_STRBUF_H
#define VKI_HOST_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/* Zero-initialise to start. Once anything was put, p[len] == 0, so p is a C string when the
 * bytes hold no NUL. Capacity doubles: appending is amortised O(1) a byte. */
typedef struct strbuf {
    char *p;      /* [cap] bytes; NULL until the first put */
    size_t len;   /* bytes written, the terminating NUL not counted */
    size_t cap;
} strbuf;

/* Appends n bytes of s (s may be NULL when n is 0; a put of 0 bytes still allocates, so p is a
 * valid "" afterwards). false on size overflow or out of memory, b unchanged. */
bool strbuf_put(strbuf *b, const char *s, size_t n);
bool strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Makes room for `more` bytes after len (for a reader writing into p + len directly: at most
 * cap - len - 1 bytes, then len += n and p[len] = 0). false on overflow or out of memory. */
bool strbuf_reserve(strbuf *b, size_t more);
/* Empties b and keeps its memory for the next puts. */
void strbuf_clear(strbuf *b);
/* Releases the memory; b is an empty buffer again. */
void strbuf_free(strbuf *b);

#endif
