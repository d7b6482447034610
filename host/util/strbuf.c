#include "host/util/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool strbuf_put(strbuf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 4 - b->len) /* keeps (len + n + 1) * 2 below SIZE_MAX */
        return false;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool strbuf_reserve(strbuf *b, size_t more)
{
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t len = b->len;
    if (!strbuf_put(b, NULL, 0) || more > SIZE_MAX / 4 - len)
        return false;
    size_t cap = (len + more + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool strbuf_printf(strbuf *b, const char *fmt, ...)
{
    char small[512]; /* most lines fit: one vsnprintf, no malloc */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if ((size_t)n < sizeof small)
        return strbuf_put(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return false;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bool ok = strbuf_put(b, big, (size_t)n);
    free(big);
    return ok;
}

void strbuf_clear(strbuf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
}

void strbuf_free(strbuf *b)
{
    free(b->p);
    *b = (strbuf){0};
}
