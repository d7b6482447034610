/* HTTP/1.1 for `vkinfer serve`: the listening socket, the io thread (epoll, level-triggered), the
 * request parser, connection deadlines and the cap, handler threads, and the writers.
 *
 * Why our own and not libmicrohttpd: past its connection limit MHD resets new connections (no
 * answer, nothing tells the client to retry); its timeout is per idle period, so a client that
 * sends one header byte every few seconds holds a connection (and, thread per connection, a
 * thread) for ever; and health checks share the same slots. Here:
 *  - a connection past max_connections is still accepted: its request head is read (with a short
 *    deadline) and /health, /health/ready and /metrics are answered; anything else gets 503 with
 *    Retry-After, then a lingering close (so the answer is not destroyed by a reset). Past
 *    overflow_max (sized from the descriptor limit), or when no descriptor is left, the 503 is
 *    written at once;
 *  - receiving a request (head and body together) has a deadline: 408 past it;
 *  - a request is parsed strictly: Content-Length with Transfer-Encoding, conflicting lengths,
 *    obsolete line folding, whitespace before a colon, bad chunk sizes are a 400 naming them;
 *  - reading is the io thread's alone (no thread per idle or slow connection); a thread is
 *    taken only for a complete request of a heavy route, and only while it is answered.
 * Cost: O(connections) per sweep of the deadlines (every <= 100 ms), O(bytes) per request. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host/server/server.h"
#include "host/util/netio.h"

enum conn_state { CS_READ, CS_HANDLER, CS_WRITE, CS_LINGER };
enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

#define LINGER_S 2.0          /* a closing connection drains what the client still sends */
#define OVERFLOW_HEAD_S 5.0   /* past the cap: at most this long to send the request head */

static char LISTEN_TAG, WAKE_TAG; /* epoll data for the two non-connection descriptors */

/* ---- listening -------------------------------------------------------------------------------- */

vki_status srv_listen(const char *host, uint16_t port, int *fd_out, char *err, size_t n_err)
{
    *fd_out = -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) {
        snprintf(err, n_err, "--host %s: %s", host, gai_strerror(rc));
        return VKI_ERR_INVALID_ARG;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1, e = 0;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 4096))
            e = errno;
    } else {
        e = errno;
    }
    freeaddrinfo(ai);
    if (fd < 0 || e) {
        snprintf(err, n_err, "cannot listen on %s:%u: %s%s", host, port, strerror(e),
                 e == EADDRINUSE ? " (another program uses this port; pick one with --port)" : "");
        if (fd >= 0)
            close(fd);
        return VKI_ERR_IO;
    }
    *fd_out = fd;
    return VKI_OK;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage a;
    socklen_t n = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &n))
        return 0;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
}

/* Each connection holds a socket (and while generating an eventfd): raise the soft descriptor
 * limit to the hard one, and size the overflow (connections past the cap) from what is left. */
static void size_fds(srv *s)
{
    struct rlimit r;
    uint64_t before = 0;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
        before = r.rlim_cur;
        if (r.rlim_cur < r.rlim_max) {
            r.rlim_cur = r.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &r))
                r.rlim_cur = before;
        }
    }
    s->fd_limit = r.rlim_cur == RLIM_INFINITY ? 1u << 20 : (uint64_t)r.rlim_cur;
    uint64_t need = 64 + 2ull * s->p.max_connections, left = s->fd_limit > need ? s->fd_limit - need : 0;
    s->overflow_max = (uint32_t)(left > 65536 ? 65536 : left);
    srv_log(s, VKI_LOG_INFO, "file descriptors: limit %llu%s; %u connections served at once, %u more answered "
            "503 + Retry-After", (unsigned long long)s->fd_limit, before && before < s->fd_limit ? " (raised)" : "",
            s->p.max_connections, s->overflow_max);
    if (need > s->fd_limit)
        srv_log(s, VKI_LOG_WARN, "the descriptor limit (%llu) is below what %u connections need (%llu): raise it "
                "(ulimit -n) or lower --max-connections", (unsigned long long)s->fd_limit, s->p.max_connections,
                (unsigned long long)need);
}

/* ---- writers ----------------------------------------------------------------------------------- */

static const char *reason(unsigned code)
{
    switch (code) {
    case 100: return "Continue";
    case 102: return "Processing";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static bool conn_draining(srv_conn *c)
{
    pthread_mutex_lock(&c->s->mu);
    bool d = c->s->draining;
    pthread_mutex_unlock(&c->s->mu);
    return d;
}

/* The status line and the headers every answer carries. */
static bool put_head(srv_conn *c, strbuf *b, unsigned code, const char *ctype, long long length, const char *extra)
{
    c->status = code;
    if (c->overflow || conn_draining(c) || c->peer_eof || !c->req.keep_alive)
        c->close_after = true;
    const char *origin = srv_cors_origin(c->s, c->req.origin);
    bool ok = strbuf_printf(b, "HTTP/1.1 %u %s\r\nServer: vkinfer/%s\r\n", code, reason(code), SRV_VERSION);
    if (ctype)
        ok = ok && strbuf_printf(b, "Content-Type: %s\r\n", ctype);
    if (length >= 0)
        ok = ok && strbuf_printf(b, "Content-Length: %lld\r\n", length);
    if (c->close_after)
        ok = ok && strbuf_printf(b, "Connection: close\r\n");
    else if (c->req.minor == 0)
        ok = ok && strbuf_printf(b, "Connection: keep-alive\r\n");
    if (origin)
        ok = ok && strbuf_printf(b, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", origin);
    if (extra)
        ok = ok && strbuf_put(b, extra, strlen(extra));
    return ok && strbuf_put(b, "\r\n", 2);
}

/* The answer when there is no memory to build one: a constant, sent as it is. */
#define OOM_BODY "{\"error\":{\"message\":\"out of memory while building the answer\",\"type\":\"server_error\"}}"
static const char OOM_REPLY[] = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                "Content-Length: 85\r\nConnection: close\r\n\r\n" OOM_BODY;
_Static_assert(sizeof OOM_BODY - 1 == 85, "Content-Length of OOM_REPLY");

void srv_reply(srv_conn *c, unsigned code, const char *ctype, char *body, const char *extra)
{
    srv_metrics_http(&c->s->m, code);
    strbuf b = {0};
    size_t n = body ? strlen(body) : 0;
    bool head_only = !strcmp(c->req.method, "HEAD") || code == 204;
    bool ok = body && put_head(c, &b, code, ctype, code == 204 ? -1 : (long long)n, extra) &&
              (head_only || strbuf_put(&b, body, n));
    free(body);
    if (!ok) { /* nothing queued before it (else it would interleave): the constant answer */
        c->close_after = true;
        strbuf_free(&b);
        if (c->on_handler || !c->out.len) {
            ssize_t w = send(c->fd, OOM_REPLY, sizeof OOM_REPLY - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w; /* a small reply into an empty socket buffer; if even that fails, the close says it */
        }
        return;
    }
    if (c->on_handler) {
        if (!net_send_all(c->fd, b.p, b.len))
            c->close_after = true;
        strbuf_free(&b);
        return;
    }
    if (!c->out.len) {
        strbuf_free(&c->out);
        c->out = b;
        c->out_off = 0;
    } else if (!strbuf_put(&c->out, b.p, b.len)) {
        c->close_after = true;
    }
    if (c->out.p != b.p)
        strbuf_free(&b);
}

void srv_reply_json(srv_conn *c, unsigned code, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    srv_reply(c, code, "application/json", s, NULL);
}

void srv_reply_error(srv_conn *c, const srv_error *e)
{
    const char *extra = e->http == 429 || e->http == 503 ? "Retry-After: 1\r\n"
                      : e->http == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL;
    /* KServe's and Ollama's {"error": "..."} */
    bool v2 = c->req.route == R_V2 || c->req.route == R_V2_HEAVY || c->ollama;
    srv_reply(c, e->http, "application/json", v2 ? srv_error_json_v2(e) : srv_error_json(e), extra);
}

bool srv_stream_begin(srv_conn *c, const char *ctype)
{
    srv_metrics_http(&c->s->m, 200);
    c->stream_chunked = c->req.minor >= 1;
    if (!c->stream_chunked)
        c->close_after = true; /* HTTP/1.0: the body ends with the connection */
    strbuf b = {0};
    bool ok = put_head(c, &b, 200, ctype, -1,
                       c->stream_chunked ? "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                                         : "Cache-Control: no-cache\r\n") &&
              net_send_all(c->fd, b.p, b.len);
    strbuf_free(&b);
    c->headers_sent = true;
    if (!ok)
        c->close_after = true;
    return ok;
}

bool srv_stream_send(srv_conn *c, const char *p, size_t n)
{
    if (!n)
        return true;
    char head[24];
    int k = snprintf(head, sizeof head, "%zx\r\n", n);
    bool ok = c->stream_chunked ? net_send_all(c->fd, head, (size_t)k) && net_send_all(c->fd, p, n) &&
                                      net_send_all(c->fd, "\r\n", 2)
                                : net_send_all(c->fd, p, n);
    if (!ok)
        c->close_after = true;
    return ok;
}

bool srv_stream_end(srv_conn *c)
{
    bool ok = !c->stream_chunked || net_send_all(c->fd, "0\r\n\r\n", 5);
    if (!ok)
        c->close_after = true;
    return ok;
}

bool srv_probe(srv_conn *c)
{
    if (c->headers_sent)
        return srv_stream_send(c, ": ping\n\n", 8);
    if (c->req.minor < 1) /* no interim answers for HTTP/1.0: trust the half-close */
        return true;
    static const char interim[] = "HTTP/1.1 102 Processing\r\n\r\n";
    return net_send_all(c->fd, interim, sizeof interim - 1);
}

/* ---- connections ------------------------------------------------------------------------------ */

static void ep_set(srv *s, srv_conn *c, uint32_t events, int op)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(s->ep, op, c->fd, &ev);
}

static void list_add(srv *s, srv_conn *c)
{
    c->prev = NULL;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
}

static void list_del(srv *s, srv_conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* A connection stops counting against the cap (it is closing, or closed). */
static void release_slot(srv *s, srv_conn *c)
{
    if (c->overflow) {
        s->n_overflow--;
    } else {
        pthread_mutex_lock(&s->mu);
        s->n_conns--;
        pthread_mutex_unlock(&s->mu);
    }
    c->overflow = true; /* released: counted as overflow (lingering) from now on */
    s->n_overflow++;
}

static void conn_free(srv *s, srv_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    strbuf_free(&c->in);
    strbuf_free(&c->out);
    strbuf_free(&c->req.body);
    free(c);
    (void)s;
}

static void conn_close(srv *s, srv_conn *c)
{
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    list_del(s, c);
    if (c->overflow)
        s->n_overflow--;
    else {
        pthread_mutex_lock(&s->mu);
        s->n_conns--;
        pthread_mutex_unlock(&s->mu);
    }
    conn_free(s, c);
}

/* The answer is out and the connection ends: stop sending, then drain what the client still
 * sends for a moment, so that unread request bytes do not turn the close into a reset that
 * destroys the answer in flight. */
static void conn_linger(srv *s, srv_conn *c)
{
    shutdown(c->fd, SHUT_WR);
    release_slot(s, c);
    c->state = CS_LINGER;
    c->deadline = srv_now() + LINGER_S;
    ep_set(s, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
}

/* Starts reading the next request (keep-alive): what was read beyond the last one stays. */
static void conn_next(srv *s, srv_conn *c)
{
    memmove(c->in.p, c->in.p + c->in_off, c->in.len - c->in_off);
    c->in.len -= c->in_off;
    c->in_off = c->scan = c->head_len = 0;
    strbuf_free(&c->req.body);
    memset(&c->req, 0, sizeof c->req);
    memset(&c->acc, 0, sizeof c->acc);
    c->status = 0;
    c->t_req = c->in.len ? srv_now() : 0;
    c->state = CS_READ;
    c->deadline = srv_now() + (c->in.len ? s->p.request_timeout_s : s->p.idle_timeout_s);
}

/* Writes what is pending without blocking. false: the connection was closed. */
static bool conn_flush(srv *s, srv_conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t w = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (c->state != CS_WRITE) {
                c->state = CS_WRITE;
                c->deadline = srv_now() + s->p.idle_timeout_s;
                ep_set(s, c, EPOLLOUT, EPOLL_CTL_MOD);
            }
            return true;
        }
        if (w <= 0) {
            conn_close(s, c);
            return false;
        }
        c->out_off += (size_t)w;
    }
    strbuf_clear(&c->out);
    c->out_off = 0;
    return true;
}

/* ---- request parsing --------------------------------------------------------------------------- */

static bool is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static void copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    snprintf(dst, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
}

/* One header line [p, p + n) (no line ending). 0 ok, else the status of the refusal. */
static unsigned header(srv_conn *c, const char *p, size_t n, bool *has_cl, bool *has_te, srv_error *e)
{
    srv_req *r = &c->req;
    if (n && (p[0] == ' ' || p[0] == '\t'))
        return srv_err(e, 400, NULL, "obsolete header line folding is not accepted"), 400;
    const char *colon = memchr(p, ':', n);
    if (!colon || colon == p)
        return srv_err(e, 400, NULL, "malformed header line (no 'name:')"), 400;
    for (const char *q = p; q < colon; q++)
        if (!is_tchar((unsigned char)*q))
            return srv_err(e, 400, NULL, "malformed header name (whitespace or a separator before ':')"), 400;
    size_t nl = (size_t)(colon - p);
    const char *v = colon + 1, *end = p + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t vn = (size_t)(end - v);
    for (size_t i = 0; i < vn; i++)
        if ((unsigned char)v[i] < 0x20 && v[i] != '\t')
            return srv_err(e, 400, NULL, "a control character in the value of %.*s", (int)nl, p), 400;
#define IS(name) (nl == sizeof name - 1 && !strncasecmp(p, name, nl))
    if (IS("Content-Length")) {
        uint64_t x = 0;
        bool ok = vn > 0 && vn <= 18;
        for (size_t i = 0; ok && i < vn; i++)
            ok = v[i] >= '0' && v[i] <= '9', x = x * 10 + (uint64_t)(v[i] - '0');
        if (!ok)
            return srv_err(e, 400, NULL, "Content-Length must be one decimal number, got '%.40s'", v), 400;
        if (*has_cl && x != r->content_length)
            return srv_err(e, 400, NULL, "two different Content-Length headers: ambiguous"), 400;
        *has_cl = true;
        r->content_length = x;
    } else if (IS("Transfer-Encoding")) {
        if (*has_te || vn != 7 || strncasecmp(v, "chunked", 7))
            return srv_err(e, 501, NULL, "Transfer-Encoding '%.40s' is not supported (only chunked)", v), 501;
        *has_te = r->chunked = true;
    } else if (IS("Connection")) {
        for (const char *t = v; t < end;) { /* a comma-separated list of tokens */
            const char *u = memchr(t, ',', (size_t)(end - t));
            const char *te = u ? u : end;
            while (t < te && (*t == ' ' || *t == '\t'))
                t++;
            size_t tn = (size_t)(te - t);
            while (tn && (t[tn - 1] == ' ' || t[tn - 1] == '\t'))
                tn--;
            if (tn == 5 && !strncasecmp(t, "close", 5))
                r->keep_alive = false;
            else if (tn == 10 && !strncasecmp(t, "keep-alive", 10) && r->minor == 0)
                r->keep_alive = true;
            t = u ? u + 1 : end;
        }
    } else if (IS("Expect")) {
        if (vn != 12 || strncasecmp(v, "100-continue", 12))
            return srv_err(e, 417, NULL, "Expect: '%.40s' is not supported", v), 417;
        r->expect_continue = true;
    } else if (IS("Authorization")) {
        copy_value(r->auth, sizeof r->auth, v, vn);
    } else if (IS("Origin")) {
        copy_value(r->origin, sizeof r->origin, v, vn);
    } else if (IS("Access-Control-Request-Headers")) {
        copy_value(r->acr_headers, sizeof r->acr_headers, v, vn);
    }
#undef IS
    return 0;
}

/* The request line "METHOD /path HTTP/1.x". 0 ok, else the status of the refusal. */
static unsigned request_line(srv_conn *c, const char *p, size_t n, srv_error *e)
{
    srv_req *r = &c->req;
    const char *sp1 = memchr(p, ' ', n), *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(p + n - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1)
        return srv_err(e, 400, NULL, "malformed request line"), 400;
    size_t ml = (size_t)(sp1 - p), tl = (size_t)(sp2 - sp1 - 1), vl = (size_t)(p + n - sp2 - 1);
    for (size_t i = 0; i < ml; i++)
        if (!is_tchar((unsigned char)p[i]))
            return srv_err(e, 400, NULL, "malformed method"), 400;
    if (ml >= sizeof r->method)
        return srv_err(e, 501, NULL, "unknown method"), 501;
    memcpy(r->method, p, ml);
    r->method[ml] = 0;
    const char *t = sp1 + 1;
    if (t[0] != '/')
        return srv_err(e, 400, NULL, "the request target must be a path starting with '/'"), 400;
    for (size_t i = 0; i < tl; i++)
        if ((unsigned char)t[i] <= 0x20 || (unsigned char)t[i] == 0x7f)
            return srv_err(e, 400, NULL, "a control character or space in the request target"), 400;
    size_t pl = strcspn(t, "? ");
    if (pl > tl)
        pl = tl;
    if (pl >= sizeof r->path)
        return srv_err(e, 404, NULL, "unknown route (the path is too long)"), 404;
    memcpy(r->path, t, pl);
    r->path[pl] = 0;
    const char *v = sp2 + 1;
    if (vl != 8 || strncmp(v, "HTTP/1.", 7) || (v[7] != '0' && v[7] != '1'))
        return srv_err(e, 505, NULL, "only HTTP/1.0 and HTTP/1.1 are served"), 505;
    r->minor = v[7] - '0';
    r->keep_alive = r->minor == 1;
    return 0;
}

/* Parses the head [in_off, in_off + len) (line endings CRLF or LF). 0 ok, else a status. */
static unsigned parse_head(srv_conn *c, const char *p, size_t len, srv_error *e)
{
    const char *end = p + len;
    bool first = true, has_cl = false, has_te = false;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break;
        size_t n = (size_t)(nl - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (memchr(p, '\r', n))
            return srv_err(e, 400, NULL, "a bare CR in the request head"), 400;
        if (!n)
            break;
        unsigned st = first ? request_line(c, p, n, e) : header(c, p, n, &has_cl, &has_te, e);
        if (st)
            return st;
        first = false;
        p = nl + 1;
    }
    if (first)
        return srv_err(e, 400, NULL, "malformed request line"), 400;
    if (has_cl && has_te)
        return srv_err(e, 400, NULL, "both Content-Length and Transfer-Encoding: an ambiguous body length "
                       "(request smuggling) is refused"), 400;
    if (has_te && c->req.minor == 0)
        return srv_err(e, 400, NULL, "Transfer-Encoding in an HTTP/1.0 request"), 400;
    return 0;
}

/* Finds the end of the head from c->scan. Returns its length (bytes through the empty line) or
 * 0 when not yet complete. Leading empty lines are skipped (RFC 9112 2.2). */
static size_t head_end(srv_conn *c)
{
    char *b = c->in.p + c->in_off;
    size_t n = c->in.len - c->in_off;
    size_t skip = 0;
    while (skip < n && (b[skip] == '\r' || b[skip] == '\n'))
        skip++;
    if (skip) {
        c->in_off += skip;
        b += skip;
        n -= skip;
        c->scan = 0;
    }
    for (size_t i = c->scan; i < n; i++)
        if (b[i] == '\n' && ((i >= 1 && b[i - 1] == '\n') || (i >= 2 && b[i - 1] == '\r' && b[i - 2] == '\n')))
            return i + 1;
    c->scan = n ? n - 1 : 0;
    return 0;
}

/* Moves body bytes from the input into req.body. 1: complete, 0: need more, -1: refused (*e). */
static int take_body(srv_conn *c, srv_error *e)
{
    srv *s = c->s;
    srv_req *r = &c->req;
    if (!r->chunked) {
        size_t have = c->in.len - c->in_off, n = have < c->body_left ? have : (size_t)c->body_left;
        if (n && !strbuf_put(&r->body, c->in.p + c->in_off, n))
            return srv_err(e, 500, NULL, "out of memory"), -1;
        c->in_off += n;
        c->body_left -= n;
        return c->body_left == 0;
    }
    while (c->chunk_state != CH_DONE) {
        char *b = c->in.p + c->in_off;
        size_t have = c->in.len - c->in_off;
        if (c->chunk_state == CH_DATA) {
            size_t n = have < c->chunk_left ? have : (size_t)c->chunk_left;
            if (!n)
                return 0;
            if (r->body.len + n > s->p.body_limit)
                return srv_err(e, 413, NULL, "the request body exceeds the limit of %zu bytes", s->p.body_limit), -1;
            if (!strbuf_put(&r->body, b, n))
                return srv_err(e, 500, NULL, "out of memory"), -1;
            c->in_off += n;
            if (!(c->chunk_left -= n))
                c->chunk_state = CH_DATA_END;
            continue;
        }
        char *nl = memchr(b, '\n', have);
        if (!nl)
            return have > 1024 ? (srv_err(e, 400, NULL, "malformed chunked body (a line too long)"), -1) : 0;
        size_t n = (size_t)(nl - b), ln = n && b[n - 1] == '\r' ? n - 1 : n;
        c->in_off += n + 1;
        if (c->chunk_state == CH_DATA_END) {
            if (ln)
                return srv_err(e, 400, NULL, "malformed chunked body (no line end after a chunk)"), -1;
            c->chunk_state = CH_SIZE;
        } else if (c->chunk_state == CH_TRAILER) {
            if (!ln)
                c->chunk_state = CH_DONE;
        } else { /* CH_SIZE: hex digits, then optional extensions after ';' */
            uint64_t x = 0;
            size_t i = 0;
            for (; i < ln && i < 15 && strchr("0123456789abcdefABCDEF", b[i]); i++)
                x = x * 16 + (uint64_t)(b[i] <= '9' ? b[i] - '0' : (b[i] | 0x20) - 'a' + 10);
            if (!i || (i < ln && b[i] != ';' && b[i] != ' ' && b[i] != '\t'))
                return srv_err(e, 400, NULL, "malformed chunk size '%.*s'", (int)(ln < 20 ? ln : 20), b), -1;
            c->chunk_left = x;
            c->chunk_state = x ? CH_DATA : CH_TRAILER;
        }
    }
    return 1;
}

/* ---- the io thread ------------------------------------------------------------------------------ */

static void start_handler(srv *s, srv_conn *c);
static void conn_process(srv *s, srv_conn *c);

/* The answer is fully written: log it, then close or wait for the next request. */
static void answer_done(srv *s, srv_conn *c)
{
    srv_access_log(c);
    if (c->close_after) {
        conn_linger(s, c);
        return;
    }
    conn_next(s, c);
    ep_set(s, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
}

/* After an answer queued on the io thread: flush it, then close or read the next request.
 * false: the connection was closed (c is freed). */
static bool after_reply(srv *s, srv_conn *c)
{
    if (!conn_flush(s, c))
        return false;
    if (c->state != CS_WRITE) /* else the rest goes out on EPOLLOUT */
        answer_done(s, c);
    return true;
}

/* An answer before the body was read: the connection cannot be reused (the body may follow). */
static void refuse(srv *s, srv_conn *c, const srv_error *e)
{
    c->close_after = true;
    srv_reply_error(c, e);
    after_reply(s, c);
}

/* The head is parsed: checks that do not need the body. false: answered (refused). */
static bool head_checks(srv *s, srv_conn *c)
{
    srv_req *r = &c->req;
    srv_error e;
    uint64_t limit = s->p.body_limit;
    if (!r->chunked && r->content_length > limit) {
        srv_err(&e, 413, NULL, "the request body (%llu bytes) exceeds the limit of %llu bytes",
                (unsigned long long)r->content_length, (unsigned long long)limit);
        return refuse(s, c, &e), false;
    }
    c->body_left = r->chunked ? 0 : r->content_length;
    c->chunk_state = CH_SIZE;
    if (r->expect_continue && (r->chunked || r->content_length) && c->in.len == c->in_off) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        ssize_t w = send(c->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w != (ssize_t)(sizeof cont - 1)) { /* an empty socket buffer takes 25 bytes, or it is gone */
            conn_close(s, c);
            return false;
        }
    }
    return true;
}

static void conn_process(srv *s, srv_conn *c)
{
    while (c->state == CS_READ) {
        srv_error e;
        if (!c->head_len) {
            size_t n = head_end(c);
            if (!n || n > SRV_HEAD_LIMIT) {
                if (n || c->in.len - c->in_off > SRV_HEAD_LIMIT) {
                    srv_err(&e, 431, NULL, "the request head exceeds %d bytes", SRV_HEAD_LIMIT);
                    return refuse(s, c, &e);
                }
                if (c->peer_eof)
                    conn_close(s, c); /* the client gave up before a whole request */
                return;
            }
            unsigned st = parse_head(c, c->in.p + c->in_off, n, &e);
            c->in_off += n;
            c->head_len = n;
            if (st) {
                e.http = st;
                return refuse(s, c, &e);
            }
            if (!head_checks(s, c))
                return;
        }
        int b = take_body(c, &e);
        if (b < 0)
            return refuse(s, c, &e);
        if (!b) {
            if (c->peer_eof)
                conn_close(s, c);
            return;
        }
        srv_serve_small(c); /* routes, auth, CORS, overflow; answers unless the route is heavy */
        if (!c->status && srv_route_is_heavy(c->req.route))
            return start_handler(s, c);
        if (!after_reply(s, c))
            return;
        /* still CS_READ: kept alive, and a pipelined request may already be buffered */
        if (c->state == CS_READ && c->in.len == 0)
            return;
    }
}

/* Reads what is available (without blocking) and parses. */
static void conn_readable(srv *s, srv_conn *c)
{
    if (c->state == CS_LINGER) {
        char buf[4096];
        ssize_t r;
        while ((r = recv(c->fd, buf, sizeof buf, 0)) > 0)
            ;
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            conn_close(s, c);
        return;
    }
    size_t limit = SRV_HEAD_LIMIT + s->p.body_limit + 65536;
    for (;;) {
        if (c->in.len - c->in_off >= limit) /* enough to decide (431 / 413 follow) */
            break;
        if (!strbuf_reserve(&c->in, 16384)) {
            conn_close(s, c);
            return;
        }
        ssize_t r = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len - 1, 0);
        if (r > 0) {
            if (c->in.len == c->in_off && !c->t_req) { /* a request begins: its deadline starts */
                c->t_req = srv_now();
                double limit_s = c->overflow && s->p.request_timeout_s > OVERFLOW_HEAD_S ? OVERFLOW_HEAD_S
                                                                                        : s->p.request_timeout_s;
                c->deadline = c->t_req + limit_s;
            }
            c->in.len += (size_t)r;
            c->in.p[c->in.len] = 0;
            continue;
        }
        if (r == 0) {
            c->peer_eof = true;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) { /* reset: the client is gone */
            conn_close(s, c);
            return;
        }
        break;
    }
    if (c->peer_eof && c->in.len == c->in_off && !c->head_len) {
        conn_close(s, c); /* an idle client hung up */
        return;
    }
    if (c->peer_eof)
        ep_set(s, c, 0, EPOLL_CTL_MOD); /* nothing more to read: stop the level-triggered EOF */
    conn_process(s, c);
}

static void conn_writable(srv *s, srv_conn *c)
{
    c->state = CS_READ; /* conn_flush sets CS_WRITE again while the socket stays full */
    if (conn_flush(s, c) && c->state != CS_WRITE)
        answer_done(s, c);
}

/* Past every cap, or out of descriptors: the 503 goes out at once. */
static void reject_now(srv *s, int fd)
{
    static const char body[] = "{\"error\":{\"message\":\"the server is at its connection limit; retry later\","
                               "\"type\":\"server_error\",\"param\":null,\"code\":\"service_unavailable\"}}";
    char msg[512];
    int n = snprintf(msg, sizeof msg, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: "
                     "application/json\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    ssize_t w = send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    shutdown(fd, SHUT_WR);
    char buf[4096];
    while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
        ;
    close(fd);
    srv_metrics_http(&s->m, 503);
    srv_metrics_overflow(&s->m);
}

static void new_conn(srv *s, int fd, const struct sockaddr_storage *a)
{
    pthread_mutex_lock(&s->mu);
    bool over = s->n_conns >= s->p.max_connections;
    if (!over)
        s->n_conns++;
    pthread_mutex_unlock(&s->mu);
    srv_conn *c = over && s->n_overflow >= s->overflow_max ? NULL : calloc(1, sizeof *c);
    if (!c) {
        if (!over) {
            pthread_mutex_lock(&s->mu);
            s->n_conns--;
            pthread_mutex_unlock(&s->mu);
        }
        reject_now(s, fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char host[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (a->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, host, sizeof host);
        port = ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    } else if (a->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, host, sizeof host);
        port = ntohs(((const struct sockaddr_in *)a)->sin_port);
    }
    snprintf(c->peer, sizeof c->peer, "%s:%u", host, port);
    c->s = s;
    c->fd = fd;
    c->overflow = over;
    s->n_overflow += over;
    c->state = CS_READ;
    c->deadline = srv_now() + (over ? OVERFLOW_HEAD_S : s->p.idle_timeout_s);
    list_add(s, c);
    ep_set(s, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
}

static void accept_all(srv *s)
{
    for (int i = 0; i < 256 && s->listen_fd >= 0; i++) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            new_conn(s, fd, &a);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if ((errno == EMFILE || errno == ENFILE) && s->reserve_fd >= 0) {
            /* out of descriptors: free the spare one to answer this client, then take it back */
            close(s->reserve_fd);
            fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                reject_now(s, fd);
            s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        break;
    }
}

/* Handlers give their connections back through s->returned. */
static void take_returned(srv *s)
{
    uint64_t v;
    ssize_t r = read(s->wake_fd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&s->mu);
    srv_conn *l = s->returned;
    s->returned = NULL;
    pthread_mutex_unlock(&s->mu);
    for (srv_conn *c = l, *n; c; c = n) {
        n = c->ret_next;
        c->on_handler = false;
        c->half_closed = c->headers_sent = false;
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        list_add(s, c);
        ep_set(s, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
        if (c->close_after) {
            conn_linger(s, c);
            continue;
        }
        conn_next(s, c);
        if (c->in.len)
            conn_process(s, c);
    }
}

/* Deadlines: a request not received in time gets 408; idle, lingering and stuck writes close. */
static void sweep(srv *s, double now)
{
    for (srv_conn *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (now < c->deadline)
            continue;
        if (c->state == CS_READ && (c->in.len > c->in_off || c->head_len)) {
            srv_error e;
            srv_err(&e, 408, NULL, "the request was not received within %u s", s->p.request_timeout_s);
            refuse(s, c, &e);
        } else {
            conn_close(s, c);
        }
    }
}

static void *io_main(void *arg)
{
    srv *s = arg;
    struct epoll_event ev[128];
    double last_sweep = 0;
    for (;;) {
        int n = epoll_wait(s->ep, ev, 128, 100);
        pthread_mutex_lock(&s->mu);
        bool stop = s->stopping, close_listener = s->stop_accepting && s->listen_fd >= 0;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (close_listener) {
            epoll_ctl(s->ep, EPOLL_CTL_DEL, s->listen_fd, NULL);
            close(s->listen_fd);
            s->listen_fd = -1;
        }
        for (int i = 0; i < n; i++) {
            void *tag = ev[i].data.ptr;
            if (tag == &LISTEN_TAG) {
                accept_all(s);
            } else if (tag == &WAKE_TAG) {
                take_returned(s);
            } else { /* an fd appears once per epoll_wait; only its own event closes it */
                srv_conn *c = tag;
                uint32_t e = ev[i].events;
                if (c->state == CS_WRITE && (e & (EPOLLERR | EPOLLHUP)))
                    conn_close(s, c);
                else if (c->state == CS_WRITE && (e & EPOLLOUT))
                    conn_writable(s, c);
                else if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                    conn_readable(s, c);
            }
        }
        double now = srv_now();
        if (now - last_sweep >= 0.1) {
            sweep(s, now);
            last_sweep = now;
        }
        srv_maybe_log_stats(s);
    }
    return NULL;
}

/* ---- handler threads ------------------------------------------------------------------------------ */

static void *handler_main(void *arg)
{
    srv_conn *c = arg;
    srv *s = c->s;
    srv_serve_heavy(c);
    srv_access_log(c);
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < s->p.max_connections; i++)
        if (s->handled[i] == c) {
            s->handled[i] = NULL;
            break;
        }
    c->ret_next = s->returned;
    s->returned = c;
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof one);
    (void)w;
    s->n_handlers--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu); /* nothing of s is touched after this */
    return NULL;
}

static void start_handler(srv *s, srv_conn *c)
{
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    list_del(s, c);
    c->state = CS_HANDLER;
    c->on_handler = true;
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) & ~O_NONBLOCK);
    /* a client that stops reading its answer holds the thread at most this long per write */
    struct timeval tv = {.tv_sec = s->p.idle_timeout_s};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, SRV_STACK_BYTES);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&s->mu);
    s->n_handlers++;
    for (uint32_t i = 0; i < s->p.max_connections; i++)
        if (!s->handled[i]) {
            s->handled[i] = c;
            break;
        }
    pthread_t t;
    bool ok = pthread_create(&t, &at, handler_main, c) == 0;
    if (!ok) {
        for (uint32_t i = 0; i < s->p.max_connections; i++)
            if (s->handled[i] == c)
                s->handled[i] = NULL;
        s->n_handlers--;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_attr_destroy(&at);
    if (ok)
        return;
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    c->on_handler = false;
    c->state = CS_READ;
    list_add(s, c);
    ep_set(s, c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    srv_error e;
    srv_err(&e, 503, NULL, "cannot start a thread for the request; retry later");
    refuse(s, c, &e);
}

/* ---- start / stop ---------------------------------------------------------------------------------- */

vki_status srv_http_start(srv *s, char *err, size_t n_err)
{
    s->ep = s->wake_fd = s->reserve_fd = -1;
    vki_status st = VKI_OK;
    if (s->p.listen_fd >= 0) {
        s->listen_fd = s->p.listen_fd;
        fcntl(s->listen_fd, F_SETFL, fcntl(s->listen_fd, F_GETFL) | O_NONBLOCK);
    } else {
        st = srv_listen(s->p.host, s->p.port, &s->listen_fd, err, n_err);
    }
    if (st != VKI_OK)
        return st;
    size_fds(s);
    s->port = bound_port(s->listen_fd);
    s->handled = calloc(s->p.max_connections, sizeof *s->handled);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &LISTEN_TAG}, we = {.events = EPOLLIN, .data.ptr = &WAKE_TAG};
    if (!s->handled || s->ep < 0 || s->wake_fd < 0 || epoll_ctl(s->ep, EPOLL_CTL_ADD, s->listen_fd, &le) ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->wake_fd, &we)) {
        snprintf(err, n_err, "cannot set up the connection thread: %s", strerror(errno));
        return VKI_ERR_IO;
    }
    if (pthread_create(&s->io, NULL, io_main, s)) {
        snprintf(err, n_err, "cannot start the connection thread");
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    s->io_started = true;
    return VKI_OK;
}

void srv_http_stop_accepting(srv *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop_accepting = true;
    /* shutdown() stops a listening socket at once on Linux: connecting clients are refused
     * rather than left in a backlog; the io thread closes it at its next wake */
    if (s->listen_fd >= 0)
        shutdown(s->listen_fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    ssize_t w = s->wake_fd >= 0 ? write(s->wake_fd, &one, sizeof one) : 0;
    (void)w;
}

void srv_http_stop(srv *s)
{
    pthread_mutex_lock(&s->mu);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 1;
    while (s->n_handlers && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
        ;
    if (s->n_handlers) /* unblock handlers stuck writing to clients that do not read */
        for (uint32_t i = 0; s->handled && i < s->p.max_connections; i++)
            if (s->handled[i])
                shutdown(s->handled[i]->fd, SHUT_RDWR);
    while (s->n_handlers)
        pthread_cond_wait(&s->cv, &s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    if (s->io_started) {
        uint64_t one = 1;
        ssize_t w = write(s->wake_fd, &one, sizeof one);
        (void)w;
        pthread_join(s->io, NULL);
    }
    for (srv_conn *c = s->conns, *n; c; c = n) {
        n = c->next;
        conn_free(s, c);
    }
    for (srv_conn *c = s->returned, *n; c; c = n) {
        n = c->ret_next;
        conn_free(s, c);
    }
    s->conns = s->returned = NULL;
    int *fds[] = {&s->listen_fd, &s->ep, &s->wake_fd, &s->reserve_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
    free(s->handled);
    s->handled = NULL;
}
