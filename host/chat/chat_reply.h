/* A chat answer's text as it is generated, for the callers that show it (vki_generate_chat,
 * `vkinfer chat`, `vkinfer generate --chat`): each token through a text stream (UTF-8-safe
 * pieces, stop strings), and on a harmony template (gpt-oss) its markers rendered (they are
 * control tokens) and split by chat_harmony into the reasoning (the analysis channel) and the
 * answer (the final channel), the token that ends the reply ("<|return|>", "<|call|>") shown as
 * nothing; on Command R7B's (chat_template.command_r7b) the same with chat_cohere's split. Other
 * templates' text is all answer ("<think>" blocks included). No Vulkan. */
#ifndef VKI_HOST_CHAT_REPLY_H
#define VKI_HOST_CHAT_REPLY_H

#include "host/chat/chat_harmony.h"

/* Command R7B's reply, split as it is generated: "<|START_THINKING|>...<|END_THINKING|>" is reasoning,
 * "<|START_RESPONSE|>...<|END_RESPONSE|>" the answer without its markers (the generation prompt has
 * opened the response: the reply starts in the answer); any other text, its tool-call syntax
 * ("<|START_ACTION|>[...]<|END_ACTION|>") included, is answer. The markers are control tokens: the
 * text must be detokenised with them rendered (VKI_DETOK_SPECIAL); one cut across pieces is held back
 * until it is certain. Fixed size, no allocation, O(1) a byte. */
typedef struct chat_cohere {
    bool thinking;             /* inside <|START_THINKING|>: bytes go to the reasoning */
    uint8_t n_hold;
    char hold[24];             /* [n_hold] bytes that may begin a marker */
} chat_cohere;

/* The next n bytes of the reply: reasoning appended to r, the answer to c. end: the reply is complete
 * (what was held back comes out as text). false: out of memory. */
bool chat_cohere_feed(chat_cohere *s, const char *p, size_t n, bool end, strbuf *r, strbuf *c);

typedef struct chat_reply {
    vki_text_stream *ts;
    const vki_tokenizer *tok;
    bool harmony;
    chat_harmony h;
    bool cohere;               /* Command R7B: co splits the text */
    chat_cohere co;
    strbuf reasoning, answer; /* what the last chat_reply_push / _finish gave (cleared by each) */
} chat_reply;

/* t: the template the prompt was rendered with; p: that prompt (its end primes the harmony
 * splitter; NULL: a plain generation prompt, "<|start|>assistant"). stops / flags as
 * vki_text_stream_create. VKI_ERR_INVALID_ARG for an empty stop string. */
vki_status chat_reply_init(chat_reply *r, const vki_tokenizer *tok, const chat_template *t, const chat_prompt *p,
                           const char *const *stops, size_t n_stops, uint32_t flags);
/* The next generated token: r->reasoning and r->answer hold its text. *stopped: a stop string
 * matched (the text before it was given). */
vki_status chat_reply_push(chat_reply *r, int32_t token, bool *stopped);
/* The end of the reply: what was held back (a possible stop string's start, a marker's). */
vki_status chat_reply_finish(chat_reply *r);
void chat_reply_free(chat_reply *r);

/* The template behind a public handle (host/chat/chat_api.c). */
const chat_template *chat_api_template(const vki_chat_template *c);

#endif
