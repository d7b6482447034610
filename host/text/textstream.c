
#include <stdlib.h>

#include "host/text/stop.h"
#include "host/util/strbuf.h"

struct vki_text_stream {
    vki_detok *dt;
    stop_matcher *stops;
    bool stopped;
    int32_t which;     /* the stop string that matched (when stopped) */
    strbuf out;        /* vki_text_stream_finish's result */
};

vki_status vki_text_stream_create(const vki_tokenizer *tok, const char *const *stops, uint32_t n_stops, uint32_t flags,
                              vki_text_stream **out)
{
    *out = NULL;
    vki_text_stream *s = calloc(1, sizeof *s);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = vki_detok_create(tok, flags, &s->dt);
    if (st == VKI_OK)
        st = stop_create(stops, n_stops, &s->stops);
    if (st != VKI_OK) {
        vki_text_stream_free(s);
        return st;
    }
    *out = s;
    return VKI_OK;
}

void vki_text_stream_free(vki_text_stream *s)
{
    if (!s)
        return;
    vki_detok_free(s->dt);
    stop_destroy(s->stops);
    strbuf_free(&s->out);
    free(s);
}

vki_status vki_text_stream_push(vki_text_stream *s, int32_t token, const char **emit, size_t *n_emit, bool *stopped)
{
    *emit = "";
    *n_emit = 0;
    *stopped = s->stopped;
    if (s->stopped)
        return VKI_OK;
    const char *text;
    size_t len;
    vki_status st = vki_detok_push(s->dt, token, &text, &len);
    if (st != VKI_OK)
        return st;
    stop_result r;
    if ((st = stop_feed(s->stops, text, len, &r)) != VKI_OK)
        return st;
    *emit = r.emit;
    *n_emit = r.n_emit;
    *stopped = s->stopped = r.matched;
    if (r.matched)
        s->which = (int32_t)r.which;
    return VKI_OK;
}

/* Appends n bytes to s->out. */
static vki_status out_append(vki_text_stream *s, const char *p, size_t n)
{
    return strbuf_put(&s->out, p, n) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
}

vki_status vki_text_stream_finish(vki_text_stream *s, const char **emit, size_t *n_emit)
{
    *emit = "";
    *n_emit = 0;
    if (s->stopped)
        return VKI_OK;
    const char *text;
    size_t len;
    vki_status st = vki_detok_flush(s->dt, &text, &len);
    stop_result r = {0};
    strbuf_clear(&s->out);
    if (st == VKI_OK && len)
        st = stop_feed(s->stops, text, len, &r);
    if (st == VKI_OK)
        st = out_append(s, r.emit, r.n_emit); /* copied: the flush below reuses the matcher's buffer */
    if (st != VKI_OK)
        return st;
    if (r.matched) { /* the flushed bytes completed a stop string */
        s->stopped = true;
        s->which = (int32_t)r.which;
    } else {
        stop_flush(s->stops, &r);
        if ((st = out_append(s, r.emit, r.n_emit)) != VKI_OK)
            return st;
    }
    *emit = s->out.p;
    *n_emit = s->out.len;
    return VKI_OK;
}

bool vki_text_stream_stopped(const vki_text_stream *s) { return s->stopped; }

int32_t vki_text_stream_stop_index(const vki_text_stream *s) { return s->stopped ? s->which : -1; }
