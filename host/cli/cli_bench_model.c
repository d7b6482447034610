/* `vkinfer bench-model`: a model benchmark in the spirit of llama-bench, on the engine's step
 * interface (no scheduler, no tokenizer), so a number is the engine's and nothing else's.
 *
 *   ppN  prompt processing: B sequences of N prompt tokens from position 0, chunked so a step
 *        holds at most --max-tokens tokens; the last chunk samples a token, as in serving.
 *   tgN  generation: B sequences at context C (--depth) each generate N tokens, one decode step
 *        per token for all B (greedy, or drawn with --temp / --top-k / --top-p / --min-p; each
 *        sampled token fed back). With --overlap each step is
 *        submitted before the previous one is waited for, its tokens read on the device
 *        (VKI_TOKEN_PREV): the host's work per step hides behind the device's.
 *
 * For generation it reports the bytes a step must read (every weight matrix, the norms and the
 * LM head once per step, of a mixture of experts only the experts the step's tokens pick: n_used
 * per layer at batch 1; one embedding row and the KV cache of its context per sequence) over
 * the time, as a fraction of the copy bandwidth the copy kernel reaches on the same device in
 * the same run; for both, host time on the step's critical path (everything but the fence
 * wait) and TFLOP/s. The tg context is random values written into each sequence's own KV pages
 * rather than a prefill: the same bytes and arithmetic as a real context, without running
 * B x C prompt tokens first (256 x 512 on an 8B model would take longer than the test).
 *
 * A program that prints numbers (a table; --json: one object per test and batch on stdout);
 * it asserts nothing about speed. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/quant.h"
#include "engine/rng.h"
#include "host/api/engine_api.h"
#include "host/cli/cli.h"
#include "host/cli/cli_common.h"
#include "host/cli/devprobe.h"

#define BM_MAX_BATCHES 16
#define BM_MAX_BATCH 4096

typedef struct bm_opts {
    cli_engine_opts eo;
    uint32_t pp, tg, ctx;                  /* prompt tokens, generated tokens, context of tg
                                              (--depth) */
    uint32_t pp_b[BM_MAX_BATCHES], n_pp_b; /* sequences per pp test */
    uint32_t tg_b[BM_MAX_BATCHES], n_tg_b; /* sequences per tg test */
    uint32_t reps;                         /* timed runs per test; the median is reported */
    uint32_t copy_mib;                     /* copy probe size; 0: devprobe's default */
    bool json;
    bool overlap;                          /* tg: two steps in flight */
    bool sampled;                          /* a sampling option given: sp, else greedy */
    vki_sampling_params sp;
    const char *commit;
    char command[2048];
} bm_opts;

/* What the model costs per step, from its tensors on the device and its GGUF metadata. */
typedef struct bm_model {
    char name[128], weight_type[16], arch[16];
    uint64_t n_params;         /* elements of every tensor in the file */
    double weight_bytes;       /* read once per step: layers (matrices, norms, biases), output
                                  norm, LM head; not the embedding table (gathered by row), not
                                  the experts of a mixture of experts (expert_bytes) */
    double expert_bytes;       /* one expert of every layer (its gate, up, down): a step reads the
                                  experts its tokens pick, not all of them (active_experts) */
    uint32_t n_expert, n_used; /* experts per layer and per token (0: dense) */
    double embd_row_bytes;     /* one token_embd row, per token */
    double kv_bytes_pos;       /* K and V of one position, all layers */
    double layer_flops_token;  /* 2 x layer matrix elements: per token through every layer */
    double head_flops_row;     /* 2 x LM head elements: per row that samples */
    double attn_flops_key;     /* 4 x n_head x head_dim x n_layer: per (query, key) pair */
} bm_model;

/* One timed run of one test. */
typedef struct bm_run {
    double sec;                /* wall time of the run's steps */
    double host_ms;            /* host time on the steps' critical path, summed */
    double bytes, flops;       /* read by / computed in the run's steps */
    double dispatches, barriers; /* recorded in the run's steps, summed */
    double reused;               /* steps whose command buffer was submitted again, not recorded */
    uint32_t steps;
} bm_run;

/* The benchmark's sequences: slot i owns pages [i * pages_per_seq, ...). */
typedef struct bm_state {
    vk_engine *e;
    const bm_model *m;
    uint32_t max_b, pages_per_seq, chunk_budget;
    uint32_t *pages;           /* [max_b * pages_per_seq] */
    int32_t *tokens;           /* [max_b * pp] prompts, then [max_b] the last sampled tokens */
    vki_step_seq *seqs;        /* [max_b] */
    vki_step_out *outs;        /* [max_b] */
    uint64_t rng;
    const vki_sampling_params *sampling; /* every row's (NULL: greedy) */
} bm_state;

/* ---- options ------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer bench-model -m MODEL.gguf [options]\n"
            "  -p, --pp N            prompt tokens per sequence of the pp test (512; 0: no pp)\n"
            "  -n, --tg N            generated tokens per sequence of the tg test (128; 0: no tg)\n"
            "  -d, --depth C         context each sequence holds when tg starts (512; the JSON's\n"
            "                        \"context\")\n"
            "  --pp-batches LIST     sequences per pp run, comma-separated (1)\n"
            "  --tg-batches LIST     sequences per tg run (1,2,4,8,16,32,64,256)\n"
            "  -r, --reps N          timed runs per test, the median reported (1)\n"
            "  --copy-mib N          size of the copy-bandwidth probe (default: 512 on GPUs)\n"
            "  --overlap             tg: submit each step before waiting for the previous one (its tokens\n"
            "                        read on the device), hiding the host's work per step\n"
            "  --temp T, --top-k K, --top-p P, --min-p P\n"
            "                        every row drawn with these (default greedy), e.g. Ollama's 0.8 / 40 /\n"
            "                        0.9: the sampler's share of a step; the JSON's \"sampling\"\n"
            "  --commit STR          recorded in the JSON (tools/gpu-check passes the staged commit)\n"
            "  --json                one JSON object per test on stdout (the table goes to stderr)\n"
            "The KV cache, sequence slots, context and step size are sized from the tests (--kv-tokens,\n"
            "--max-seqs and --ctx are ignored; --max-tokens bounds the tokens of a prefill step, 2048).\n");
    cli_engine_opts_help(f);
}

/* "1,2,4" into out[]; false (message printed) on a bad list. */
static bool parse_list(const char *opt, const char *s, uint32_t *out, uint32_t *n)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (*n == BM_MAX_BATCHES) {
            fprintf(stderr, "vkinfer bench-model: %s: at most %d entries\n", opt, BM_MAX_BATCHES);
            return false;
        }
        if (!cli_parse_u64("bench-model", opt, tok, 1, BM_MAX_BATCH, &v))
            return false;
        out[(*n)++] = (uint32_t)v;
    }
    if (!*n)
        fprintf(stderr, "vkinfer bench-model: %s needs at least one number\n", opt);
    return *n > 0;
}

/* Applies one option with a value (argv[*i] is the option, *value its argument). 1: taken, 0:
 * not one of ours, -1: bad value (printed). */
static int number_opt(bm_opts *o, const char *a, const char *v)
{
    static const struct { const char *name, *alias; size_t off; uint64_t lo, hi; } nums[] = {
        {"--pp", "-p", offsetof(bm_opts, pp), 0, 1u << 20},
        {"--tg", "-n", offsetof(bm_opts, tg), 0, 1u << 20},
        {"--depth", "-d", offsetof(bm_opts, ctx), 0, 1u << 24},
        {"--reps", "-r", offsetof(bm_opts, reps), 1, 64},
        {"--copy-mib", NULL, offsetof(bm_opts, copy_mib), 0, 1u << 16},
    };
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        if (strcmp(a, nums[k].name) && (!nums[k].alias || strcmp(a, nums[k].alias)))
            continue;
        uint64_t u;
        if (!cli_parse_u64("bench-model", a, v, nums[k].lo, nums[k].hi, &u))
            return -1;
        *(uint32_t *)((char *)o + nums[k].off) = (uint32_t)u;
        return 1;
    }
    if (!strcmp(a, "--pp-batches"))
        return parse_list(a, v, o->pp_b, &o->n_pp_b) ? 1 : -1;
    if (!strcmp(a, "--tg-batches"))
        return parse_list(a, v, o->tg_b, &o->n_tg_b) ? 1 : -1;
    if (!strcmp(a, "--commit"))
        return o->commit = v, 1;
    return 0;
}

/* 0: parsed; 1: --help printed; 2: usage error (printed). */
static int parse(int argc, char **argv, bm_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(stdout), 1;
        if (!strcmp(a, "--json") || !strcmp(a, "--overlap")) {
            *(a[2] == 'j' ? &o->json : &o->overlap) = true;
            continue;
        }
        static const char *const sampling[] = {"--temp", "--top-k", "--top-p", "--min-p"};
        bool is_sampling = false;
        for (size_t k = 0; k < sizeof sampling / sizeof sampling[0]; k++)
            is_sampling = is_sampling || !strcmp(a, sampling[k]);
        if (is_sampling) {
            if (cli_sampling_opt("bench-model", argc, argv, &i, &o->sp) <= 0)
                return 2;
            o->sampled = true;
            continue;
        }
        int r = cli_engine_opt(argc, argv, &i, &o->eo);
        if (r == 0 && i + 1 < argc && (r = number_opt(o, a, argv[i + 1])) > 0)
            i++;
        if (r < 0)
            return 2;
        if (r == 0) {
            fprintf(stderr, "vkinfer bench-model: unknown or incomplete option '%s' (--help)\n", a);
            return 2;
        }
    }
    if (!o->eo.model) {
        fprintf(stderr, "vkinfer bench-model: no model given (-m FILE.gguf)\n");
        return 2;
    }
    if (!o->pp && !o->tg) {
        fprintf(stderr, "vkinfer bench-model: nothing to run (--pp 0 and --tg 0)\n");
        return 2;
    }
    if (o->overlap && (o->eo.p.profile_path || o->eo.p.capture_first >= 0)) {
        fprintf(stderr, "vkinfer bench-model: --overlap keeps two steps in flight, which a profile or a capture "
                "(one recording per step) does not allow\n");
        return 2;
    }
    return 0;
}

/* ---- model accounting ------------------------------------------------------------------------ */

/* Name, file type and parameter count from the GGUF's metadata and tensor table. */
static vki_status read_file_facts(const char *path, const vki_model_info *mi, bm_model *m)
{
    char err[256];
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, sizeof err);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer bench-model: %s\n", err);
        return st;
    }
    uint32_t ft;
    const char *fname = gguf_get_u32(f, "general.file_type", &ft) == VKI_OK ? gguf_file_type_name(ft) : NULL;
    snprintf(m->weight_type, sizeof m->weight_type, "%s", fname ? fname : mi->weight_type);
    snprintf(m->name, sizeof m->name, "%s", mi->name);
    snprintf(m->arch, sizeof m->arch, "%s", mi->arch);
    m->n_params = gguf_n_params(f);
    gguf_close(f);
    return VKI_OK;
}

static double elems(const vk_tensor *t) { return t->n_parts ? (double)t->ne0 * (double)t->n_rows : 0; }

/* What a full read of the tensor moves, counted as its GGUF bytes: neither allocation padding
 * (vk_tensor_bytes) nor the few bytes a scale-grouped row's short last group adds on the device
 * (vki_shared.h; none on rows of a multiple of 8 blocks) count, so bw_fraction never gains from
 * them. */
static double bytes_of(const vk_tensor *t) { return t->n_parts ? (double)t->n_rows * (double)t->src_row_bytes : 0; }

/* Bytes and FLOPs per step from the tensors the forward pass reads. */
static void account(const vk_engine *e, bm_model *m)
{
    const vk_model *md = &e->model;
    const model_hparams *hp = &md->hp;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const vk_layer *L = &md->layers[il];
        const vk_tensor *all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wqkv, &L->bq, &L->bk, &L->bv,
                                  &L->q_norm, &L->k_norm, &L->wo, &L->post_attn_norm, &L->ffn_norm, &L->w_gate,
                                  &L->w_up, &L->w_down, &L->post_ffn_norm};
        const vk_tensor *mats[] = {&L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                   &L->router};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            m->weight_bytes += bytes_of(all[i]);
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            m->layer_flops_token += 2 * elems(mats[i]);
        /* mixture of experts: the router is read every step; each token runs n_used experts */
        const vk_tensor *exps[] = {&L->w_gate_exps, &L->w_up_exps, &L->w_down_exps};
        m->weight_bytes += bytes_of(&L->router);
        for (size_t i = 0; hp->n_expert && i < 3; i++) {
            m->expert_bytes += bytes_of(exps[i]) / hp->n_expert;
            m->layer_flops_token += 2 * elems(exps[i]) / hp->n_expert * hp->n_expert_used;
        }
    }
    m->n_expert = hp->n_expert, m->n_used = hp->n_expert_used;
    const vk_tensor *head = vk_model_lm_head(md);
    m->weight_bytes += bytes_of(&md->output_norm) + bytes_of(head);
    m->head_flops_row = 2 * elems(head);
    m->embd_row_bytes = (double)md->tok_embd.src_row_bytes;
    /* a head's K (or V) row as the pool stores it: F32, F16, or Q8_0's int8 values and f16 scales */
    m->kv_bytes_pos = 2.0 * hp->n_layer * hp->n_head_kv * vk_engine_kv_row_bytes(e);
    m->attn_flops_key = 4.0 * hp->n_head * hp->head_dim * hp->n_layer;
}

/* Distinct experts per layer that a step of B tokens reads: exactly n_used for one token; for
 * more, the expectation under uniform routing, E (1 - (1 - k/E)^B) (real routers are skewed:
 * fewer distinct experts, so this is an upper estimate of the bytes). 0 for dense models. */
static double active_experts(const bm_model *m, uint32_t B)
{
    if (!m->n_expert)
        return 0;
    if (B == 1)
        return m->n_used;
    return m->n_expert * (1.0 - pow(1.0 - (double)m->n_used / m->n_expert, B));
}

/* ---- the engine, sized for the tests ------------------------------------------------------ */

static uint32_t max_of(const uint32_t *v, uint32_t n)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* Sequence slots, KV pages and step size for every test; then the engine. */
static vki_engine *open_sized(bm_opts *o, bm_state *s)
{
    uint32_t max_pp = o->pp ? max_of(o->pp_b, o->n_pp_b) : 0, max_tg = o->tg ? max_of(o->tg_b, o->n_tg_b) : 0;
    uint32_t len = o->ctx + (o->tg > 2 ? o->tg : 2); /* warm-up decode steps write 2 positions */
    len = o->tg ? len : 0;
    len = o->pp > len ? o->pp : len;
    vki_engine_params *p = &o->eo.p;
    s->max_b = max_pp > max_tg ? max_pp : max_tg;
    s->chunk_budget = p->max_tokens;
    s->pages_per_seq = (len + p->page_size - 1) / p->page_size;
    p->max_seqs = s->max_b;
    p->max_tokens = s->chunk_budget > max_tg ? s->chunk_budget : max_tg;
    p->max_ctx = len;
    p->kv_tokens = (uint64_t)s->max_b * s->pages_per_seq * p->page_size;
    return cli_open_engine(&o->eo);
}

/* The pool may hold fewer pages than asked for: one pool is one storage binding. So may a step
 * hold fewer tokens or sequences (the engine caps max_tokens / max_seqs where activation or
 * logits rows would pass a binding): prefill chunks shrink to its max_tokens; the largest batch
 * must fit both. */
static bool check_capacity(bm_state *s)
{
    const vk_engine_params *ep = &s->e->p;
    if (s->max_b > ep->max_seqs || s->max_b > ep->max_tokens) {
        fprintf(stderr, "vkinfer bench-model: a batch of %u sequences; this device's binding limit allows %u "
                "tokens and %u sequences a step for this model (--tg-batches, --pp-batches)\n", s->max_b,
                ep->max_tokens, ep->max_seqs);
        return false;
    }
    if (s->chunk_budget > ep->max_tokens)
        s->chunk_budget = ep->max_tokens;
    uint64_t need = (uint64_t)s->max_b * s->pages_per_seq;
    if (s->e->n_pages >= need)
        return true;
    fprintf(stderr, "vkinfer bench-model: %u sequences x %u KV pages need %llu pages per layer; this device's "
            "binding limit allows %u: fewer or shorter sequences (--tg-batches, --ctx, --tg, --pp)\n", s->max_b,
            s->pages_per_seq, (unsigned long long)need, s->e->n_pages);
    return false;
}

/* Every KV page the tests use gets random values (finite, |x| <= 1): a chunk made on the host,
 * uploaded once, copied over the pools on the device. */
static vki_status fill_kv_random(bm_state *s)
{
    vk_engine *e = s->e;
    VkDeviceSize pool = (VkDeviceSize)s->max_b * s->pages_per_seq * op_kv_page_bytes(&e->attn[0].s);
    size_t chunk = pool < (64u << 20) ? (size_t)pool : (64u << 20);
    bool f16 = e->p.kv_type == VKI_GGML_F16;
    uint8_t *h = malloc(chunk);
    vkd_buffer *src = NULL;
    vkd_cmd c = {0};
    if (!h)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < chunk / (f16 ? 2 : 4); i++) {
        float v = (float)((vki_splitmix64(&s->rng) >> 40) * (2.0 / 16777216.0) - 1.0);
        uint16_t hv = quant_f32_to_f16(v);
        memcpy(h + i * (f16 ? 2 : 4), f16 ? (const void *)&hv : (const void *)&v, f16 ? 2 : 4);
    }
    vki_status st = vkd_buffer_create(e->dev, chunk, VKD_MEM_DEVICE, "bench kv fill", &src);
    if (st == VKI_OK)
        st = vkd_upload(e->dev, src, 0, h, chunk);
    if (st == VKI_OK)
        st = vkd_cmd_create(e->dev, "bench kv fill", &c);
    if (st == VKI_OK)
        st = vkd_cmd_begin(&c);
    for (uint32_t il = 0; st == VKI_OK && il < e->model.hp.n_layer; il++)
        for (VkDeviceSize off = 0; off < pool; off += chunk) {
            VkDeviceSize n = pool - off < chunk ? pool - off : chunk;
            vkd_copy(&c, src, 0, e->k_pool[il], off, n);
            vkd_copy(&c, src, 0, e->v_pool[il], off, n);
        }
    if (st == VKI_OK)
        st = vkd_cmd_submit_wait(&c);
    vkd_cmd_destroy(&c);
    vkd_buffer_destroy(e->dev, src);
    free(h);
    return st;
}

/* ---- steps --------------------------------------------------------------------------------- */

/* Submits one step of the first n_seqs entries of s->seqs; its recording costs go into run. */
static vki_status submit(bm_state *s, uint32_t n_seqs, uint32_t n_tokens, bm_run *run)
{
    vki_step_plan plan = {.n_seqs = n_seqs, .seqs = s->seqs, .n_tokens = n_tokens};
    uint64_t reused0 = s->e->steps_reused;
    vki_status st = vk_engine_submit(s->e, &plan);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer bench-model: step of %u sequences, %u tokens: %s\n", n_seqs, n_tokens,
                vki_status_str(st));
        return st;
    }
    if (run) {
        run->reused += s->e->steps_reused != reused0;
        run->dispatches += s->e->last_dispatches;
        run->barriers += s->e->last_barriers;
        run->steps++;
    }
    return VKI_OK;
}

/* Waits for the oldest step in flight (its tokens into s->outs); its host share goes into run. */
static vki_status wait_step(bm_state *s, bm_run *run)
{
    vki_status st = vk_engine_wait(s->e, s->outs, NULL);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer bench-model: step: %s\n", vki_status_str(st));
        return st;
    }
    if (run)
        run->host_ms += s->e->last_step_ms - s->e->last_wait_ms;
    return VKI_OK;
}

/* One step, waited for. */
static vki_status step(bm_state *s, uint32_t n_seqs, uint32_t n_tokens, bm_run *run)
{
    vki_status st = submit(s, n_seqs, n_tokens, run);
    return st == VKI_OK ? wait_step(s, run) : st;
}

static vki_step_seq seq_at(bm_state *s, uint32_t i, uint32_t pos0, uint32_t n_new, const int32_t *tokens, bool want)
{
    return (vki_step_seq){.slot = i, .pos0 = pos0, .n_new = n_new, .tokens = tokens,
                          .n_pages = s->pages_per_seq, .pages = s->pages + (size_t)i * s->pages_per_seq,
                          .want_token = want, .sampling = s->sampling, .seed = i};
}

/* B prompts of pp tokens from position 0, in lockstep chunks within the step budget. */
static vki_status run_pp(bm_state *s, uint32_t B, uint32_t pp, bm_run *run)
{
    uint32_t chunk = s->chunk_budget / B ? s->chunk_budget / B : 1;
    chunk = chunk < pp ? chunk : pp;
    double t0 = cli_now_s();
    for (uint32_t q0 = 0; q0 < pp; q0 += chunk) {
        uint32_t n = pp - q0 < chunk ? pp - q0 : chunk;
        for (uint32_t i = 0; i < B; i++)
            s->seqs[i] = seq_at(s, i, q0, n, s->tokens + (size_t)i * pp + q0, q0 + n == pp);
        vki_status st = step(s, B, B * n, run);
        if (st != VKI_OK)
            return st;
    }
    if (run) {
        run->sec = cli_now_s() - t0;
        const bm_model *m = s->m;
        run->flops = (double)B * (pp * m->layer_flops_token + m->head_flops_row +
                                  m->attn_flops_key * 0.5 * pp * (pp + 1.0));
    }
    return VKI_OK;
}

/* B sequences at context ctx generate n tokens (decode steps from position ctx); overlap: step
 * k + 1 submitted before step k is waited for, its tokens those step k samples on the device. */
static vki_status run_tg(bm_state *s, uint32_t B, uint32_t ctx, uint32_t n, bool overlap, bm_run *run)
{
    static const int32_t prev = VKI_TOKEN_PREV;
    int32_t *last = s->tokens;
    for (uint32_t i = 0; i < B; i++)
        last[i] = (int32_t)(vki_splitmix64(&s->rng) % s->e->model.hp.n_vocab);
    const bm_model *m = s->m;
    double t0 = cli_now_s();
    for (uint32_t k = 0; k < n; k++) {
        for (uint32_t i = 0; i < B; i++)
            s->seqs[i] = seq_at(s, i, ctx + k, 1, overlap && k ? &prev : &last[i], true);
        vki_status st = overlap ? submit(s, B, B, run) : step(s, B, B, run);
        if (st == VKI_OK && overlap && (k || n == 1))
            st = wait_step(s, run); /* step k - 1 (or the only one) */
        if (st != VKI_OK)
            return st;
        for (uint32_t i = 0; i < B; i++)
            last[i] = s->outs[i].token >= 0 ? s->outs[i].token : last[i];
        if (run) {
            double keys = (double)B * (ctx + k + 1.0);
            run->bytes += m->weight_bytes + active_experts(m, B) * m->expert_bytes + B * m->embd_row_bytes +
                          keys * m->kv_bytes_pos;
            run->flops += B * (m->layer_flops_token + m->head_flops_row) + keys * m->attn_flops_key;
        }
    }
    vki_status st = overlap && n > 1 ? wait_step(s, run) : VKI_OK; /* the last step */
    if (run)
        run->sec = cli_now_s() - t0;
    return st;
}

/* Warm-up, then reps timed runs; *out is the run with the median time. */
static vki_status measure(bm_state *s, bool pp, uint32_t B, const bm_opts *o, bm_run *out)
{
    bm_run runs[64];
    vki_status st = pp ? run_pp(s, B, o->pp, NULL) : run_tg(s, B, o->ctx, 2, o->overlap, NULL);
    for (uint32_t r = 0; st == VKI_OK && r < o->reps; r++) {
        runs[r] = (bm_run){0};
        if (pp) {
            for (size_t i = 0; i < (size_t)B * o->pp; i++) /* fresh prompts: no run repeats another */
                s->tokens[i] = (int32_t)(vki_splitmix64(&s->rng) % s->e->model.hp.n_vocab);
            st = run_pp(s, B, o->pp, &runs[r]);
        } else {
            st = run_tg(s, B, o->ctx, o->tg, o->overlap, &runs[r]);
        }
    }
    if (st != VKI_OK)
        return st;
    for (uint32_t i = 1; i < o->reps; i++)
        for (uint32_t j = i; j > 0 && runs[j].sec < runs[j - 1].sec; j--) {
            bm_run x = runs[j];
            runs[j] = runs[j - 1];
            runs[j - 1] = x;
        }
    *out = runs[o->reps / 2];
    return VKI_OK;
}

/* ---- output --------------------------------------------------------------------------------- */

typedef struct bm_report {
    const bm_opts *o;
    const bm_model *m;
    const vkd_device *d;
    devprobe_copy copy;
    FILE *table;
    bool int_dot; /* the engine's decode projections on the integer-dot path */
} bm_report;

/* The sampling options as the table and the JSON's "sampling" give them. */
static const char *sampling_desc(const bm_opts *o, char *buf, size_t n)
{
    snprintf(buf, n, "temp %g, top_k %d, top_p %g, min_p %g", o->sp.temperature, o->sp.top_k, o->sp.top_p,
             o->sp.min_p);
    return buf;
}

static void report_header(const bm_report *r, const vk_engine *e)
{
    fprintf(r->table, "device: %s (%s %s); copy kernel: %.1f GB/s read + write (%.0f MiB, %.1f us)\n", r->d->info.name,
            r->d->info.driver_name, r->d->info.driver_info, r->copy.gbps, r->copy.bytes / 1048576.0,
            r->copy.us_per_call);
    double np = (double)r->m->n_params;
    char experts[64] = "";
    if (r->m->n_expert)
        snprintf(experts, sizeof experts, " (batch 1: %u of %u experts)", r->m->n_used, r->m->n_expert);
    fprintf(r->table, "model: %s (%s, %s, %.2f %s params, %.3f GiB read per step%s + KV), KV %s, page %u\n",
            r->m->name, r->m->arch, r->m->weight_type, np >= 1e9 ? np * 1e-9 : np * 1e-6, np >= 1e9 ? "B" : "M",
            (r->m->weight_bytes + active_experts(r->m, 1) * r->m->expert_bytes) / 1073741824.0, experts,
            e->p.kv_type == VKI_GGML_F16 ? "f16" : "f32", e->p.page_size);
    char sp[96];
    if (r->o->sampled)
        fprintf(r->table, "sampling: %s (every row drawn)\n", sampling_desc(r->o, sp, sizeof sp));
    fprintf(r->table, "%-8s %6s %7s %8s %10s %9s %12s %9s %6s %8s\n", "test", "n_seqs", "context", "tokens", "tok/s",
            "ms/step", "host us/step", "GB/s", "%copy", "TFLOP/s");
}

static void report_row(const bm_report *r, bool pp, uint32_t B, const bm_run *run)
{
    const bm_opts *o = r->o;
    uint32_t n = pp ? o->pp : o->tg, tokens = B * n;
    char test[24];
    snprintf(test, sizeof test, "%s%u", pp ? "pp" : "tg", n);
    double tps = tokens / run->sec, gbps = pp ? 0 : run->bytes / run->sec * 1e-9;
    double frac = !pp && r->copy.gbps > 0 ? gbps / r->copy.gbps : 0, tflops = run->flops / run->sec * 1e-12;
    double host_us = run->host_ms * 1e3 / run->steps;
    char g[24] = "-", f[24] = "-";
    if (!pp)
        snprintf(g, sizeof g, "%.1f", gbps), snprintf(f, sizeof f, "%.1f", 100 * frac);
    fprintf(r->table, "%-8s %6u %7u %8u %10.1f %9.3f %12.1f %9s %6s %8.3f\n", test, B, pp ? 0 : o->ctx, tokens, tps,
            run->sec * 1e3 / run->steps, host_us, g, f, tflops);
    fflush(r->table);
    if (!o->json)
        return;
    char drv[520];
    snprintf(drv, sizeof drv, "%s %s", r->d->info.driver_name, r->d->info.driver_info);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "device", r->d->info.name);
    cJSON_AddStringToObject(j, "driver", drv);
    cJSON_AddStringToObject(j, "commit", o->commit ? o->commit : "unknown");
    cJSON_AddStringToObject(j, "model", r->m->name);
    cJSON_AddStringToObject(j, "arch", r->m->arch);
    cJSON_AddStringToObject(j, "weight_type", r->m->weight_type);
    cJSON_AddNumberToObject(j, "n_params", (double)r->m->n_params);
    cJSON_AddStringToObject(j, "test", test);
    cJSON_AddNumberToObject(j, "n_seqs", B);
    cJSON_AddNumberToObject(j, "context", pp ? 0 : o->ctx);
    cJSON_AddNumberToObject(j, "n_tokens", tokens);
    cJSON_AddNumberToObject(j, "steps", run->steps);
    cJSON_AddNumberToObject(j, "reps", o->reps);
    cJSON_AddNumberToObject(j, "tokens_per_s", tps);
    cJSON_AddNumberToObject(j, "ms_per_step", run->sec * 1e3 / run->steps);
    cJSON_AddNumberToObject(j, "host_us_per_step", host_us);
    cJSON_AddNumberToObject(j, "dispatches_per_step", run->dispatches / run->steps);
    cJSON_AddNumberToObject(j, "barriers_per_step", run->barriers / run->steps);
    cJSON_AddBoolToObject(j, "fusion", !r->o->eo.p.no_fusion);
    cJSON_AddBoolToObject(j, "int_dot", r->int_dot); /* as the engine resolved it */
    cJSON_AddBoolToObject(j, "cmd_reuse", !r->o->eo.p.no_cmd_reuse);
    const char *kc = r->o->eo.p.device.kernel_config;
    if (kc && *kc)
        cJSON_AddStringToObject(j, "kernel_config", kc);
    else
        cJSON_AddNullToObject(j, "kernel_config"); /* the library's choices */
    cJSON_AddBoolToObject(j, "overlap", !pp && o->overlap); /* tg steps two in flight */
    char sp[96];
    if (o->sampled)
        cJSON_AddStringToObject(j, "sampling", sampling_desc(o, sp, sizeof sp));
    else
        cJSON_AddNullToObject(j, "sampling"); /* greedy */
    cJSON_AddNumberToObject(j, "reused_steps", run->reused / run->steps); /* share of the steps */
    if (pp) {
        cJSON_AddNullToObject(j, "bytes_per_token");
        cJSON_AddNullToObject(j, "bw_fraction");
    } else {
        cJSON_AddNumberToObject(j, "bytes_per_token", run->bytes / tokens);
        cJSON_AddNumberToObject(j, "bw_fraction", frac);
    }
    cJSON_AddNumberToObject(j, "copy_gbps", r->copy.gbps);
    cJSON_AddNumberToObject(j, "tflops", tflops);
    cJSON_AddNullToObject(j, "peak_tflops"); /* the cooperative-matrix microbenchmark's, when it exists */
    cJSON_AddStringToObject(j, "kv_type", r->o->eo.p.kv_type == VKI_KV_F32 ? "f32" : "f16");
    cJSON_AddStringToObject(j, "kv_fill", pp ? "prefill" : "random");
    cJSON_AddStringToObject(j, "command", o->command);
    char *txt = cJSON_PrintUnformatted(j);
    if (txt)
        printf("%s\n", txt);
    fflush(stdout);
    cJSON_free(txt);
    cJSON_Delete(j);
}

/* ---- main ---------------------------------------------------------------------------------- */

static vki_status state_init(bm_state *s, const bm_opts *o)
{
    size_t n_tok = (size_t)s->max_b * (o->pp > 1 ? o->pp : 1);
    s->pages = malloc((size_t)s->max_b * s->pages_per_seq * sizeof *s->pages);
    s->tokens = malloc(n_tok * sizeof *s->tokens);
    s->seqs = calloc(s->max_b, sizeof *s->seqs);
    s->outs = calloc(s->max_b, sizeof *s->outs);
    if (!s->pages || !s->tokens || !s->seqs || !s->outs)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < (size_t)s->max_b * s->pages_per_seq; i++)
        s->pages[i] = (uint32_t)i;
    for (size_t i = 0; i < n_tok; i++)
        s->tokens[i] = (int32_t)(vki_splitmix64(&s->rng) % s->e->model.hp.n_vocab);
    return VKI_OK;
}

static void state_free(bm_state *s)
{
    free(s->pages);
    free(s->tokens);
    free(s->seqs);
    free(s->outs);
}

/* Every pp test, then every tg test; false after a failure (printed). */
static bool run_tests(bm_state *s, const bm_opts *o, const bm_report *r)
{
    for (int pp = 1; pp >= 0; pp--) {
        uint32_t n = pp ? (o->pp ? o->n_pp_b : 0) : (o->tg ? o->n_tg_b : 0);
        const uint32_t *bs = pp ? o->pp_b : o->tg_b;
        if (!pp && n && fill_kv_random(s) != VKI_OK) {
            fprintf(stderr, "vkinfer bench-model: cannot fill the KV cache\n");
            return false;
        }
        for (uint32_t i = 0; i < n; i++) {
            bm_run run;
            if (measure(s, pp, bs[i], o, &run) != VKI_OK)
                return false;
            report_row(r, pp, bs[i], &run);
        }
    }
    return true;
}

int vki_cli_bench_model(int argc, char **argv)
{
    bm_opts o = {.pp = 512, .tg = 128, .ctx = 512, .pp_b = {1}, .n_pp_b = 1,
                 .tg_b = {1, 2, 4, 8, 16, 32, 64, 256}, .n_tg_b = 8, .reps = 1, .sp = vki_sampling_default_params()};
    cli_engine_opts_init(&o.eo);
    o.eo.p.progress = false;
    cli_record_command(o.command, sizeof o.command, argc, argv);
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    bm_state s = {.rng = 0xbe9c4u, .sampling = o.sampled ? &o.sp : NULL};
    bm_model m = {0};
    vki_engine *eng = open_sized(&o, &s);
    if (!eng)
        return 1;
    vki_model_info mi;
    vki_engine_info(eng, &mi);
    s.e = engine_api_core(eng);
    s.m = &m;
    bm_report rep = {.o = &o, .m = &m, .d = s.e->dev, .table = o.json ? stderr : stdout, .int_dot = mi.int_dot};
    devprobe_opts po = {.iters = 10, .warmup = 2, .reps = 3};
    bool ok = check_capacity(&s) && read_file_facts(o.eo.model, &mi, &m) == VKI_OK;
    if (ok && devprobe_copy_bandwidth(s.e->dev, (uint64_t)o.copy_mib << 20, &po, &rep.copy) != VKI_OK) {
        fprintf(stderr, "vkinfer bench-model: the copy-bandwidth probe failed\n");
        ok = false;
    }
    if (ok && state_init(&s, &o) != VKI_OK) {
        fprintf(stderr, "vkinfer bench-model: out of host memory\n");
        ok = false;
    }
    if (ok) {
        account(s.e, &m);
        report_header(&rep, s.e);
        ok = run_tests(&s, &o, &rep);
    }
    cli_print_profile(&o.eo, eng); /* --profile: the top ops by GPU time over every test run */
    state_free(&s);
    vki_engine_destroy(eng);
    return ok ? 0 : 1;
}
