/* make-model: writes a synthetic GGUF model (random weights, real or byte-level vocabulary) for
 * any llama / qwen2 / qwen3 / gemma2 / gemma3 / phi3 shape. See `make-model --help`. */
#include "engine/synth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The plain types or the mixes, wrapped under the option column. */
static void print_wtypes(FILE *o, bool mixes)
{
    int col = 0;
    for (int t = 0; t < SYNTH_WTYPE_COUNT; t++) {
        if (synth_wtype_is_mix((synth_wtype)t) != mixes)
            continue;
        const char *n = synth_wtype_name((synth_wtype)t);
        if (col && col + 1 + (int)strlen(n) > 96) {
            fprintf(o, "\n");
            col = 0;
        }
        if (!col)
            col = fprintf(o, "%21s", "");
        col += fprintf(o, " %s", n);
    }
    fprintf(o, "\n");
}

static void usage(FILE *o)
{
    fprintf(o,
            "usage: make-model -o OUT.gguf [options]\n"
            "  --preset NAME       start from a preset shape (default tiny):");
    for (const char *const *n = synth_preset_names(); *n; n++)
        fprintf(o, " %s", *n);
    fprintf(o, "\n"
               "  --arch A            llama, qwen2 (Q/K/V biases), qwen3 (Q/K norms), qwen3moe (+ experts),\n"
               "                      gemma, gemma2, gemma3, phi3 (fused QKV and gate|up), gpt-oss (experts with\n"
               "                      biases, sink logits, window 128), granite (Granite 3's multipliers),\n"
               "                      granitemoe (granite + experts), exaone, exaone4 (post-norms), glm4,\n"
               "                      smollm3 (no RoPE on every 4th layer), olmo2 (post-norms only),\n"
               "                      command-r, cohere2 (LayerNorm, parallel FFN; cohere2 window 4096),\n"
               "                      mistral3 (attention temperature 0.1 every --ctx-orig positions),\n"
               "                      starcoder2 (LayerNorms with bias, GELU FFN with biases), phi2\n"
               "                      (starcoder2's block in parallel, fused Q|K|V with bias, LM head bias),\n"
               "                      stablelm (LayerNorms with bias, SwiGLU; --rope-dims for its 25%%),\n"
               "                      nemotron (LayerNorms with bias, squared-ReLU FFN), arcee (llama + it);\n"
               "                      sets the arch's window, soft-caps and multipliers\n"
               "  --layers N          transformer blocks\n"
               "  --dim D             embedding length (d_model)\n"
               "  --heads H           attention heads\n"
               "  --kv-heads K        key/value heads (divides H)\n"
               "  --head-dim HD       head dimension (default D/H; writes key_length/value_length)\n"
               "  --ff F              feed-forward length\n"
               "  --vocab N           byte-level vocabulary of N tokens (>= 259)\n"
               "  --vocab-from FILE   copy the tokenizer.* keys of a GGUF (vocab size from it)\n"
               "  --ctx C             context length\n"
               "  --type T            weight type of every matrix:\n");
    print_wtypes(o, false);
    fprintf(o, "                      or a llama-quantize mix (its per-tensor types):\n");
    print_wtypes(o, true);
    fprintf(o,                "                      rows a block does not divide take llama.cpp's fallback type\n"
               "  --mix               with a plain --type: llama-quantize's mix of that name (q2_k:\n"
               "                      q3_k attn_v/attn_output/ffn_down, q6_k output.weight, ...)\n"
               "  --tied / --untied   reuse token_embd as the LM head (no output.weight), or not\n"
               "  --rope-base B       RoPE frequency base\n"
               "  --rms-eps E         RMSNorm epsilon\n"
               "  --seed S            weight seed\n"
               "  --name NAME         general.name\n"
               "  --window N          attention.sliding_window (0: none)\n"
               "  --attn-softcap C    attn_logit_softcapping (gemma2; 0: none)\n"
               "  --final-softcap C   final_logit_softcapping (gemma2/3; 0: none)\n"
               "  --ctx-orig N        phi3 LongRoPE: original context (< --ctx), writes rope factors;\n"
               "                      with --yarn, YaRN's original context\n"
               "  --yarn F            rope.scaling.type yarn, factor F (>= 1) over --ctx-orig (Qwen's\n"
               "                      long-context files; not phi3 or gemma)\n"
               "  --rope-dims N       rotated dims per head (even, <= head dim; Phi-4-mini: 96 of 128)\n"
               "  --experts N         mixture of experts: N experts per layer (qwen3moe, gpt-oss, granitemoe need\n"
               "                      it; with --arch llama: Mixtral's layout), ffn_gate_inp + ffn_*_exps\n"
               "  --experts-used K    experts per token (top-k)\n"
               "  --expert-ff F       qwen3moe, gpt-oss: each expert's feed-forward length (default --ff)\n"
               "  --shared-ff F       granitemoe: a shared expert of F rows (GraniteMoeShared)\n"
               "  --threads N         workers generating and encoding weights (default: one per CPU;\n"
               "                      the file is the same for any N)\n");
}

static void log_stderr(void *user, const char *msg)
{
    fprintf(stderr, "make-model: %s\n", msg);
}

/* Parses an unsigned option value; false (with a message) when it is not a number in range. */
static bool parse_u(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-' || v > max) {
        fprintf(stderr, "make-model: %s: '%s' is not a number up to %llu\n", opt, s, (unsigned long long)max);
        return false;
    }
    *out = v;
    return true;
}

/* A number > 0, or >= 0 when zero_ok. */
static bool parse_f(const char *opt, const char *s, bool zero_ok, float *out)
{
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !(v > 0 || (zero_ok && v == 0))) {
        fprintf(stderr, "make-model: %s: '%s' is not a %s number\n", opt, s, zero_ok ? "non-negative" : "positive");
        return false;
    }
    *out = v;
    return true;
}

/* Applies one option with a value; returns false on a bad value or unknown option. */
static bool apply(synth_params *p, const char *opt, const char *val)
{
    uint64_t u = 0;
    const uint64_t m32 = UINT32_MAX;
    if (!strcmp(opt, "--arch")) /* applied with its defaults before the other options */
        return true;
    if (!strcmp(opt, "--vocab-from"))
        return p->vocab_from = val, true;
    if (!strcmp(opt, "--name"))
        return p->name = val, true;
    if (!strcmp(opt, "--type")) {
        if (!synth_wtype_parse(val, &p->wtype)) {
            fprintf(stderr, "make-model: --type: unknown weight type '%s'\n", val);
            return false;
        }
        return true;
    }
    if (!strcmp(opt, "--rope-base"))
        return parse_f(opt, val, false, &p->rope_base);
    if (!strcmp(opt, "--rms-eps"))
        return parse_f(opt, val, false, &p->rms_eps);
    if (!strcmp(opt, "--attn-softcap"))
        return parse_f(opt, val, true, &p->attn_softcap);
    if (!strcmp(opt, "--final-softcap"))
        return parse_f(opt, val, true, &p->final_softcap);
    if (!strcmp(opt, "--yarn"))
        return parse_f(opt, val, false, &p->yarn_factor);
    if (!strcmp(opt, "--seed"))
        return parse_u(opt, val, UINT64_MAX, &p->seed);
    uint32_t *dst = !strcmp(opt, "--layers")     ? &p->n_layer
                    : !strcmp(opt, "--dim")      ? &p->d_model
                    : !strcmp(opt, "--heads")    ? &p->n_head
                    : !strcmp(opt, "--kv-heads") ? &p->n_head_kv
                    : !strcmp(opt, "--head-dim") ? &p->head_dim
                    : !strcmp(opt, "--ff")       ? &p->d_ff
                    : !strcmp(opt, "--vocab")    ? &p->n_vocab
                    : !strcmp(opt, "--ctx")      ? &p->n_ctx
                    : !strcmp(opt, "--window")   ? &p->sliding_window
                    : !strcmp(opt, "--ctx-orig") ? &p->n_ctx_orig
                    : !strcmp(opt, "--rope-dims") ? &p->n_rot
                    : !strcmp(opt, "--experts") ? &p->n_expert
                    : !strcmp(opt, "--experts-used") ? &p->n_expert_used
                    : !strcmp(opt, "--expert-ff") ? &p->d_ff_exp
                    : !strcmp(opt, "--shared-ff") ? &p->d_ff_shexp
                    : !strcmp(opt, "--threads")  ? &p->n_threads
                                                 : NULL;
    if (!dst) {
        fprintf(stderr, "make-model: unknown option %s\n", opt);
        return false;
    }
    if (!parse_u(opt, val, m32, &u))
        return false;
    *dst = (uint32_t)u;
    return true;
}

int main(int argc, char **argv)
{
    synth_params p = synth_default_params();
    const char *out = NULL;
    p.log = log_stderr;
    /* the preset first, then the architecture (with its window and soft-caps), so the other
     * options override their fields whatever their order */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--preset") && synth_preset(argv[i + 1], &p) != VKI_OK) {
            fprintf(stderr, "make-model: unknown preset '%s'\n", argv[i + 1]);
            return 2;
        }
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--arch"))
            continue;
        p.arch = argv[i + 1];
        if (synth_arch_defaults(&p) != VKI_OK) {
            fprintf(stderr, "make-model: --arch: unknown architecture '%s'\n", argv[i + 1]);
            return 2;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied") || !strcmp(a, "--untied")) {
            p.tied = a[2] == 't';
            continue;
        }
        if (!strcmp(a, "--mix")) {
            p.llama_mix = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "make-model: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-o"))
            out = v;
        else if (strcmp(a, "--preset") && !apply(&p, a, v))
            return 2;
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    char err[512] = "";
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    vki_status st = synth_write(&p, out, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != VKI_OK) {
        fprintf(stderr, "make-model: %s: %s\n", vki_status_str(st), err);
        return 1;
    }
    FILE *f = fopen(out, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (f)
        fclose(f);
    char experts[64] = "";
    if (p.n_expert)
        snprintf(experts, sizeof experts, ", %u of %u experts of %u", p.n_expert_used, p.n_expert,
                 p.d_ff_exp ? p.d_ff_exp : p.d_ff);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char vocab[64];
    if (p.vocab_from) /* p.n_vocab is the unused byte-level default then */
        snprintf(vocab, sizeof vocab, "%s's vocabulary", strrchr(p.vocab_from, '/') ? strrchr(p.vocab_from, '/') + 1
                                                                                    : p.vocab_from);
    else
        snprintf(vocab, sizeof vocab, "vocab %u", p.n_vocab);
    fprintf(stderr, "make-model: wrote %s (%s, %u layers, d_model %u, %u/%u heads, d_ff %u%s, %s, %s%s weights, "
            "%.1f MiB) in %.1f s (%.0f MiB/s)\n", out, p.arch, p.n_layer, p.d_model, p.n_head, p.n_head_kv, p.d_ff,
            experts, vocab, synth_wtype_name(p.wtype), p.llama_mix ? " mix" : "", (double)size / 1048576.0, sec,
            (double)size / 1048576.0 / sec);
    return 0;
}
