/* gpt-oss's replies in OpenAI's harmony format, split as they are generated.
 *
 * A reply is a run of messages, each a header, "<|message|>" and its text:
 *     <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER
 * (the prompt ended with "<|start|>assistant"; the "<|return|>" or "<|call|>" that ends the reply
 * ends generation and is not part of the text). The header says where a message's text goes: the
 * analysis channel is reasoning; the final channel, and commentary with no recipient (a preamble
 * to the user), are content; a message to "functions.NAME" is a tool call, whatever its channel.
 * chat_harmony routes each message's text as it arrives (a marker cut across tokens is held back
 * until it is certain) and writes a call into the content in the one spelling gpt-oss's template
 * renders calls in,
 *     <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>
 * which chat_tool_parser's CHAT_TOOLS_HARMONY format turns into an OpenAI tool call (without a
 * tool parser it stays visible in the content, as other families' call syntax does). Text outside
 * any message (a reply that ignores the format) is content; an unfinished header at the end is
 * dropped. raw_analysis (the server's reasoning_format "none"): the analysis stays in the content,
 * markers included ("<|channel|>analysis<|message|>...<|end|>"), what llama.cpp leaves there.
 *
 * The markers are control tokens of gpt-oss's vocabulary: the text fed here must be detokenised
 * with them rendered (VKI_DETOK_SPECIAL). Fixed size, no allocation, O(1) a byte. */
#ifndef VKI_HOST_CHAT_HARMONY_H
#define VKI_HOST_CHAT_HARMONY_H

#include "host/chat/chat.h"

#define CHAT_HARMONY_HEAD_MAX 192 /* a longer header is not one: it comes out as content */

typedef struct chat_harmony {
    uint8_t state;             /* reading a header, a message's text, or between messages */
    uint8_t dest;              /* where the current message's text goes */
    bool raw_analysis;
    bool call_owed;            /* a call began: its spelling goes to the content before its first byte */
    uint16_t n_head;
    uint16_t n_primed;         /* head[0, n_primed) came from the prompt (the role after its <|start|>) */
    uint8_t n_hold;
    char head[CHAT_HARMONY_HEAD_MAX]; /* [n_head] the header so far (after its "<|start|>") */
    char hold[16];             /* [n_hold] bytes that may begin a marker */
    char name[72];             /* the called function (NUL-terminated) */
} chat_harmony;

void chat_harmony_init(chat_harmony *h, bool raw_analysis);
/* Feeds the part of prompt p from the last "<|start|>" its template wrote, the output thrown away:
 * h then stands where the prompt leaves the reply (a header to read after the generation prompt,
 * the final answer's text when the prompt ends inside it, a call's arguments after a forced
 * call's header). */
void chat_harmony_prime(chat_harmony *h, const chat_prompt *p);
/* The next n bytes of the reply: reasoning appended to r, content (and calls) to c; either may be
 * NULL (thrown away). end: the reply is complete (what was held back comes out). false: out of
 * memory (h is then unusable). */
bool chat_harmony_feed(chat_harmony *h, const char *s, size_t n, bool end, strbuf *r, strbuf *c);

#endif
