#include "host/chat/chat_reply.h"

#include <string.h>

vki_status chat_reply_init(chat_reply *r, const vki_tokenizer *tok, const chat_template *t, const chat_prompt *p,
                           const char *const *stops, size_t n_stops, uint32_t flags)
{
    memset(r, 0, sizeof *r);
    r->tok = tok;
    r->harmony = t && t->family == CHAT_HARMONY;
    r->cohere = t && t->family == CHAT_COMMAND_R && t->command_r7b;
    if (r->cohere)
        flags |= VKI_DETOK_SPECIAL; /* the splitter reads the markers */
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

/* Command R7B's markers (each one control token); none is a prefix of another. */
static const char *const COHERE_MARK[4] = {"<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>",
                                           "<|END_RESPONSE|>"};

/* The marker hold[0, n) is (0-3), -1 while it may still become one, -2 when it cannot. */
static int cohere_marker(const char *hold, size_t n)
{
    int k = -2;
    for (int m = 0; m < 4; m++) {
        size_t len = strlen(COHERE_MARK[m]);
        if (n <= len && !memcmp(hold, COHERE_MARK[m], n))
            k = n == len ? m : -1;
    }
    return k;
}

bool chat_cohere_feed(chat_cohere *s, const char *p, size_t n, bool end, strbuf *r, strbuf *c)
{
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        s->hold[s->n_hold++] = p[i];
        int k = -1;
        while (s->n_hold && (k = cohere_marker(s->hold, s->n_hold)) == -2 && ok) { /* not a marker: text */
            ok = strbuf_put(s->thinking ? r : c, s->hold, 1);
            memmove(s->hold, s->hold + 1, --s->n_hold);
        }
        if (s->n_hold && k >= 0) { /* START_THINKING opens the reasoning, the others close it */
            s->thinking = k == 0;
            s->n_hold = 0;
        }
    }
    if (end && ok && s->n_hold)
        ok = strbuf_put(s->thinking ? r : c, s->hold, s->n_hold);
    if (end)
        s->n_hold = 0;
    return ok;
}

/* The text stream's piece into the answer, or through the splitter. */
static vki_status take(chat_reply *r, const char *t, size_t n, bool end)
{
    bool ok = r->harmony ? chat_harmony_feed(&r->h, t, n, end, &r->reasoning, &r->answer)
              : r->cohere ? chat_cohere_feed(&r->co, t, n, end, &r->reasoning, &r->answer)
                          : strbuf_put(&r->answer, t, n);
    return ok ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
}

vki_status chat_reply_push(chat_reply *r, int32_t token, bool *stopped)
{
    strbuf_clear(&r->reasoning);
    strbuf_clear(&r->answer);
    *stopped = false;
    /* "<|return|>", "<|call|>", Command R7B's "<|END_OF_TURN_TOKEN|>": not text */
    if ((r->harmony || r->cohere) && vki_token_is_eog(r->tok, token))
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
