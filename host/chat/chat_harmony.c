/* The harmony reply splitter (chat_harmony.h): a byte-at-a-time state machine over the three
 * places a reply can be, a header, a message's text, or the gap after a message's "<|end|>". */
#include "host/chat/chat_harmony.h"

#include <string.h>

enum { H_HEAD, H_BODY, H_GAP };             /* chat_harmony.state */
enum { D_CONTENT, D_REASONING, D_CALL };    /* chat_harmony.dest */

/* The format's markers (each one control token of the vocabulary); none is a prefix of another. */
enum { M_START, M_END, M_MESSAGE, M_CHANNEL, M_RETURN, M_CALL, M_COUNT };
static const char *const MARK[M_COUNT] = {"<|start|>", "<|end|>",    "<|message|>",
                                          "<|channel|>", "<|return|>", "<|call|>"};
#define NONE (-1) /* hold is a proper prefix of a marker */
#define TEXT (-2) /* hold is a prefix of none */

/* Where the output goes: NULL sinks throw it away (priming). */
typedef struct sink {
    strbuf *r, *c;
    bool ok;
} sink;

static void put(sink *k, strbuf *b, const char *s, size_t n)
{
    if (b && n)
        k->ok &= strbuf_put(b, s, n);
}

static void puts_(sink *k, strbuf *b, const char *s) { put(k, b, s, strlen(s)); }

/* The marker that hold[0, n) is, NONE while it may still become one, TEXT when it cannot. */
static int marker(const char *hold, size_t n)
{
    bool prefix = false;
    for (int m = 0; m < M_COUNT; m++) {
        size_t len = strlen(MARK[m]);
        if (n <= len && !memcmp(hold, MARK[m], n)) {
            if (n == len)
                return m;
            prefix = true;
        }
    }
    return prefix ? NONE : TEXT;
}

static bool ends_with(const char *s, size_t n, const char *tail)
{
    size_t k = strlen(tail);
    return n >= k && !memcmp(s + n - k, tail, k);
}

/* The call's spelling up to its arguments, once (not while priming: the real output owes it). */
static void call_head(chat_harmony *h, sink *k)
{
    if (!h->call_owed || !k->c)
        return;
    h->call_owed = false;
    puts_(k, k->c, "<|start|>assistant to=functions.");
    puts_(k, k->c, h->name);
    puts_(k, k->c, "<|channel|>commentary json<|message|>");
}

/* Text of the current message to where it goes. */
static void emit(chat_harmony *h, sink *k, const char *s, size_t n)
{
    if (h->dest == D_REASONING) {
        put(k, h->raw_analysis ? k->c : k->r, s, n);
        return;
    }
    if (h->dest == D_CALL && n)
        call_head(h, k);
    put(k, k->c, s, n);
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* The word at s[0, n): its length in name characters. */
static size_t word(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && name_char(s[k]))
        k++;
    return k;
}

/* The header head[0, n) is complete ("<|message|>" came): where the text goes. The recipient is
 * " to=..." wherever it stands (gpt-oss writes it after the role or after the channel); the
 * channel is the word after the last "<|channel|>". */
static void begin_body(chat_harmony *h, sink *k, size_t n)
{
    const char *s = h->head, *to = NULL, *channel = NULL;
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(s + i, "to=", 3) && (i == 0 || s[i - 1] == ' '))
            to = s + i + 3;
    for (size_t i = 0; i + 11 <= n; i++)
        if (!memcmp(s + i, MARK[M_CHANNEL], 11))
            channel = s + i + 11;
    size_t left = to ? n - (size_t)(to - s) : 0, len = 0; /* "functions." + a name, then ' ', '<' or the end */
    if (left > 10 && !memcmp(to, "functions.", 10))
        len = word(to + 10, left - 10);
    h->state = H_BODY;
    h->n_hold = 0;
    if (len && len < sizeof h->name && (len == left - 10 || to[10 + len] == ' ' || to[10 + len] == '<')) {
        h->dest = D_CALL;
        memcpy(h->name, to + 10, len);
        h->name[len] = 0;
        h->call_owed = true;
    } else if (channel && (size_t)(s + n - channel) >= 8 && !memcmp(channel, "analysis", 8) &&
               word(channel, (size_t)(s + n - channel)) == 8) {
        h->dest = D_REASONING;
        if (h->raw_analysis)
            puts_(k, k->c, "<|channel|>analysis<|message|>");
    } else {
        h->dest = D_CONTENT;
    }
}

/* The current message ends (at marker m, or at the end of the reply: m < 0). */
static void end_body(chat_harmony *h, sink *k, int m)
{
    if (h->dest == D_CALL) {
        call_head(h, k); /* no arguments were written: the call still happened */
        puts_(k, k->c, MARK[M_CALL]);
    } else if (h->dest == D_REASONING && h->raw_analysis && m == M_END) {
        puts_(k, k->c, MARK[M_END]);
    }
    h->dest = D_CONTENT;
    h->n_hold = 0;
    h->n_head = 0;
    h->state = m == M_START || m == M_CHANNEL ? H_HEAD : H_GAP;
    if (m == M_CHANNEL) { /* "<|channel|>" straight after a message: the next one's header */
        memcpy(h->head, MARK[M_CHANNEL], 11);
        h->n_head = 11;
    }
}

static void body_byte(chat_harmony *h, sink *k, char b)
{
    h->hold[h->n_hold++] = b;
    int m = marker(h->hold, h->n_hold);
    while (m == TEXT) { /* give out what cannot begin a marker */
        emit(h, k, h->hold, 1);
        memmove(h->hold, h->hold + 1, --h->n_hold);
        m = h->n_hold ? marker(h->hold, h->n_hold) : NONE;
    }
    if (m == M_MESSAGE) { /* not a message's end: text */
        emit(h, k, h->hold, h->n_hold);
        h->n_hold = 0;
    } else if (m >= 0) {
        end_body(h, k, m);
    }
}

static void head_byte(chat_harmony *h, sink *k, char b)
{
    if (h->n_head == sizeof h->head) { /* no header is this long: it was text (after the prompt's role) */
        h->state = H_BODY;
        h->dest = D_CONTENT;
        h->n_hold = 0;
        put(k, k->c, h->head + h->n_primed, h->n_head - h->n_primed);
        h->n_head = h->n_primed = 0;
        body_byte(h, k, b);
        return;
    }
    h->head[h->n_head++] = b;
    bool start = ends_with(h->head, h->n_head, MARK[M_START]); /* a new message: its role follows */
    bool stop = ends_with(h->head, h->n_head, MARK[M_END]) || ends_with(h->head, h->n_head, MARK[M_RETURN]) ||
                ends_with(h->head, h->n_head, MARK[M_CALL]); /* a header without a message */
    if (ends_with(h->head, h->n_head, MARK[M_MESSAGE]))
        begin_body(h, k, h->n_head - 11);
    if (h->state != H_HEAD || start || stop)
        h->n_head = h->n_primed = 0;
    if (stop)
        h->state = H_GAP;
}

static void gap_byte(chat_harmony *h, sink *k, char b)
{
    if (!h->n_hold && (b == ' ' || b == '\n' || b == '\t' || b == '\r'))
        return;
    h->hold[h->n_hold++] = b;
    int m = marker(h->hold, h->n_hold);
    if (m == NONE)
        return;
    uint8_t n = h->n_hold;
    h->n_hold = 0;
    if (m == M_START) {
        h->state = H_HEAD;
        h->n_head = 0;
    } else if (m == M_CHANNEL) {
        h->state = H_HEAD;
        memcpy(h->head, MARK[M_CHANNEL], 11);
        h->n_head = 11;
    } else if (m == M_MESSAGE) { /* a message with no header: content */
        h->state = H_BODY;
        h->dest = D_CONTENT;
    } else if (m == TEXT) { /* text outside any message: content, the held bytes first */
        char held[sizeof h->hold];
        memcpy(held, h->hold, n);
        h->state = H_BODY;
        h->dest = D_CONTENT;
        for (uint8_t i = 0; i < n; i++)
            body_byte(h, k, held[i]);
    } /* a stray end marker: nothing */
}

/* The end of the reply: held bytes out, an open call closed, an unfinished header dropped unless
 * it holds no marker at all (then it was the start of a reply that ignores the format). */
static void finish(chat_harmony *h, sink *k)
{
    if (h->state == H_BODY) {
        emit(h, k, h->hold, h->n_hold);
        end_body(h, k, -1);
    } else if (h->state == H_HEAD) {
        if (!memmem(h->head, h->n_head, "<|", 2))
            put(k, k->c, h->head + h->n_primed, h->n_head - h->n_primed);
    } else {
        put(k, k->c, h->hold, h->n_hold);
    }
    h->n_hold = 0;
    h->n_head = h->n_primed = 0;
    h->state = H_GAP;
}

void chat_harmony_init(chat_harmony *h, bool raw_analysis)
{
    memset(h, 0, sizeof *h);
    h->state = H_HEAD; /* after the generation prompt's "<|start|>assistant" */
    h->raw_analysis = raw_analysis;
}

static void feed(chat_harmony *h, sink *k, const char *s, size_t n, bool end)
{
    for (size_t i = 0; i < n && k->ok; i++) {
        if (h->state == H_BODY)
            body_byte(h, k, s[i]);
        else if (h->state == H_HEAD)
            head_byte(h, k, s[i]);
        else
            gap_byte(h, k, s[i]);
    }
    if (end && k->ok)
        finish(h, k);
}

bool chat_harmony_feed(chat_harmony *h, const char *s, size_t n, bool end, strbuf *r, strbuf *c)
{
    sink k = {r, c, true};
    feed(h, &k, s, n, end);
    return k.ok;
}

void chat_harmony_prime(chat_harmony *h, const chat_prompt *p)
{
    size_t from = p->len;
    bool found = false;
    for (size_t i = 0; i < p->n_tmpl; i++) {
        const char *a = p->text + p->tmpl[i].off, *e = a + p->tmpl[i].len, *q;
        while ((q = memmem(a, (size_t)(e - a), MARK[M_START], 9)) != NULL) {
            from = (size_t)(q - p->text);
            found = true;
            a = q + 9;
        }
    }
    sink k = {NULL, NULL, true};
    if (found)
        feed(h, &k, p->text + from, p->len - from, false);
    h->n_primed = h->state == H_HEAD ? h->n_head : 0;
}
