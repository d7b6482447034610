/* Generated tokens -> the text a user sees: streaming detokenisation (never a partial UTF-8
 * sequence) followed by stop-string matching (text that could still become a stop string is held
 * back; the stop string itself is never emitted). Used by `vkinfer generate` and the HTTP
 * server; the batch manager works in token ids only. One per generation, one thread. */
#ifndef VKI_HOST_TEXTSTREAM_H
#define VKI_HOST_TEXTSTREAM_H

#include "vkinfer.h"

typedef struct text_stream text_stream;

/* stops: n_stops stop strings (copied); flags: VKI_DETOK_* for the detokeniser. */
vki_status text_stream_create(const vki_tokenizer *tok, const char *const *stops, uint32_t n_stops,
                              uint32_t flags, text_stream **out);
void text_stream_free(text_stream *s);

/* Feeds one generated token. *emit / *n_emit: text now safe to show (valid until the next call).
 * *stopped: a stop string completed (the caller ends the generation; later tokens are ignored). */
vki_status text_stream_push(text_stream *s, int32_t token, const char **emit, size_t *n_emit, bool *stopped);
/* End of generation: whatever was held back (incomplete UTF-8 as U+FFFD, a partial stop-string
 * prefix that never completed). */
vki_status text_stream_finish(text_stream *s, const char **emit, size_t *n_emit);
bool text_stream_stopped(const text_stream *s);

#endif
