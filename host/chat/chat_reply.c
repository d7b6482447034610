#include "host/chat/chat_reply.h"

#include <string.h>

vki_status chat_reply_init(chat_reply *r, const vki_tokenizer *tok, const chat_template *t, const chat_prompt *p,
                           const char *const *stops, size_t n_stops, uint32_t flags)
{
    memset(r, 0, sizeof *r);
    r->tok = tok;
    r->harmony = t && t->family == CHAT_HARMONY;
    if (r->harmony) {
        static const char gen[] = "<|start|>assistant";
        chat_span all = {0, sizeof gen - 1};
        chat_prompt plain = {.text = (char *)gen, .len = sizeof gen - 1, .tmpl = &all, .n_tmpl = 1};
        chat_harmony_init(&r->h, false);
        chat_harmony_prime(&r->h, p ? p : &plain);
        flags |= VKI_DETOK_SPECIAL; /* the splitter reads the markers */
    }
    return vki_text_stream_create(tok, stops, n_stops, flags, &r->ts);
}

/* The text stream's piece into the answer, or through the splitter. */
static vki_status take(chat_reply *r, const char *t, size_t n, bool end)
{
    if (!r->harmony)
        return strbuf_put(&r->answer, t, n) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    return chat_harmony_feed(&r->h, t, n, end, &r->reasoning, &r->answer) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
}

vki_status chat_reply_push(chat_reply *r, int32_t token, bool *stopped)
{
    strbuf_clear(&r->reasoning);
    strbuf_clear(&r->answer);
    *stopped = false;
    if (r->harmony && vki_token_is_eog(r->tok, token)) /* "<|return|>", "<|call|>": not text */
        return VKI_OK;
    const char *t = "";
    size_t n = 0;
    vki_status st = vki_text_stream_push(r->ts, token, &t, &n, stopped);
    return st == VKI_OK ? take(r, t, n, false) : st;
}

vki_status chat_reply_finish(chat_reply *r)
{
    strbuf_clear(&r->reasoning);
    strbuf_clear(&r->answer);
    const char *t = "";
    size_t n = 0;
    vki_status st = vki_text_stream_finish(r->ts, &t, &n);
    return st == VKI_OK ? take(r, t, n, true) : st;
}

void chat_reply_free(chat_reply *r)
{
    vki_text_stream_free(r->ts);
    strbuf_free(&r->reasoning);
    strbuf_free(&r->answer);
    memset(r, 0, sizeof *r);
}
