/* Incremental stop-string matcher (see stop.h for the contract and the cost). */
#include "host/text/stop.h"

#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    char **stops;     /* [n] copies */
    size_t *len;      /* [n] byte lengths, > 0 */
    uint32_t n;
    size_t longest;   /* max len */
    char *buf;        /* bytes not yet released: buf[0 .. n_buf) */
    size_t n_buf, cap;
    size_t released;  /* leading bytes of buf handed out by the last call, dropped by the next */
    bool matched;
    uint32_t which;
};

vki_status stop_create(const char *const *stops, uint32_t n, stop_matcher **out)
{
    *out = NULL;
    for (uint32_t i = 0; i < n; i++)
        if (!stops || !stops[i] || !stops[i][0])
            return VKI_ERR_INVALID_ARG; /* stop string i is NULL or empty */
    stop_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    m->stops = calloc(n ? n : 1, sizeof *m->stops);
    m->len = calloc(n ? n : 1, sizeof *m->len);
    if (!m->stops || !m->len) {
        stop_destroy(m);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++, m->n++) {
        m->len[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->len[i]);
        if (!m->stops[i]) {
            stop_destroy(m);
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        }
        memcpy(m->stops[i], stops[i], m->len[i]);
        if (m->len[i] > m->longest)
            m->longest = m->len[i];
    }
    *out = m;
    return VKI_OK;
}

void stop_destroy(stop_matcher *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < m->n; i++)
        free(m->stops[i]);
    free(m->stops);
    free(m->len);
    free(m->buf);
    free(m);
}

size_t stop_held(const stop_matcher *m) { return m->n_buf - m->released; }

static void drop_released(stop_matcher *m)
{
    if (!m->released)
        return;
    memmove(m->buf, m->buf + m->released, m->n_buf - m->released);
    m->n_buf -= m->released;
    m->released = 0;
}

/* Length of b[0 .. n) without an incomplete UTF-8 sequence at its end. */
static size_t utf8_complete(const char *b, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)b[n - back];
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return back < need ? n - back : n;
    }
    return n; /* no lead byte in the last 4: invalid input, pass it through */
}

/* The match that ends first, then starts first: *start and the stop index; false if none.
 * O(n_buf * total stop bytes). */
static bool find_match(const stop_matcher *m, size_t *start, uint32_t *which)
{
    size_t best_end = (size_t)-1;
    for (uint32_t s = 0; s < m->n; s++) {
        size_t l = m->len[s];
        for (size_t i = 0; i + l <= m->n_buf && i + l <= best_end; i++) {
            if (memcmp(m->buf + i, m->stops[s], l))
                continue;
            if (i + l < best_end || i < *start) {
                best_end = i + l;
                *start = i;
                *which = s;
            }
            break; /* the first occurrence of s ends first */
        }
    }
    return best_end != (size_t)-1;
}

/* First position from which the rest of buf is a proper prefix of some stop string (n_buf if
 * none): everything before it can never become part of a match. Only the last longest - 1
 * positions can be. */
static size_t first_live(const stop_matcher *m)
{
    size_t i0 = m->n_buf >= m->longest ? m->n_buf - m->longest + 1 : 0;
    for (size_t i = i0; i < m->n_buf; i++) {
        size_t rest = m->n_buf - i;
        for (uint32_t s = 0; s < m->n; s++)
            if (rest < m->len[s] && !memcmp(m->buf + i, m->stops[s], rest))
                return i;
    }
    return m->n_buf;
}

vki_status stop_feed(stop_matcher *m, const char *text, size_t n, stop_result *res)
{
    if (!m->matched && m->n_buf - m->released + n > m->cap) {
        size_t cap = 2 * (m->n_buf - m->released + n) + 16;
        char *nb = malloc(cap);
        if (!nb)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        if (m->n_buf > m->released)
            memcpy(nb, m->buf + m->released, m->n_buf - m->released);
        free(m->buf);
        m->buf = nb;
        m->cap = cap;
        m->n_buf -= m->released;
        m->released = 0;
    }
    drop_released(m);
    *res = (stop_result){m->buf ? m->buf : "", 0, m->matched, m->which};
    if (m->matched)
        return VKI_OK;
    if (n)
        memcpy(m->buf + m->n_buf, text, n);
    m->n_buf += n;
    size_t start = 0;
    if (find_match(m, &start, &m->which)) {
        m->matched = true;
        m->n_buf = m->released = start; /* the stop string and what follows are dropped */
        *res = (stop_result){m->buf ? m->buf : "", start, true, m->which};
        return VKI_OK;
    }
    size_t live = first_live(m), whole = utf8_complete(m->buf, m->n_buf);
    m->released = live < whole ? live : whole;
    res->n_emit = m->released;
    return VKI_OK;
}

void stop_flush(stop_matcher *m, stop_result *res)
{
    drop_released(m);
    *res = (stop_result){m->buf ? m->buf : "", m->matched ? 0 : m->n_buf, m->matched, m->which};
    m->released = res->n_emit;
}
