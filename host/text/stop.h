/* Stop strings over streamed, detokenised text.
 *
 * Feed each new token's text; the matcher answers how many bytes are now safe to stream and
 * whether a stop string has matched. Text that could still turn into the start of a stop string
 * is held back until it cannot (or until stop_flush at the end of generation); on a match the
 * text before the stop string is released and the stop string itself (and anything fed after
 * it) never is. An incomplete UTF-8 sequence at the end of the fed text is also held until its
 * continuation bytes arrive (at most 3 bytes), so released text never ends mid-character when
 * the input is valid UTF-8; invalid bytes pass through unchanged.
 *
 * Which match wins: the one that ends first in the text, then the one that starts first (the
 * longest). That is what feeding one byte at a time would find, so the result does not depend
 * on how the text is split into tokens.
 *
 * Cost: each feed looks at the held bytes (< the longest stop string) plus the new ones, against
 * every stop string: O((held + new) * total stop bytes). Over a generation that is
 * O((text + tokens * longest) * total stop bytes), e.g. a few stop strings of ~10 bytes cost
 * O(text * 100) byte compares; memory is O(longest + largest feed). */
#ifndef VKI_HOST_STOP_H
#define VKI_HOST_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vkinfer.h"

typedef struct stop_matcher stop_matcher;

typedef struct stop_result {
    const char *emit; /* bytes now safe to stream (never NULL); valid until the next call */
    size_t n_emit;
    bool matched;     /* a stop string matched: emit is the text before it; generation ends */
    uint32_t which;   /* index of the matched stop string */
} stop_result;

/* Copies the n stop strings (each non-empty: VKI_ERR_INVALID_ARG names the index otherwise).
 * n == 0 is fine: everything is released at once (except an incomplete UTF-8 tail). */
vki_status stop_create(const char *const *stops, uint32_t n, stop_matcher **out);
void stop_destroy(stop_matcher *m); /* NULL is fine */

/* Feeds n bytes of new text. After a match, further feeds release nothing and report the match
 * again. VKI_ERR_OUT_OF_HOST_MEMORY leaves the matcher as it was. */
vki_status stop_feed(stop_matcher *m, const char *text, size_t n, stop_result *res);

/* End of generation without a match: releases every held byte. */
void stop_flush(stop_matcher *m, stop_result *res);

/* Bytes currently held back. */
size_t stop_held(const stop_matcher *m);

#endif
