/* The public chat-template API (vkinfer.h, "chat templates") over the renderer of chat.c: a
 * recognised family, its token texts and the vocabulary's control tokens, kept together so that
 * rendering and tokenising a conversation costs O(its length), not O(vocabulary). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/chat/chat.h"
#include "host/chat/chat_reply.h"
#include "vkinfer.h"

struct vki_chat_template {
    const vki_tokenizer *tok;
    chat_template t;
    chat_specials *specials;        /* control tokens of tok, for chat_tokenize */
};

vki_status vki_chat_template_create(const vki_tokenizer *tok, const char *tmpl, vki_chat_template **out)
{
    if (!tok || !out)
        return VKI_ERR_INVALID_ARG;
    *out = NULL;
    chat_family f = CHAT_PLAIN;
    const char *src = tmpl;
    bool known = false;
    if (!tmpl)
        src = vki_tokenizer_chat_template(tok);
    if (tmpl && chat_family_parse(tmpl, &f))
        src = NULL; /* a family by name: its canonical form */
    else
        f = chat_detect(src, &known);
    vki_chat_template *c = calloc(1, sizeof *c);
    if (!c)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    c->tok = tok;
    char bos[64], eos[64];
    chat_token_texts(tok, bos, sizeof bos, eos, sizeof eos);
    vki_status st = chat_template_init(&c->t, f, src, bos, eos);
    if (st == VKI_OK)
        st = chat_specials_create(tok, &c->specials);
    if (st != VKI_OK) {
        vki_chat_template_free(c);
        return st;
    }
    *out = c;
    return VKI_OK;
}

void vki_chat_template_free(vki_chat_template *c)
{
    if (!c)
        return;
    chat_specials_free(c->specials);
    chat_template_free(&c->t);
    free(c);
}

const char *vki_chat_template_name(const vki_chat_template *c) { return chat_family_name(c->t.family); }

const chat_template *chat_api_template(const vki_chat_template *c) { return &c->t; }

/* msgs -> the renderer's messages, then rendered. Names the bad message in err. The output
 * checks of both public calls too: n_out required (zeroed), a buffer unless cap is 0. */
static vki_status render(const vki_chat_template *c, const vki_chat_message *msgs, size_t n, bool add_gen,
                         bool buf_ok, size_t *n_out, chat_prompt *out, char *err, size_t err_len)
{
    if (!n_out || !buf_ok)
        return VKI_ERR_INVALID_ARG;
    *n_out = 0;
    if (!c || (n && !msgs)) {
        if (err && err_len)
            snprintf(err, err_len, "%s", c ? "msgs: NULL" : "no chat template");
        return VKI_ERR_INVALID_ARG;
    }
    chat_msg *m = calloc(n ? n : 1, sizeof *m);
    if (!m)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)msgs[i].role > VKI_CHAT_ASSISTANT || !msgs[i].content) {
            if (err && err_len)
                snprintf(err, err_len, "messages[%zu]: %s", i, msgs[i].content ? "unknown role" : "content is NULL");
            free(m);
            return VKI_ERR_INVALID_ARG;
        }
        static const chat_role roles[] = {CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT};
        m[i] = (chat_msg){.role = roles[msgs[i].role], .content = msgs[i].content, .len = strlen(msgs[i].content)};
    }
    vki_status st = chat_render(&c->t, m, n, add_gen, out, err, err_len);
    free(m);
    return st;
}

vki_status vki_chat_apply(const vki_chat_template *c, const vki_chat_message *msgs, size_t n, bool add_gen, char *buf,
                          size_t cap, size_t *n_out, char *err, size_t err_len)
{
    chat_prompt p;
    vki_status st = render(c, msgs, n, add_gen, !cap || buf, n_out, &p, err, err_len);
    if (st != VKI_OK)
        return st;
    *n_out = p.len;
    if (p.len < cap)
        memcpy(buf, p.text, p.len + 1);
    else
        st = VKI_ERR_INVALID_ARG;
    chat_prompt_free(&p);
    return st;
}

vki_status vki_chat_tokenize(const vki_chat_template *c, const vki_chat_message *msgs, size_t n, bool add_gen,
                             int32_t *out, size_t cap, size_t *n_out, char *err, size_t err_len)
{
    chat_prompt p;
    vki_status st = render(c, msgs, n, add_gen, !cap || out, n_out, &p, err, err_len);
    if (st != VKI_OK)
        return st;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    /* the families write BOS themselves where their upstream template does; the fallback adds it
     * as the tokenizer would */
    bool add_bos = c->t.family == CHAT_PLAIN && vki_tokenizer_adds_bos(c->tok);
    st = chat_tokenize(c->specials, c->tok, &p, add_bos, &ids, &n_ids);
    chat_prompt_free(&p);
    if (st == VKI_OK) {
        *n_out = n_ids;
        if (n_ids <= cap)
            memcpy(out, ids, n_ids * sizeof *ids);
        else
            st = VKI_ERR_INVALID_ARG;
    }
    free(ids);
    return st;
}
