/* `vkinfer chat`: an interactive conversation with the model's chat template.
 *
 * History stays in the KV cache between turns: the conversation's tokens are kept exactly
 * (prompt + generated ids), and each turn renders the whole conversation again only to find the
 * text the template adds after what the model saw (the end of the answer, the new user message,
 * the generation prompt); that text alone is tokenised and appended, so the batch manager's
 * prefix cache finds every full block of the earlier turns and only the new tokens are computed.
 * When the rendering of the history changes (templates that rewrite earlier turns), the whole
 * conversation is tokenised again and the cache still serves its unchanged prefix.
 *
 * gpt-oss (harmony): its reasoning goes to stderr (dimmed on a terminal) as it is generated, the
 * answer to stdout, and the history keeps the answer alone (its template drops earlier turns'
 * reasoning: the conversation is then tokenised again, its unchanged prefix still cached).
 *
 * Input: one turn per line; a line ending in '\' continues the turn on the next line (on a
 * terminal the prompt shows "..."). /clear forgets the history, /exit (or end of input) quits.
 * Ctrl-C stops the answer being generated, not the program: SIGINT is blocked in every thread
 * and read from a signalfd next to stdin and the answer's completion (no handler, no global). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "host/chat/chat_reply.h"
#include "host/cli/cli_common.h"
#include "host/util/strbuf.h"

#define MAX_STOPS 16

/* ---- templates (shared with generate --chat) -------------------------------------------------- */

bool cli_chat_open(const char *model_path, const char *family, const vki_tokenizer *tok, cli_chat *c)
{
    memset(c, 0, sizeof *c);
    char *tmpl = NULL, bos[64], eos[64], err[256] = "";
    chat_family f = CHAT_PLAIN;
    if (family) {
        if (!chat_family_parse(family, &f)) {
            fprintf(stderr, "vkinfer: --chat-template: unknown family '%s' (chatml, llama3, llama2, mistral, "
                    "zephyr, gemma, phi3, deepseek, harmony, tulu, granite, smollm3, exaone, glm4, command-r, plain)\n",
                    family);
            return false;
        }
        c->known = true;
    } else if (chat_template_from_gguf(model_path, &tmpl, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "vkinfer: chat template: %s\n", err);
        return false;
    } else {
        f = chat_detect(tmpl, &c->known);
        if (!c->known)
            fprintf(stderr, "vkinfer: chat template: %s; using the plain fallback (\"role: content\" lines)\n",
                    tmpl ? "not one of the known families" : "none in the model");
    }
    chat_token_texts(tok, bos, sizeof bos, eos, sizeof eos);
    vki_status st = chat_template_init(&c->t, f, tmpl, bos, eos);
    free(tmpl);
    if (st == VKI_OK)
        st = chat_specials_create(tok, &c->sp);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer: chat template: %s\n", vki_status_str(st));
        chat_template_free(&c->t);
        return false;
    }
    return true;
}

void cli_chat_close(cli_chat *c)
{
    chat_specials_free(c->sp);
    chat_template_free(&c->t);
}

bool cli_chat_tokens(cli_chat *c, const vki_tokenizer *tok, const chat_msg *m, size_t n, chat_prompt *keep,
                     int32_t **ids, size_t *n_ids)
{
    chat_prompt p;
    char err[256] = "";
    if (chat_render(&c->t, m, n, true, &p, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "vkinfer: chat template: %s\n", err[0] ? err : "cannot render the conversation");
        return false;
    }
    bool add_bos = c->t.family == CHAT_PLAIN && vki_tokenizer_adds_bos(tok);
    vki_status st = chat_tokenize(c->sp, tok, &p, add_bos, ids, n_ids);
    if (st != VKI_OK)
        fprintf(stderr, "vkinfer: cannot tokenize the conversation: %s\n", vki_status_str(st));
    if (keep && st == VKI_OK)
        *keep = p;
    else
        chat_prompt_free(&p);
    return st == VKI_OK;
}

/* ---- the conversation ------------------------------------------------------------------------ */

typedef struct turn_msg {
    chat_role role;
    char *text;
} turn_msg;

typedef struct chat_state {
    vki_engine *e;
    const vki_tokenizer *tok;
    vki_batch_manager *bm;
    cli_chat tmpl;
    vki_model_info mi;
    int sfd, done_fd;
    bool tty, timings, ignore_eos;
    vki_sampling_params sp;
    cli_constraint con;        /* --grammar / --json-schema: every answer follows it */
    uint32_t n_max;            /* -n: tokens per answer (0: the rest of the context) */
    char **stops;
    uint32_t n_stops;
    const char *system;
    turn_msg *msgs;            /* [n_msgs] */
    size_t n_msgs, cap_msgs;
    int32_t *hist;             /* [n_hist] every token the model has seen: prompt + answers */
    size_t n_hist;
    strbuf seen;               /* the rendered text the model has seen (same extent as hist) */
    uint64_t next_id;
    /* the answer being generated (worker thread writes, under mu) */
    pthread_mutex_t mu;
    chat_reply reply;          /* the text as it comes (harmony: reasoning apart) */
    bool err_tty, in_reasoning;/* stderr is a terminal (reasoning dimmed); a reasoning line is open */
    strbuf answer;             /* the answer's text so far */
    int32_t *gen;
    uint32_t n_gen, cap_gen, n_cached;
    bool final, stopped;
    vki_finish_reason finish;
    char error[192];
    double t0, t_first, t_end;
} chat_state;

static void clear_history(chat_state *c)
{
    for (size_t i = 0; i < c->n_msgs; i++)
        free(c->msgs[i].text);
    c->n_msgs = 0;
    c->n_hist = 0;
    strbuf_clear(&c->seen);
}

static bool push_msg(chat_state *c, chat_role role, const char *text)
{
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        turn_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m)
            return false;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *t = strdup(text);
    if (!t)
        return false;
    c->msgs[c->n_msgs++] = (turn_msg){role, t};
    return true;
}

/* The reply's last piece: reasoning to stderr (dimmed on a terminal), the answer to stdout. */
static void show(chat_state *c)
{
    const strbuf *r = &c->reply.reasoning, *a = &c->reply.answer;
    if (r->len) {
        fprintf(stderr, "%s%.*s%s", c->err_tty ? "\033[2m" : "", (int)r->len, r->p, c->err_tty ? "\033[0m" : "");
        fflush(stderr);
        c->in_reasoning = true;
    }
    if (a->len) {
        if (c->in_reasoning) /* the answer on a line of its own */
            fputs("\n", stderr);
        c->in_reasoning = false;
        fwrite(a->p, 1, a->len, stdout);
        fflush(stdout);
        strbuf_put(&c->answer, a->p, a->len);
    }
}

/* Worker thread: prints the answer as it comes. */
static void on_answer(void *user, const vki_response *r)
{
    chat_state *c = user;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        if (c->n_gen == c->cap_gen) {
            uint32_t cap = c->cap_gen ? 2 * c->cap_gen : 64;
            int32_t *g = realloc(c->gen, cap * sizeof *g);
            if (!g)
                break;
            c->gen = g;
            c->cap_gen = cap;
        }
        if (!c->n_gen)
            c->t_first = cli_now_s();
        c->gen[c->n_gen++] = r->tokens[i];
        bool stop = false;
        if (!c->stopped && chat_reply_push(&c->reply, r->tokens[i], &stop) == VKI_OK)
            show(c);
        if (stop && !c->stopped) {
            c->stopped = true;
            vki_batch_cancel(c->bm, r->id);
        }
    }
    c->n_cached = r->n_cached;
    if (r->final) {
        if (!c->stopped && chat_reply_finish(&c->reply) == VKI_OK)
            show(c);
        fflush(stdout);
        c->final = true;
        c->finish = r->finish;
        c->t_end = cli_now_s();
        snprintf(c->error, sizeof c->error, "%s", r->error ? r->error : "");
        uint64_t one = 1;
        ssize_t w = write(c->done_fd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&c->mu);
}

/* The prompt of this turn: the exact history plus the tokens of what the template adds after it,
 * or (when the history renders differently now) the whole conversation. *rendered: the new
 * rendering (the caller keeps it as `seen` once the answer is known). */
static bool turn_prompt(chat_state *c, chat_prompt *rendered, int32_t **ids, size_t *n)
{
    chat_msg *m = calloc(c->n_msgs + 1, sizeof *m);
    size_t k = 0;
    if (!m)
        return false;
    if (c->system)
        m[k++] = (chat_msg){CHAT_SYSTEM, c->system, strlen(c->system)};
    for (size_t i = 0; i < c->n_msgs; i++)
        m[k++] = (chat_msg){c->msgs[i].role, c->msgs[i].text, strlen(c->msgs[i].text)};
    int32_t *all = NULL;
    size_t n_all = 0;
    bool ok = cli_chat_tokens(&c->tmpl, c->tok, m, k, rendered, &all, &n_all);
    free(m);
    if (!ok)
        return false;
    bool extends = c->n_hist && rendered->len >= c->seen.len && !memcmp(rendered->text, c->seen.p, c->seen.len);
    if (!extends) {
        *ids = all;
        *n = n_all;
        return true;
    }
    free(all);
    /* the new text after what the model saw, with its template spans (control tokens) */
    chat_prompt tail = {0};
    size_t from = c->seen.len;
    ok = strbuf_put(&tail.buf, rendered->text + from, rendered->len - from);
    for (size_t i = 0; ok && i < rendered->n_tmpl; i++) {
        chat_span sp = rendered->tmpl[i];
        if (sp.off + sp.len <= from)
            continue;
        size_t lo = sp.off > from ? sp.off - from : 0, hi = sp.off + sp.len - from;
        if (tail.n_tmpl == tail.cap_tmpl) {
            size_t cap = tail.cap_tmpl ? 2 * tail.cap_tmpl : 8;
            chat_span *v = realloc(tail.tmpl, cap * sizeof *v);
            if (!(ok = v != NULL))
                break;
            tail.tmpl = v;
            tail.cap_tmpl = cap;
        }
        tail.tmpl[tail.n_tmpl++] = (chat_span){lo, hi - lo};
    }
    int32_t *d = NULL;
    size_t n_d = 0;
    ok = ok && chat_tokenize(c->tmpl.sp, c->tok, &tail, false, &d, &n_d) == VKI_OK;
    chat_prompt_free(&tail);
    /* an answer that ended with the end-of-turn token the template writes again: keep one */
    size_t skip = ok && n_d && c->n_hist && d[0] == c->hist[c->n_hist - 1] && vki_token_is_eog(c->tok, d[0]);
    *ids = ok ? malloc((c->n_hist + n_d) * sizeof **ids + 1) : NULL;
    if (*ids) {
        memcpy(*ids, c->hist, c->n_hist * sizeof **ids);
        memcpy(*ids + c->n_hist, d + skip, (n_d - skip) * sizeof **ids);
        *n = c->n_hist + n_d - skip;
    }
    free(d);
    return *ids != NULL;
}

/* Waits for the answer; Ctrl-C cancels it. */
static void wait_answer(chat_state *c, uint64_t id)
{
    bool cancelled = false;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        bool fin = c->final;
        pthread_mutex_unlock(&c->mu);
        if (fin)
            break;
        struct pollfd pf[2] = {{.fd = c->done_fd, .events = POLLIN}, {.fd = c->sfd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[0].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(c->done_fd, &v, sizeof v);
            (void)r;
        }
        if (pf[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            ssize_t r = read(c->sfd, &si, sizeof si);
            (void)r;
            if (!cancelled)
                vki_batch_cancel(c->bm, id);
            cancelled = true;
        }
    }
    if (cancelled)
        fputs(" [stopped]", stdout);
}

/* One exchange: the user's text in, the answer out. */
static void exchange(chat_state *c, const char *text)
{
    chat_prompt rendered = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (!push_msg(c, CHAT_USER, text) || !turn_prompt(c, &rendered, &ids, &n)) {
        if (c->n_msgs && c->msgs[c->n_msgs - 1].role == CHAT_USER)
            free(c->msgs[--c->n_msgs].text);
        return;
    }
    if (n + 1 >= c->mi.n_ctx) {
        fprintf(stderr, "vkinfer chat: the conversation (%zu tokens) fills the context (%u tokens): /clear to start "
                "over\n", n, c->mi.n_ctx);
        free(c->msgs[--c->n_msgs].text);
        free(ids);
        chat_prompt_free(&rendered);
        return;
    }
    uint32_t room = c->mi.n_ctx - (uint32_t)n, max_new = c->n_max && c->n_max < room ? c->n_max : room;
    c->n_gen = 0;
    c->final = c->stopped = c->in_reasoning = false;
    chat_reply_free(&c->reply);
    strbuf_clear(&c->answer);
    vki_status rs = chat_reply_init(&c->reply, c->tok, &c->tmpl.t, &rendered, (const char *const *)c->stops,
                                    c->n_stops, VKI_DETOK_STRIP_LEADING_SPACE);
    uint64_t id = c->next_id++;
    vki_request req = {.id = id, .prompt = ids, .n_prompt = (uint32_t)n, .max_new_tokens = max_new,
                       .ignore_eos = c->ignore_eos, .sampling = c->sp, .streaming = true, .constraint = c->con.c};
    char err[256] = "";
    c->t0 = cli_now_s();
    vki_status st = rs == VKI_OK ? vki_batch_submit(c->bm, &req, on_answer, c, err, sizeof err) : rs;
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer chat: %s%s%s\n", vki_status_str(st), err[0] ? ": " : "", err);
        free(c->msgs[--c->n_msgs].text);
    } else {
        wait_answer(c, id);
        fputs("\n", stdout);
        fflush(stdout);
    }
    if (st == VKI_OK && c->finish == VKI_FINISH_ERROR)
        fprintf(stderr, "vkinfer chat: %s\n", c->error);
    if (st == VKI_OK) { /* the history: what the model saw, exactly */
        size_t total = n + c->n_gen, cap = (size_t)c->n_gen * 16 + 16, got = 0;
        int32_t *h = realloc(c->hist, total * sizeof *h + 1);
        char *raw = malloc(cap), *shown = malloc(cap);
        size_t n_shown = 0;
        if (h && raw && shown && vki_detokenize(c->tok, c->gen, c->n_gen, 0, raw, cap, &got) == VKI_OK &&
            vki_detokenize(c->tok, c->gen, c->n_gen, VKI_DETOK_STRIP_LEADING_SPACE, shown, cap - 1, &n_shown) == VKI_OK) {
            memcpy(h, ids, n * sizeof *h);
            memcpy(h + n, c->gen, c->n_gen * sizeof *h);
            c->hist = h;
            c->n_hist = total;
            strbuf_clear(&c->seen);
            strbuf_put(&c->seen, rendered.text, rendered.len);
            strbuf_put(&c->seen, raw, got);
            shown[n_shown] = 0;
            /* harmony, Command R7B: the answer alone (the reasoning is not part of the turn) */
            push_msg(c, CHAT_ASSISTANT, c->reply.harmony || c->reply.cohere ? (c->answer.p ? c->answer.p : "") : shown);
        } else {
            if (h)
                c->hist = h;
            clear_history(c); /* cannot keep it exactly: start over rather than drift */
        }
        free(raw);
        free(shown);
        if (c->timings) {
            double tg = c->t_end - c->t_first;
            fprintf(stderr, "[prompt %zu tokens, %u from the cache; answer %u tokens, %.1f tokens/s]\n", n,
                    c->n_cached, c->n_gen, c->n_gen > 1 && tg > 0 ? (c->n_gen - 1) / tg : 0.0);
        }
    }
    free(ids);
    chat_prompt_free(&rendered);
}

/* ---- input ------------------------------------------------------------------------------------ */

typedef struct reader {
    char buf[4096];
    size_t len, pos;
    bool eof;
} reader;

/* One line from stdin into *line (without its newline). 1: a line, 0: end of input, -1: Ctrl-C. */
static int read_line(chat_state *c, reader *r, strbuf *line)
{
    strbuf_clear(line);
    for (;;) {
        for (; r->pos < r->len; r->pos++) {
            if (r->buf[r->pos] == '\n') {
                r->pos++;
                return strbuf_put(line, "", 0) ? 1 : 0;
            }
            strbuf_put(line, r->buf + r->pos, 1);
        }
        if (r->eof)
            return line->len ? 1 : 0;
        struct pollfd pf[2] = {{.fd = 0, .events = POLLIN}, {.fd = c->sfd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            return 0;
        if (pf[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            ssize_t n = read(c->sfd, &si, sizeof si);
            (void)n;
            return -1;
        }
        if (pf[0].revents & (POLLIN | POLLHUP)) {
            ssize_t n = read(0, r->buf, sizeof r->buf);
            r->pos = 0;
            r->len = n > 0 ? (size_t)n : 0;
            r->eof = n <= 0;
        }
    }
}

/* A turn: lines joined while they end with '\'. 1: a turn, 0: end of input, -1: Ctrl-C. */
static int read_turn(chat_state *c, reader *r, strbuf *turn)
{
    strbuf line = {0};
    strbuf_clear(turn);
    strbuf_put(turn, "", 0);
    int rc;
    for (bool first = true;; first = false) {
        if (c->tty) {
            fputs(first ? "> " : "... ", stdout);
            fflush(stdout);
        }
        rc = read_line(c, r, &line);
        if (rc <= 0)
            break;
        bool more = line.len && line.p[line.len - 1] == '\\';
        strbuf_put(turn, line.p, line.len - more);
        if (!more)
            break;
        strbuf_put(turn, "\n", 1);
    }
    strbuf_free(&line);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer chat -m MODEL.gguf [options]\n"
            "An interactive conversation in the model's chat template; the history stays in the KV cache.\n"
            "One turn per line; end a line with \\ to continue the turn. /clear forgets the history,\n"
            "/exit or end of input quits, Ctrl-C stops the answer being written.\n"
            "  --system TEXT           a system message first\n"
            "  -n, --n-predict N       tokens per answer at most (default: the rest of the context)\n"
            "  --stop STR              stop string (repeatable; escapes interpreted)\n"
            "  --chat-template NAME    chatml|llama3|llama2|mistral|zephyr|gemma|phi3|deepseek|harmony|tulu|\n"
            "                          granite|smollm3|exaone|glm4|command-r|plain\n"
            "                          (default: the model's tokenizer.chat_template; harmony, gpt-oss's:\n"
            "                          its reasoning on stderr, dimmed on a terminal, the answer on stdout)\n"
            "  --ignore-eos            answers run to -n (benchmarks, tests)\n"
            "  --timings               after each answer, a line on stderr: prompt tokens, how many came\n"
            "                          from the cache, answer tokens and speed\n");
    cli_constraint_help(f);
    cli_sampling_help(f);
    cli_engine_opts_help(f);
}

static int chat_opt(int argc, char **argv, int *i, chat_state *c, const char **family, char **stops,
                    uint64_t *n_max)
{
    if (!strcmp(argv[*i], "--timings"))
        return c->timings = true, 1;
    if (!strcmp(argv[*i], "--ignore-eos"))
        return c->ignore_eos = true, 1;
    static const char *const names[] = {"--system", "-n", "--n-predict", "--stop", "--chat-template"};
    size_t k;
    const char *v;
    int r = cli_value_opt("chat", argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    if (k == 0)
        c->system = v;
    else if (k <= 2)
        return cli_parse_u64("chat", argv[*i - 1], v, 1, 1u << 24, n_max) ? 1 : -1;
    else if (k == 3 && c->n_stops < MAX_STOPS)
        return cli_unescape("chat", "--stop", argv[*i]) && argv[*i][0] ? (stops[c->n_stops++] = argv[*i], 1) : -1;
    else if (k == 4)
        *family = v;
    else
        return fprintf(stderr, "vkinfer chat: at most %d --stop strings\n", MAX_STOPS), -1;
    return 1;
}

static int converse(chat_state *c)
{
    reader r = {0};
    strbuf turn = {0};
    for (;;) {
        int rc = read_turn(c, &r, &turn);
        if (rc == 0)
            break;
        if (rc < 0) { /* Ctrl-C at the prompt: the turn is dropped, the program goes on */
            fputs(c->tty ? "\n(Ctrl-C: the turn was dropped; /exit quits)\n" : "", stdout);
            continue;
        }
        if (!strcmp(turn.p, "/exit") || !strcmp(turn.p, "/quit"))
            break;
        if (!strcmp(turn.p, "/clear")) {
            clear_history(c);
            fputs("(history cleared)\n", stdout);
            continue;
        }
        if (turn.p[0])
            exchange(c, turn.p);
    }
    strbuf_free(&turn);
    return 0;
}

int vki_cli_chat(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    char *stops[MAX_STOPS];
    const char *family = NULL;
    uint64_t n_max = 0;
    chat_state c = {.sp = vki_sampling_default_params(), .stops = stops, .next_id = 1,
                    .mu = PTHREAD_MUTEX_INITIALIZER, .sfd = -1, .done_fd = -1};
    c.sp.temperature = 0; /* greedy by default, like generate */
    for (int i = 1; i < argc; i++) {
        int rc = cli_engine_opt(argc, argv, &i, &eo);
        if (rc == 0)
            rc = cli_sampling_opt("chat", argc, argv, &i, &c.sp);
        if (rc == 0)
            rc = chat_opt(argc, argv, &i, &c, &family, stops, &n_max);
        if (rc == 0)
            rc = cli_constraint_opt("chat", argc, argv, &i, &c.con);
        if (rc > 0)
            continue;
        cli_constraint_free(&c.con);
        if (rc < 0)
            return 2;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(stdout), 0;
        fprintf(stderr, "vkinfer chat: unknown or incomplete option '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    c.n_max = (uint32_t)n_max;
    c.tty = isatty(0) && isatty(1);
    c.err_tty = isatty(2);
    if (!eo.max_seqs_set)
        eo.p.max_seqs = 1; /* one conversation: the KV pool is sized for one sequence */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread: every thread inherits it */
    c.sfd = signalfd(-1, &set, SFD_CLOEXEC);
    c.done_fd = eventfd(0, EFD_CLOEXEC);
    int rc = 1;
    vki_batch_params bp = vki_batch_default_params();
    if (c.sfd >= 0 && c.done_fd >= 0 && (c.e = cli_open_engine(&eo))) {
        c.tok = vki_engine_tokenizer(c.e);
        vki_engine_info(c.e, &c.mi);
        if (cli_chat_open(eo.model, family, c.tok, &c.tmpl)) {
            if (vki_batch_manager_create(c.e, &bp, NULL, &c.bm) == VKI_OK) {
                if (c.tty)
                    fprintf(stderr, "vkinfer chat: /clear forgets the history, /exit quits, Ctrl-C stops an "
                            "answer; end a line with \\ to continue it\n");
                rc = converse(&c);
                vki_batch_manager_destroy(c.bm, true);
            }
            cli_chat_close(&c.tmpl);
        }
        cli_print_profile(&eo, c.e); /* --profile: the top ops by GPU time */
        vki_engine_destroy(c.e);
    }
    clear_history(&c);
    cli_constraint_free(&c.con);
    free(c.msgs);
    free(c.hist);
    free(c.gen);
    strbuf_free(&c.seen);
    strbuf_free(&c.answer);
    chat_reply_free(&c.reply);
    if (c.sfd >= 0)
        close(c.sfd);
    if (c.done_fd >= 0)
        close(c.done_fd);
    return rc;
}
