/* Chat templates without a Jinja engine: the GGUF's tokenizer.chat_template is recognised by the
 * markers of the common families and rendered by C code that reproduces each family's upstream
 * template exactly (see the per-family notes in chat.c and the expected strings in
 * tests/test_chat.c).
 *
 * Families: ChatML (incl. a default system prompt written literally in the template, as Qwen's),
 * Llama 3, Llama 2 (<<SYS>>), Mistral ([INST] without <<SYS>>; the "v1" spacing when the template
 * writes ' [INST] '), Zephyr, Gemma, Phi-3, DeepSeek-R1, gpt-oss's harmony, OLMo 2 / Tülu 3,
 * IBM Granite 3.x, SmolLM3, LG's EXAONE 3.0 / 3.5 and 4.0, Zhipu's GLM-4-0414 and GLM-Z1, Cohere's
 * Command-R / R+ / R7B / A and Aya. Anything else, or no template: CHAT_PLAIN, our own fallback of
 * "role: content" lines ending in "assistant:" (the caller logs it).
 *
 * Tokenisation keeps the roles of the two kinds of text apart: control tokens ("<|im_start|>",
 * "<s>") are recognised only inside the text the template itself wrote; message content is always
 * tokenised as plain text, so a user cannot inject "<|im_end|>". No Vulkan, no global state. */
#ifndef VKI_HOST_CHAT_H
#define VKI_HOST_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/util/strbuf.h"
#include "vkinfer.h"

typedef enum chat_family {
    CHAT_PLAIN = 0, /* fallback: "system: ...\nuser: ...\nassistant:" */
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_LLAMA2,
    CHAT_MISTRAL,
    CHAT_ZEPHYR,
    CHAT_GEMMA,
    CHAT_PHI3,
    CHAT_DEEPSEEK, /* DeepSeek-R1 and its Qwen / Llama distills: <｜User｜>, <｜Assistant｜> */
    CHAT_HARMONY,  /* gpt-oss (OpenAI's harmony format): <|start|>role<|channel|>...<|message|>...<|end|> */
    CHAT_TULU,     /* OLMo 2 / Tülu 3: Zephyr's tags, a newline after each message, eos after answers only */
    CHAT_GRANITE,  /* IBM Granite 3.x: <|start_of_role|>role<|end_of_role|>...<|end_of_text|>, a dated default
                      system prompt (3.1+) */
    CHAT_SMOLLM3,  /* SmolLM3: ChatML behind a "## Metadata" system block, /think and /no_think */
    CHAT_EXAONE,   /* LG AI Research's EXAONE 3.0 / 3.5 / 4.0: [|role|]...[|endofturn|] (see exaone4) */
    CHAT_GLM4,     /* Zhipu's GLM-4-0414 / GLM-Z1: [gMASK]<sop>, then <|role|>\n + content, nothing after a turn */
    CHAT_COMMAND_R, /* Cohere's Command-R / R+, Aya 23 / Expanse, Command R7B / A (see command_r7b):
                       <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|> */
    CHAT_FAMILY_COUNT
} chat_family;

typedef enum chat_role {
    CHAT_SYSTEM = 0,
    CHAT_USER,
    CHAT_ASSISTANT,
    CHAT_TOOL,            /* a tool's result: only chat_render_tools (chat_tools.h) renders it */
} chat_role;

/* The harmony template's reasoning_effort ("Reasoning: medium" in its system message). */
typedef enum chat_effort {
    CHAT_EFFORT_MEDIUM = 0, /* the template's default */
    CHAT_EFFORT_LOW,
    CHAT_EFFORT_HIGH,
} chat_effort;
const char *chat_effort_name(chat_effort e); /* "medium", "low", "high" */
bool chat_effort_parse(const char *name, chat_effort *out);

/* Granite's `thinking` and SmolLM3's and EXAONE 4's `enable_thinking` template variables. */
typedef enum chat_think {
    CHAT_THINK_DEFAULT = 0, /* the template's default: Granite's and EXAONE 4's off, SmolLM3's on */
    CHAT_THINK_ON,
    CHAT_THINK_OFF,
} chat_think;

typedef struct chat_msg {
    chat_role role;
    const char *content; /* [len] bytes, need not be NUL-terminated */
    size_t len;
} chat_msg;

/* A recognised template and the token texts it refers to. */
typedef struct chat_template {
    chat_family family;
    bool emit_bos;        /* the template writes bos_token (Llama 2 writes it before every turn) */
    bool mistral_spaced;  /* Mistral "v1": " [INST] ", " [/INST]", " " before an answer */
    bool mistral_tekken;  /* Mistral "v3-tekken" (Nemo): "[INST]" + content + "[/INST]", no spaces,
                             the system message in the final user turn */
    bool mistral_v7;      /* Mistral "v7" (Small 3, Devstral): [SYSTEM_PROMPT] blocks (default_system:
                             the template's default_system_message literal), any role order */
    char bos[64], eos[64]; /* the texts of bos_token / eos_token ("" when the vocabulary has none) */
    char *default_system; /* ChatML, Mistral v7: the system prompt the template writes when none is
                             given; Granite: its text before the date */
    char *system_tail[2]; /* Granite 3.1+: its default system prompt's text after the date, [0] plain,
                             [1] with thinking (NULL where the template has no thinking branch: 3.1) */
    char date_fmt[16];    /* Granite: the strftime_now format of that date ("%B %d, %Y"; "" = no date) */
    bool strip_think;     /* ChatML with reasoning (Qwen3): assistant turns before the last user
                             message lose their "<think>...</think>" part */
    bool deepseek_think;  /* DeepSeek-R1: the generation prompt opens "<think>\n" (its later
                             revisions' templates) */
    bool phi4_mini;       /* Phi-4-mini's: '<|' + role + '|>' + content + '<|end|>', no newlines */
    bool chatml_sep;      /* Phi-4's ChatML: '<|im_start|>' + role + '<|im_sep|>' + content +
                             '<|im_end|>', no newlines */
    bool phi3_v1;         /* the first Phi-3 template (mini-4k/medium, April 2024): no system turn,
                             '<|assistant|>' after every user turn, no generation-prompt switch */
    bool smollm3_closed;  /* SmolLM3: "<|im_end|>\n" after the metadata block even without tools (Unsloth's
                             edit, llama.cpp's copy; the released template leaves the block open) */
    bool smollm3_override; /* SmolLM3: a system message holding "/system_override" replaces the block */
    bool exaone4;         /* EXAONE 4.0 (its template has a "[|tool|]" role): "[|role|]\n" + content +
                             "[|endofturn|]\n" for every message, answers behind an empty reasoning block;
                             false: EXAONE 3.0 / 3.5, "[|role|]" + content, "\n" after a user turn */
    bool glm4_system_first; /* GLM-4-0414 / Z1 ("messages if message.role != 'system'"): every system
                             message first, in order, then the others; false (glm-4-9b-chat's): in order */
    bool glm4_visible;    /* GLM-Z1 (its template splits at '</think>'): every message but the system ones
                             written as content.split('</think>')[-1].strip() */
    char glm4_gen[32];    /* GLM: the generation prompt, the template's literal ("<|assistant|>\n", Z1's
                             "<|assistant|>\n<think>") */
    bool command_r7b;     /* Command R7B (cohere2; the template has "<|START_RESPONSE|>"; Command A's, not
                             checked, is taken to match): no bos_token, an empty system turn when there is no
                             system message, answers as '<|START_RESPONSE|>' + content + '<|END_RESPONSE|>'
                             inside their turn, a generation prompt that opens the response; the reply's "<|START_THINKING|>...<|END_THINKING|>"
                             is its reasoning (chat_reply). A flag, not a family: the turns, roles, trimming
                             and alternation are Command-R's, as EXAONE 4 is EXAONE's; false: Command-R's */
    /* The variable parts of the harmony (gpt-oss), Granite and SmolLM3 system messages. The
     * renderer reads them; callers set them per conversation on a copy (the server does, from the
     * request). */
    bool dated;           /* the template writes today's date (strftime_now): harmony's "Current date: "
                             line (without it the line is left out, as the harmony library does),
                             SmolLM3's "Today Date: " line; Granite's is in date_fmt */
    char date[16];        /* that date, "YYYY-MM-DD"; "" = today in local time, read when rendering (as
                             strftime_now does): set it for a deterministic prompt */
    chat_effort effort;   /* "Reasoning: ..." (the template's reasoning_effort variable) */
    chat_think think;     /* Granite, SmolLM3 (a SmolLM3 system message's /think or /no_think wins), EXAONE 4 */
} chat_template;

/* Recognises a template by its markers; *known = false (and CHAT_PLAIN) for NULL, empty or an
 * unknown template. O(len * markers). */
chat_family chat_detect(const char *tmpl, bool *known);
const char *chat_family_name(chat_family f);          /* "chatml", "llama3", ..., "plain" */
bool chat_family_parse(const char *name, chat_family *out);

/* Fills *t for family f. tmpl (may be NULL) refines it: whether bos_token is written, the Mistral
 * spacing, ChatML's literal default system prompt and reasoning stripping, the first Phi-3
 * template, harmony's and SmolLM3's date lines, Granite's default system prompt (from the
 * template's literals; none in Granite 3.0's), EXAONE 4.0 or 3.x, GLM's system order, reasoning
 * stripping and generation prompt, Command R7B or Command-R (without tmpl: Granite 3.3's, EXAONE
 * 4.0's, GLM-4-0414's, Command-R's).
 * bos/eos: token texts (NULL = none). */
vki_status chat_template_init(chat_template *t, chat_family f, const char *tmpl, const char *bos, const char *eos);
void chat_template_free(chat_template *t);

/* A rendered prompt: the text, and the spans of it that the template wrote (everything else is
 * message content). */
typedef struct chat_span {
    size_t off, len;
} chat_span;

typedef struct chat_prompt {
    union { /* one buffer, two spellings: readers use text/len, the renderer appends to buf */
        strbuf buf;
        struct {
            char *text;   /* NUL-terminated */
            size_t len, cap;
        };
    };
    chat_span *tmpl;      /* [n_tmpl] template-written spans, in order, not overlapping */
    size_t n_tmpl, cap_tmpl;
} chat_prompt;

/* The model writes its reasoning as "<think>...</think>" before the answer (DeepSeek-R1, Qwen3's
 * ChatML, SmolLM3, EXAONE 4, GLM-Z1): what reasoning_format "auto" splits off. */
bool chat_thinks(const chat_template *t);

/* Renders messages the way the family's upstream template does. Errors (VKI_ERR_INVALID_ARG,
 * message in err naming messages[i]) where the upstream template raises, e.g. roles that do not
 * alternate user/assistant in the Llama 2, Mistral and Gemma templates. */
vki_status chat_render(const chat_template *t, const chat_msg *m, size_t n, bool add_generation_prompt,
                       chat_prompt *out, char *err, size_t n_err);
void chat_prompt_free(chat_prompt *p);
/* Cuts what the template wrote after the last message's text (its end-of-turn markers), so that
 * generation continues that message (vLLM's continue_final_message). */
void chat_prompt_open_end(chat_prompt *p);
/* Appends text to a prompt: template text (tmpl, its control tokens are recognised) or message
 * content. For renderers outside chat.c (chat_tools.c). */
vki_status chat_prompt_append(chat_prompt *p, const char *s, size_t n, bool tmpl);
/* Harmony's system message, "<|start|>system<|message|>...<|end|>", appended to p as template text;
 * `tools`: with the line that sends function calls to the commentary channel. For chat_tools.c. */
vki_status chat_harmony_system(const chat_template *t, bool tools, chat_prompt *p);
/* false (err naming messages[i]) for an assistant message whose content holds harmony's channel
 * tags, which gpt-oss's template refuses. */
bool chat_harmony_check(const chat_msg *m, size_t i, char *err, size_t n_err);

/* The control tokens of a vocabulary (tokens whose text shows only when rendered as special),
 * for chat_tokenize. Built once per server: O(vocab). */
typedef struct chat_specials chat_specials;
vki_status chat_specials_create(const vki_tokenizer *tok, chat_specials **out);
void chat_specials_free(chat_specials *s);

/* Tokenises a rendered prompt: control-token texts inside template spans become their ids, all
 * other text (message content included) is tokenised as plain text, as vki_tokenize would with
 * parse_special limited to the template's spans. add_bos: prepend BOS unless the result already
 * starts with it. *ids is malloc'd (free it); *n its length. */
vki_status chat_tokenize(const chat_specials *sp, const vki_tokenizer *tok, const chat_prompt *p, bool add_bos,
                         int32_t **ids, size_t *n);

/* The texts of the BOS / EOS tokens of tok ("" when it has none). */
void chat_token_texts(const vki_tokenizer *tok, char *bos, size_t n_bos, char *eos, size_t n_eos);

/* Reads tokenizer.chat_template from a GGUF file: *out is a malloc'd NUL-terminated copy, or NULL
 * when the key is absent. VKI_ERR_IO / VKI_ERR_FORMAT with err filled. */
vki_status chat_template_from_gguf(const char *path, char **out, char *err, size_t n_err);

#endif
