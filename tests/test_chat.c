/* Chat templates (host/chat/chat.c): each family rendered exactly as its upstream template renders the
 * same conversation (the expected strings were worked out by hand from the upstream Jinja, with
 * transformers' trim_blocks/lstrip_blocks), recognition from the real template strings, the
 * errors the upstream templates raise, the plain fallback, reading the key from a GGUF, and
 * tokenisation: control tokens only where the template wrote them; the public vki_chat_* API
 * over it. No GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/gguf_write.h"
#include "host/chat/chat.h"
#include "host/chat/chat_reply.h"
#include "support/vt.h"

/* ---- real template strings (as they appear in tokenizer_config.json / the GGUF) -------------- */

static const char T_CHATML[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char T_QWEN2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

static const char T_QWEN25[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- "
    "messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}\n    {%- endif %}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- "
    "'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- "
    "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n";

static const char T_LLAMA3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char T_LLAMA2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char T_MISTRAL[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are "
    "supported!') }}{% endif %}{% endfor %}";

static const char T_MISTRAL_V1[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set "
    "loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- "
    "bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == "
    "0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if "
    "loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + "
    "message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' "
    "[/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + "
    "message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are "
    "supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

/* mistralai/Mistral-Nemo-Instruct-2407 ("v3-tekken"), its tool branches left out */
static const char T_MISTRAL_NEMO[] =
    "{%- if messages[0][\"role\"] == \"system\" %}\n    {%- set system_message = messages[0][\"content\"] %}\n    {%- "
    "set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{%- for "
    "message in loop_messages | rejectattr(\"role\", \"equalto\", \"tool\") %}\n    {%- if (message[\"role\"] == "
    "\"user\") != (loop.index0 % 2 == 0) %}\n        {{- raise_exception(\"After the optional system message, "
    "conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif %}\n{%- endfor %}\n{{- "
    "bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n        {%- if "
    "loop.last and system_message is defined %}\n            {{- \"[INST]\" + system_message + \"\\n\\n\" + "
    "message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + "
    "\"[/INST]\" }}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- "
    "message[\"content\"] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n";

/* mistralai/Mistral-Small-24B-Instruct-2501 ("v7-tekken"), its default system prompt shortened */
static const char T_MISTRAL_V7[] =
    "{%- set today = strftime_now(\"%Y-%m-%d\") %}\n{%- set default_system_message = \"You are Mistral Small 3, a "
    "\\\"helpful\\\" assistant.\\nBe brief.\" %}\n\n{{- bos_token }}\n\n{%- if messages[0]['role'] == 'system' %}\n    "
    "{%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    "
    "{%- set system_message = default_system_message %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{{- "
    "'[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n\n{%- for message in loop_messages %}\n    {%- if "
    "message['role'] == 'user' %}\n        {{- '[INST]' + message['content'] + '[/INST]' }}\n    {%- elif "
    "message['role'] == 'system' %}\n        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}\n    "
    "{%- elif message['role'] == 'assistant' %}\n        {{- message['content'] + eos_token }}\n    {%- else %}\n        "
    "{{- raise_exception('Only user, system and assistant roles are supported!') }}\n    {%- endif %}\n{%- endfor %}";

/* deepseek-ai/DeepSeek-R1-Distill-Qwen-7B (the later revision, opening <think> at the generation
 * prompt), its tool branches left out */
#define DSB "\xef\xbd\x9c"
#define DS_BOS "<" DSB "begin\xe2\x96\x81of\xe2\x96\x81sentence" DSB ">"
#define DS_EOS "<" DSB "end\xe2\x96\x81of\xe2\x96\x81sentence" DSB ">"
#define DS_U "<" DSB "User" DSB ">"
#define DS_A "<" DSB "Assistant" DSB ">"
static const char T_DEEPSEEK_R1[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = "
    "namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages "
    "%}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor "
    "%}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set "
    "ns.is_tool = false -%}{{'" DS_U "' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and "
    "message['content'] is not none %}{% set content = message['content'] %}{% if '</think>' in content %}{% set "
    "content = content.split('</think>')[-1] %}{% endif %}{{'" DS_A "' + content + '" DS_EOS "'}}{%- endif %}{%- "
    "endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'" DS_A "<think>\\n'}}{% endif %}";

static const char T_ZEPHYR[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% "
    "elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% "
    "if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

static const char T_GEMMA[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
    "%}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

static const char T_PHI35[] =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
    "'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token "
    "}}{% endif %}";

/* microsoft/Phi-4-mini-instruct (its tools branch left out): no newlines */
static const char T_PHI4_MINI[] =
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}{% "
    "if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";

/* microsoft/phi-4: ChatML with <|im_sep|> after the role and no newlines */
static const char T_PHI4[] =
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' "
    "+ message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant<|im_sep|>' }}{% endif %}";

static const char T_PHI3_SMALL[] =
    "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + "
    "'<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif "
    "%}";

/* Qwen/Qwen3-0.6B (as llama.cpp keeps it in models/templates): ChatML, reasoning of earlier
 * assistant turns dropped, no default system prompt. */
static const char T_QWEN3[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n        {{- m"
    "essages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \"# Tools\\n\\nYou may call one or more functions "
    "to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- e"
    "ndfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and argum"
    "ents within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\""
    ": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %"
    "}\n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif"
    " %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n{%- for message in"
    " messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool "
    "and message.role == \"user\" and not(message.content.startswith('<tool_response>') and message.content.endswit"
    "h('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index "
    "= index %}\n    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n    {%- if (message.role == \"use"
    "r\") or (message.role == \"system\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' "
    "+ message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {%- set co"
    "ntent = message.content %}\n        {%- set reasoning_content = '' %}\n        {%- if message.reasoning_conten"
    "t is defined and message.reasoning_content is not none %}\n            {%- set reasoning_content = message.rea"
    "soning_content %}\n        {%- else %}\n            {%- if '</think>' in message.content %}\n                {"
    "%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n                {%- set reasoning_con"
    "tent = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n            {"
    "%- endif %}\n        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loo"
    "p.last or (not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + message.role + '\\n<t"
    "hink>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- e"
    "lse %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n    "
    "    {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n   "
    "     {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n                {%-"
    " if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n                {%- end"
    "if %}\n                {%- if tool_call.function %}\n                    {%- set tool_call = tool_call.functio"
    "n %}\n                {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- "
    "tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is"
    " string %}\n                    {{- tool_call.arguments }}\n                {%- else %}\n                    {"
    "{- tool_call.arguments | tojson }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n "
    "           {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \""
    "tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im"
    "_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}"
    "\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\""
    ") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_ge"
    "neration_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_th"
    "inking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}";

/* google/gemma-3-1b-it: a system message becomes the first user turn's prefix. (Gemma 2's
 * gemma-2-2b-it template is T_GEMMA's.) */
static const char T_GEMMA3[] =
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n    {%- else -%}\n        {%- set "
    "first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n    {%- endif -%}\n    {%- set "
    "loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set "
    "loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n "
    "       {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- "
    "endif -%}\n    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if "
    "message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is "
    "iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n "
    "               {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ "
    "item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ "
    "raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n";

/* microsoft/Phi-3-mini-4k-instruct's first template (its GGUF release): no system turn, the
 * assistant tag after every user turn, no add_generation_prompt. */
static const char T_PHI3_MINI[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
    "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') "
    "%}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}";

/* openai/gpt-oss-20b's chat_template.jinja, its tool-rendering macros and tool branches left out */
static const char T_HARMONY[] =
    "{#- System Message Construction ============================================ #}\n{%- macro "
    "build_system_message() -%}\n    {%- if model_identity is not defined %}\n        {%- set model_identity = \"You "
    "are ChatGPT, a large language model trained by OpenAI.\" %}\n    {%- endif %}\n    {{- model_identity + \"\\n\" "
    "}}\n    {{- \"Knowledge cutoff: 2024-06\\n\" }}\n    {{- \"Current date: \" + strftime_now(\"%Y-%m-%d\") + "
    "\"\\n\\n\" }}\n    {%- if reasoning_effort is not defined %}\n        {%- set reasoning_effort = \"medium\" %}\n"
    "    {%- endif %}\n    {{- \"Reasoning: \" + reasoning_effort + \"\\n\\n\" }}\n    {{- \"# Valid channels: "
    "analysis, commentary, final. Channel must be included for every message.\" }}\n    {%- if tools -%}\n        {{- "
    "\"\\nCalls to these tools must go to the commentary channel: 'functions'.\" }}\n    {%- endif -%}\n{%- endmacro "
    "-%}\n\n{#- Main Template Logic ================================================= #}\n{{- "
    "\"<|start|>system<|message|>\" }}\n{{- build_system_message() }}\n{{- \"<|end|>\" }}\n\n{#- Extract developer "
    "message #}\n{%- if messages[0].role == \"developer\" or messages[0].role == \"system\" %}\n    {%- set "
    "developer_message = messages[0].content %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set "
    "developer_message = \"\" %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{#- Render developer "
    "message #}\n{%- if developer_message or tools %}\n    {{- \"<|start|>developer<|message|>\" }}\n    {%- if "
    "developer_message %}\n        {{- \"# Instructions\\n\\n\" }}\n        {{- developer_message }}\n        {{- "
    "\"\\n\\n\" }}\n    {%- endif %}\n    {{- \"<|end|>\" }}\n{%- endif %}\n\n{%- for message in loop_messages -%}\n"
    "    {%- if message.role == 'assistant' -%}\n        {%- if loop.last and not add_generation_prompt %}\n"
    "            {{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|return|>\" }}\n"
    "        {%- else %}\n            {{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + "
    "\"<|end|>\" }}\n        {%- endif %}\n    {%- elif message.role == 'user' -%}\n        {{- "
    "\"<|start|>user<|message|>\" + message.content + \"<|end|>\" }}\n    {%- endif -%}\n{%- endfor -%}\n\n{#- "
    "Generation prompt #}\n{%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}\n";

/* allenai/OLMo-2-1124-13B-Instruct (Tülu 3's format): Zephyr's tags, a newline after each message,
 * eos only after answers */
static const char T_OLMO2[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['con"
    "tent'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif messag"
    "e['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }"
    "}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and ad"
    "d_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}";

/* ibm-granite/granite-3.0-2b-instruct (as the granite3-dense GGUF carries it), its tool branches left out: no
 * default system prompt */
static const char T_GRANITE30[] =
    "{%- for message in messages %}\n    {%- if message['role'] == 'system' %}\n    {{- '<|start_of_role|>system<|end"
    "_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n    {%- elif message['role'] == 'user' %}\n    {{- '<"
    "|start_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n    {%- elif message['role']"
    " == 'assistant' %}\n    {{- '<|start_of_role|>assistant<|end_of_role|>'  + message['content'] + '<|end_of_text|>"
    "\n' }}\n    {%- endif %}\n    {%- if loop.last and add_generation_prompt %}\n    {{- '<|start_of_role|>assistant"
    "<|end_of_role|>' }}\n    {%- endif %}\n{%- endfor %}";

/* ibm-granite/granite-3.1-8b-instruct: a dated default system prompt, no thinking switch */
static const char T_GRANITE31[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set l"
    "oop_messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"Knowledge Cutoff Date: April 2024.\\"
    "nToday's Date: \" + strftime_now('%B %d, %Y') + \".\\nYou are Granite, developed by IBM.\" %}\n    {%- if tools "
    "and documents %}\n        {%- set system_message = system_message + \" You are a helpful AI assistant with acces"
    "s to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followe"
    "d by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user that you"
    " do not have the ability to fulfill the request.\\n\\nWrite the response to the user's input by strictly alignin"
    "g with the facts in the provided documents. If the information needed to answer the question is not available in"
    " the documents, inform the user that the question cannot be answered based on the available data.\" %}\n    {%- "
    "elif tools %}\n        {%- set system_message = system_message + \" You are a helpful AI assistant with access t"
    "o the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed b"
    "y a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user that you do"
    " not have the ability to fulfill the request.\" %}\n    {%- elif documents %}\n        {%- set system_message = "
    "system_message + \" Write the response to the user's input by strictly aligning with the facts in the provided d"
    "ocuments. If the information needed to answer the question is not available in the documents, inform the user th"
    "at the question cannot be answered based on the available data.\" %}\n    {%- else %}\n        {%- set system_me"
    "ssage = system_message + \" You are a helpful AI assistant.\" %}    \n    {%- endif %}\n    {%- if 'citations' i"
    "n controls and documents %}\n        {%- set system_message = system_message + '\\n\\nIn your response, use the "
    "symbols <co> and </co> to indicate when a fact comes from a document in the search result, e.g <co>0</co> for a "
    "fact from document 0. Afterwards, list all the citations with their corresponding documents in an ordered list.'"
    " %}\n    {%- endif %}\n    {%- if 'hallucinations' in controls and documents %}\n        {%- set system_message "
    "= system_message + '\\n\\nFinally, after the response is written, include a numbered list of sentences from the "
    "response that are potentially hallucinated and not based in the documents.' %}\n    {%- endif %}\n    {%- set lo"
    "op_messages = messages %}\n{%- endif %}\n{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_"
    "of_text|>\\n' }}\n{%- if tools %}\n    {{- '<|start_of_role|>tools<|end_of_role|>' }}\n    {{- tools | tojson(in"
    "dent=4) }}\n    {{- '<|end_of_text|>\\n' }}\n{%- endif %}\n{%- if documents %}\n    {{- '<|start_of_role|>docume"
    "nts<|end_of_role|>' }}\n    {%- for document in documents %}\n        {{- 'Document ' + loop.index0 | string + '"
    "\\n' }}\n        {{- document['text'] }}\n        {%- if not loop.last %}\n            {{- '\\n\\n'}}\n        {"
    "%- endif%}\n    {%- endfor %}\n    {{- '<|end_of_text|>\\n' }}\n{%- endif %}\n{%- for message in loop_messages %"
    "}\n    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n'"
    " }}\n    {%- if loop.last and add_generation_prompt %}\n        {{- '<|start_of_role|>assistant' }}\n           "
    " {%- if controls %}\n                {{- ' ' + controls | tojson()}}\n            {%- endif %}\n        {{- '<|e"
    "nd_of_role|>' }}\n    {%- endif %}\n{%- endfor %}";

/* ibm-granite/granite-3.3-2b-instruct (llama.cpp's models/templates copy), its tools and documents blocks left
 * out: 3.1's, with `thinking` */
static const char T_GRANITE33[] =
    "{# Alias tools -> available_tools #}\n{%- if tools and not available_tools -%}\n    {%- set available_tools = to"
    "ols -%}\n{%- endif -%}\n{%- if messages[0]['role'] == 'system' %}\n     {%- set system_message = messages[0]['co"
    "ntent'] %}\n     {%- set loop_messages = messages[1:] %}\n {%- else %}\n     {%- set system_message = \"Knowledg"
    "e Cutoff Date: April 2024.\nToday's Date: \" + strftime_now('%B %d, %Y') + \".\nYou are Granite, developed by IB"
    "M.\" %}\n     {%- if available_tools and documents %}\n         {%- set system_message = system_message + \" You"
    " are a helpful assistant with access to the following tools. When a tool is required to answer the user's query,"
    " respond only with <|tool_call|> followed by a JSON list of tools used. If a tool does not exist in the provided"
    " list of tools, notify the user that you do not have the ability to fulfill the request.\nWrite the response to "
    "the user's input by strictly aligning with the facts in the provided documents. If the information needed to ans"
    "wer the question is not available in the documents, inform the user that the question cannot be answered based o"
    "n the available data.\" %}\n     {%- elif available_tools %}\n         {%- set system_message = system_message +"
    " \" You are a helpful assistant with access to the following tools. When a tool is required to answer the user's"
    " query, respond only with <|tool_call|> followed by a JSON list of tools used. If a tool does not exist in the p"
    "rovided list of tools, notify the user that you do not have the ability to fulfill the request.\" %}\n     {%- e"
    "lif documents %}\n         {%- set system_message = system_message + \" Write the response to the user's input b"
    "y strictly aligning with the facts in the provided documents. If the information needed to answer the question i"
    "s not available in the documents, inform the user that the question cannot be answered based on the available da"
    "ta.\" %}\n    {%- elif thinking %}\n    {%- set system_message = system_message + \" You are a helpful AI assist"
    "ant.\nRespond to every user query in a comprehensive and detailed way. You can write down your thoughts and reas"
    "oning process before responding. In the thought process, engage in a comprehensive cycle of analysis, summarizat"
    "ion, exploration, reassessment, reflection, backtracing, and iteration to develop well-considered thinking proce"
    "ss. In the response section, based on various attempts, explorations, and reflections from the thoughts section,"
    " systematically present the final solution that you deem correct. The response should summarize the thought proc"
    "ess. Write your thoughts between <think></think> and write your response between <response></response> for each "
    "user query.\" %}\n     {%- else %}\n         {%- set system_message = system_message + \" You are a helpful AI a"
    "ssistant.\" %}\n     {%- endif %}\n     {%- if 'citations' in controls and documents %}\n         {%- set system"
    "_message = system_message + '\nUse the symbols <|start_of_cite|> and <|end_of_cite|> to indicate when a fact com"
    "es from a document in the search result, e.g <|start_of_cite|> {document_id: 1}my fact <|end_of_cite|> for a fac"
    "t from document 1. Afterwards, list all the citations with their corresponding documents in an ordered list.' %}"
    "\n     {%- endif %}\n     {%- if 'hallucinations' in controls and documents %}\n         {%- set system_message "
    "= system_message + '\nFinally, after the response is written, include a numbered list of sentences from the resp"
    "onse with a corresponding risk value that are hallucinated and not based in the documents.' %}\n     {%- endif %"
    "}\n     {%- set loop_messages = messages %}\n {%- endif %}\n {{- '<|start_of_role|>system<|end_of_role|>' + syst"
    "em_message + '<|end_of_text|>\n' }}\n {%- for message in loop_messages %}\n     {{- '<|start_of_role|>' + messag"
    "e['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}\n     {%- if loop.last and add_gener"
    "ation_prompt %}\n         {{- '<|start_of_role|>assistant' }}\n             {%- if controls %}\n                "
    " {{- ' ' + controls | tojson()}}\n             {%- endif %}\n         {{- '<|end_of_role|>' }}\n     {%- endif %"
    "}\n {%- endfor %}";

/* HuggingFaceTB/SmolLM3-3B */
static const char T_SMOLLM3[] =
    "{# \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 defaults \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80"
    "\xe2\x94\x80\xe2\x94\x80 #}\n{%- if enable_thinking is not defined -%}\n{%- set enable_thinking = true -%}\n{%- "
    "endif -%}\n\n{# \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 reasoning mode \xe2\x94\x80"
    "\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 #}\n{%- if enable_thinking -%}\n{%- set reasoning_mode = \"/thi"
    "nk\" -%}\n{%- else -%}\n{%- set reasoning_mode = \"/no_think\" -%}\n{%- endif -%}\n\n{# \xe2\x94\x80\xe2\x94\x80"
    "\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 header (system message) \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80"
    "\xe2\x94\x80 #}\n{{- \"<|im_start|>system\\n\" -}}\n\n{%- if messages[0].role == \"system\" -%}\n{%- set system_"
    "message = messages[0].content -%}\n{%- if \"/no_think\" in system_message -%}\n{%- set reasoning_mode = \"/no_th"
    "ink\" -%}\n{%- elif \"/think\" in system_message -%}\n{%- set reasoning_mode = \"/think\" -%}\n{%- endif -%}\n{%"
    "- set custom_instructions = system_message.replace(\"/no_think\", \"\").replace(\"/think\", \"\").rstrip() -%}\n"
    "{%- endif -%}\n\n{%- if \"/system_override\" in system_message -%}\n{{- custom_instructions.replace(\"/system_ov"
    "erride\", \"\").rstrip() -}}\n{{- \"<|im_end|>\\n\" -}}\n{%- else -%}\n{{- \"## Metadata\\n\\n\" -}}\n{{- \"Know"
    "ledge Cutoff Date: June 2025\\n\" -}}\n{%- set today = strftime_now(\"%d %B %Y\") -%}\n{{- \"Today Date: \" ~ to"
    "day ~ \"\\n\" -}}\n{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}\n\n{{- \"## Custom Instructions\\n"
    "\\n\" -}}\n{%- if custom_instructions -%}\n{{- custom_instructions + \"\\n\\n\" -}}\n{%- elif reasoning_mode == "
    "\"/think\" -%}\n{{- \"You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assi"
    "stant involves thoroughly exploring questions through a systematic thinking process before providing the final p"
    "recise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, explora"
    "tion, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please "
    "structure your response into two main sections: Thought and Solution using the specified format: <think> Thought"
    " section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step sh"
    "ould include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming n"
    "ew ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In th"
    "e Solution section, based on various attempts, explorations, and reflections from the Thought section, systemati"
    "cally present the final solution that you deem correct. The Solution section should be logical, accurate, and co"
    "ncise and detail necessary steps needed to reach the conclusion.\\n\\n\" -}}\n{%- else -%}\n{{- \"You are a help"
    "ful AI assistant named SmolLM, trained by Hugging Face.\\n\\n\" -}}\n{%- endif -%}\n\n{%- if xml_tools or python"
    "_tools -%}\n{{- \"### Tools\\n\\n\" -}}\n{%- if xml_tools -%}\n  {%- set ns = namespace(xml_tool_string=\"You ma"
    "y call one or more functions to assist with the user query.\\nYou are provided with function signatures within <"
    "tools></tools> XML tags:\\n\\n<tools>\\n\") -%}\n  {%- for tool in xml_tools[:] -%} {# The slicing makes sure th"
    "at xml_tools is a list #}\n    {%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | string) ~ \"\\n\" -%}\n"
    "  {%- endfor -%}\n  {%- set xml_tool_string = ns.xml_tool_string + \"</tools>\\n\\nFor each function call, retur"
    "n a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"n"
    "ame\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call>\" -%}\n  {{- xml_tool_string -}}"
    "\n{%- endif -%}\n{%- if python_tools -%}\n  {%- set ns = namespace(python_tool_string=\"When you send a message "
    "containing Python code between '<code>' and '</code>' tags, it will be executed in a stateful Jupyter notebook e"
    "nvironment, and you will then be given the output to continued reasoning in an agentic loop.\\n\\nYou can use th"
    "e following tools in your python code like regular functions:\\n<tools>\\n\") -%}\n  {%- for tool in python_tool"
    "s[:] -%} {# The slicing makes sure that python_tools is a list #}\n    {%- set ns.python_tool_string = ns.python"
    "_tool_string ~ (tool | string) ~ \"\\n\" -%}\n  {%- endfor -%}\n  {%- set python_tool_string = ns.python_tool_st"
    "ring + \"</tools>\\n\\nThe state persists between code executions: so variables that you define in one step are "
    "still available thereafter.\" -%}\n  {{- python_tool_string -}}\n{%- endif -%}\n{{- \"\\n\\n\" -}}\n{{- \"<|im_e"
    "nd|>\\n\" -}}\n{%- endif -%}\n{%- endif -%}\n{# \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 mai"
    "n loop \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 #}\n{%- for message in messages -%}\n{%- set"
    " content = message.content if message.content is string else \"\" -%}\n{%- if message.role == \"user\" -%}\n    "
    "{{ \"<|im_start|>\" + message.role + \"\\n\"  + content + \"<|im_end|>\\n\" }}\n{%- elif message.role == \"assis"
    "tant\" -%}\n    {% generation %}\n    {%- if reasoning_mode == \"/think\" -%}\n        {{ \"<|im_start|>assistan"
    "t\\n\" + content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}\n    {%- else -%}\n        {{ \"<|im_start|>assistant\\n"
    "\" + \"<think>\\n\\n</think>\\n\" + content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}\n    {%- endif -%}\n    {% en"
    "dgeneration %}\n{%- elif message.role == \"tool\" -%}\n{{ \"<|im_start|>\" + \"user\\n\"  + content + \"<|im_end"
    "|>\\n\" }}\n{%- endif -%}\n{%- endfor -%}\n{# \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 gener"
    "ation prompt \xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80\xe2\x94\x80 #}\n{%- if add_generation_prompt -%}\n"
    "{%- if reasoning_mode == \"/think\" -%}\n    {{ \"<|im_start|>assistant\\n\" }}\n{%- else -%}\n    {{ \"<|im_sta"
    "rt|>assistant\\n\" + \"<think>\\n\\n</think>\\n\"  }}\n{%- endif -%}\n{%- endif -%}";

/* LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct (3.5-7.8B's and EXAONE 3.0's render the same) */
static const char T_EXAONE35[] =
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}{{ '[|system|][|endofturn|]\\n' "
    "}}{% endif %}{{ '[|' + message['role'] + '|]' + message['content'] }}{% if message['role'] == 'user' %}{{ '\\n' "
    "}}{% else %}{{ '[|endofturn|]\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '[|assistant|]' }}{%"
    " endif %}";

/* LGAI-EXAONE/EXAONE-4.0-32B, as LG AI Research posted it in llama.cpp's EXAONE 4.0 pull request: tools,
 * tool calls and results, skip_think and enable_thinking */
static const char T_EXAONE4[] =
    "{%- if not skip_think is defined %}\n    {%- set skip_think = true %}\n{%- endif %}\n{%- set role_indicators = {"
    "\n    'user': '[|user|]\\n',\n    'assistant': '[|assistant|]\\n',\n    'system': '[|system|]\\n',\n    'tool': "
    "'[|tool|]\\n'\n} %}\n{%- set end_of_turn = '[|endofturn|]\\n' %}\n{%- macro available_tools(tools) %}\n    {{- "
    "\"# Available Tools\" }}\n    {{- \"\\nYou can use none, one, or multiple of the following tools by calling them"
    " as functions to help with the user\xe2\x80\x99s query.\" }}\n    {{- \"\\nHere are the tools available to you i"
    "n JSON format within <tool> and </tool> tags:\\n\" }}\n    {%- for tool in tools %}\n        {{- \"<tool>\" }}\n"
    "        {{- tool | tojson(ensure_ascii=False) | safe }}\n        {{- \"</tool>\\n\" }}\n    {%- endfor %}\n    {"
    "{- \"\\nFor each function call you want to make, return a JSON object with function name and arguments within <t"
    "ool_call> and </tool_call> tags, like:\" }}\n    {{- \"\\n<tool_call>{\\\"name\\\": function_1_name, \\\"argumen"
    "ts\\\": {argument_1_name: argument_1_value, argument_2_name: argument_2_value}}</tool_call>\" }}\n    {{- \"\\n<"
    "tool_call>{\\\"name\\\": function_2_name, \\\"arguments\\\": {...}}</tool_call>\\n...\" }}\n    {{- \"\\nNote th"
    "at if no argument name is specified for a tool, you can just print the argument value directly, without the argu"
    "ment name or JSON formatting.\" }}\n{%- endmacro %}\n{%- set ns = namespace(last_query_index = messages|length -"
    " 1) %}\n{%- for message in messages %}\n    {%- if message.role == \"user\" and message.content is string %}\n  "
    "      {%- set ns.last_query_index = loop.index0 -%}\n    {%- endif %}\n{%- endfor %}\n{%- for i in range(message"
    "s | length) %}\n    {%- set msg = messages[i] %}\n    {%- set role = msg.role %}\n    {%- if role not in role_in"
    "dicators %}\n        {{- raise_exception('Unknown role: ' ~ role) }}\n    {%- endif %}\n    \n    {%- if i == 0 "
    "%}\n        {%- if role == 'system' %}\n            {{- role_indicators['system'] }}\n            {{- msg.conten"
    "t }}\n            {%- if tools is defined and tools %}\n                {{- \"\\n\\n\" }}{{- available_tools(too"
    "ls) }}\n            {%- endif %}\n            {{- end_of_turn -}}\n            {%- continue %}\n        {%- elif"
    " tools is defined and tools %}            \n            {{- role_indicators['system'] }}\n            {{- availa"
    "ble_tools(tools) }}\n            {{- end_of_turn -}}            \n        {%- endif %}\n    {%- endif %}\n    {%"
    "- if role == 'assistant' %}\n        {{- role_indicators['assistant'] }}\n        {%- if msg.content %}        "
    "\n            {%- if \"</think>\" in msg.content %}\n                {%- set content = msg.content.split('</thin"
    "k>')[-1].strip() %}\n                {%- set reasoning_content = msg.content.split('</think>')[0].strip() %}\n  "
    "              {%- if reasoning_content.startswith(\"<think>\") %}\n                    {%- set reasoning_content"
    " = reasoning_content[9:].strip() %}\n                {%- endif %}\n            {%- else %}\n                {%- "
    "set content = msg.content %}\n            {%- endif %}\n            {%- if msg.reasoning_content %}\n           "
    "     {%- set reasoning_content = msg.reasoning_content %}\n            {%- endif %}\n            {%- if (not ski"
    "p_think and loop.last) and reasoning_content is defined %}\n                {{- \"<think>\\n\" }}\n             "
    "   {{- reasoning_content}}\n                {{- \"\\n</think>\\n\\n\" }}\n            {%- else %}\n             "
    "   {{- \"<think>\\n\\n</think>\\n\\n\" }}\n            {%- endif %}\n            {{- content }}\n        {%- end"
    "if %}\n        {%- if msg.tool_calls %}\n            {%- if msg.content %}\n                {{- \"\\n\" }}\n    "
    "        {%- else %}\n                {{- \"<think>\\n\\n</think>\\n\\n\" }}\n            {%- endif %}\n         "
    "   {%- for tool_call in msg.tool_calls %}\n                {%- if tool_call.function is defined %}\n            "
    "        {%- set tool_call = tool_call.function %}\n                {%- endif %}\n                {%- if tool_cal"
    "l.arguments is defined %}\n                    {%- set arguments = tool_call.arguments %}\n                {%- e"
    "lif tool_call.parameters is defined %}\n                    {%- set arguments = tool_call.parameters %}\n       "
    "         {%- else %}\n                    {{- raise_exception('arguments or parameters are mandatory: ' ~ tool_c"
    "all) }}\n                {%- endif %}\n                {{- \"<tool_call>\" }}{\"name\": \"{{- tool_call.name }}"
    "\", \"arguments\": {{ arguments | tojson(ensure_ascii=False) | safe }}}{{- \"</tool_call>\" }}\n                "
    "{%- if not loop.last %}\n                    {{- \"\\n\" }}\n                {%- endif %}\n            {%- endfo"
    "r %}\n        {%- endif %}\n        {{- end_of_turn -}}\n    {%- elif role == \"tool\" %}\n        {%- if i == 0"
    " or messages[i - 1].role != \"tool\" %}\n            {{- role_indicators['tool'] }}\n        {%- endif %}\n     "
    "   {%- if msg.content is defined %}            \n            {{- \"<tool_result>\" }}{\"result\": {{ msg.content"
    " | tojson(ensure_ascii=False) | safe }}}{{- \"</tool_result>\" }}            \n        {%- endif %}\n        {%-"
    " if loop.last or messages[i + 1].role != \"tool\" %}\n            {{- end_of_turn -}}\n        {%- else %}\n    "
    "        {{- \"\\n\" }}\n        {%- endif %}\n    {%- else %}\n        {{- role_indicators[role] }}\n        {{-"
    " msg.content }}\n        {{- end_of_turn -}}\n    {%- endif %}\n{% endfor %}\n{%- if add_generation_prompt %}\n "
    "   {{- role_indicators['assistant'] }}\n    {%- if enable_thinking is defined and enable_thinking is true %}\n  "
    "      {{- \"<think>\\n\" }}\n    {%- else %}\n        {{- \"<think>\\n\\n</think>\\n\\n\" }}\n    {%- endif %}\n"
    "{%- endif %}";

/* GLM-4-0414: THUDM/GLM-4-9B-0414's template as its tokenizer_config.json writes it, reconstructed
 * (no copy of that file's chat_template was at hand): the structure of GLM-Z1's below and of GLM-Z1-
 * Rumination-32B-0414's (its GGUF conversion log in ikawrakow/ik_llama.cpp), without the reasoning split,
 * with '<|assistant|>\n' as the generation prompt (llama.cpp's chatglm4 writes the same). */
static const char T_GLM4[] =
    "[gMASK]<sop>{%- if tools -%}<|system|>\n# 可用工具\n{% for tool in tools %}{%- set function = tool.functio"
    "n if tool.get(\"function\") else tool %}\n\n## {{ function.name }}\n\n{{ function | tojson(indent=4, ensure_as"
    "cii=False) }}\n在调用上述函数时，请使用 Json 格式表示调用的参数。{%- endfor %}{%- endif "
    "-%}{%- for msg in messages %}{%- if msg.role == 'system' %}<|system|>\n{{ msg.content }}{%- endif %}{%- endfor"
    " %}{%- for message in messages if message.role != 'system' %}{%- set role = message['role'] %}{%- set content "
    "= message['content'] %}{%- set meta = message.get(\"metadata\", \"\") %}{%- if role == 'user' %}<|user|>\n{{ c"
    "ontent }}{%- elif role == 'assistant' and not meta %}<|assistant|>\n{{ content }}{%- elif role == 'assistant' "
    "and meta %}<|assistant|>{{ meta }} \n{{ content }}{%- elif role == 'observation' %}<|observation|>\n{{ content"
    " }}{%- endif %}{%- endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/* GLM-Z1: zai-org/GLM-Z1-9B-0414's chat_template.jinja (GLM-Z1-32B-0414's is the same). */
static const char T_GLMZ1[] =
    "[gMASK]<sop>\n{%- if tools -%}\n<|system|>\n你是一个名为 ChatGLM 的人工智能助手。你是基于智"
    "谱 AI 公司训练的语言模型 GLM-4 模型开发的，你的任务是针对用户的问题和要求提供"
    "适当的答复和支持。\n\n# 可用工具\n{%- for tool in tools %}\n    {%- set function = tool.function "
    "if tool.get(\"function\") else tool %}\n\n## {{ function.name }}\n\n{{ function | tojson(indent=4, ensure_asci"
    "i=False) }}\n在调用上述函数时，请使用 Json 格式表示调用的参数。\n{%- endfor %}\n{%- endi"
    "f -%}\n\n{%- for msg in messages %}\n    {%- if msg.role == 'system' %}\n<|system|>\n{{ msg.content }}\n    {%"
    "- endif %}\n{%- endfor %}\n\n{%- for message in messages if message.role != 'system' %}\n    {%- set role = me"
    "ssage['role'] %}\n    {%- set content = message['content'] %}\n    {%- set visible = content.split('</think>')"
    "[-1].strip() %}\n    {%- set meta = message.get(\"metadata\", \"\") %}\n\n    {%- if role == 'user' %}\n<|user"
    "|>\n{{ visible }}\n    {%- elif role == 'assistant' and not meta %}\n<|assistant|>\n{{ visible }}\n    {%- eli"
    "f role == 'assistant' and meta %}\n<|assistant|>{{ meta }}\n{{ visible }}\n    {%- elif role == 'observation' "
    "%}\n<|observation|>\n{{ visible }}\n    {%- endif %}\n{%- endfor %}\n{% if add_generation_prompt %}<|assistant"
    "|>\n<think>{% endif %}";

/* A glm-4-9b-chat-like template (ours, reduced to its messages loop): system messages where they are. */
static const char T_GLM4_CHAT[] =
    "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>\n{{ item['content'] }}{% endfor %}{% if add_gener"
    "ation_prompt %}<|assistant|>{% endif %}";

/* CohereForAI/c4ai-command-r-v01, as its GGUF carries it (Ollama's library/command-r, in huggingface.js's
 * ollama-utils chat-template-automap.ts); Command R+'s and Aya 23's differ only in the never-written default
 * system prompt behind "elif false == true". */
static const char T_COMMAND_R[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_mes"
    "sage = messages[0]['content'] %}{% elif false == true %}{% set loop_messages = messages %}{% set system_messag"
    "e = 'You are a large language model called Command R built by the company Cohere. You act as a brilliant, soph"
    "isticated, AI-assistant chatbot trained to assist human users by providing thorough responses.' %}{% else %}{%"
    " set loop_messages = messages %}{% set system_message = false %}{% endif %}{% if system_message != false %}{{ "
    "'<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% for messa"
    "ge in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conver"
    "sation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% set content = message['content"
    "'] %}{% if message['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_O"
    "F_TURN_TOKEN|>' }}{% elif message['role'] == 'assistant' %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'  + co"
    "ntent.strip() + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|START_OF_"
    "TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}";

/* CohereForAI/c4ai-command-r7b-12-2024's default template (the same source, library/command-r7b), its
 * {% if documents %} branch (RAG: the "# System Preamble", tool macros) left out as macMLX's cohere2 override
 * does; the {%- else -%} branch every conversation without documents takes, verbatim. */
static const char T_COMMAND_R7B[] =
    "{% if documents %}\n{%- else -%}\n{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] "
    "%}\n    {%- set system_message = messages[0]['content'] %}{% elif false == true %}\n    {%- set loop_messages "
    "= messages %}{% set system_message = '' %}\n{%- else %}\n    {%- set loop_messages = messages %}\n    {%- set "
    "system_message = false %}\n{%- endif %}\n{%- if system_message != false -%}\n    {{ '<|START_OF_TURN_TOKEN|><|"
    "SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}\n{%- else -%}\n    {{ '<|START_OF_TURN_TOKEN|><|"
    "SYSTEM_TOKEN|><|END_OF_TURN_TOKEN|>' }}\n{%- endif %}\n{%- for message in loop_messages %}\n    {%- if (messag"
    "e['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception('Conversation roles must altern"
    "ate user/assistant/user/assistant/...') }}\n    {%- endif -%}\n    {%- set content = message['content'] -%}\n "
    "   {%- if message['role'] == 'user' -%}\n        {{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() "
    "+ '<|END_OF_TURN_TOKEN|>' }}\n    {%- elif message['role'] == 'assistant' -%}\n        {{ '<|START_OF_TURN_TOK"
    "EN|><|CHATBOT_TOKEN|><|START_RESPONSE|>'  + content.strip() + '<|END_RESPONSE|><|END_OF_TURN_TOKEN|>' }}\n    "
    "{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt -%}\n    {{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|"
    "><|START_RESPONSE|>' }}\n{%- endif %}\n{% endif %}";

/* Not one of ours (DeepSeek-V2): falls back. */
static const char T_DEEPSEEK[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ bos_token }}{% "
    "for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}{% elif "
    "message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == "
    "'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' "
    "}}{% endif %}";

/* ---- the conversation ---------------------------------------------------------------------- */

#define M(r, s) {r, s, sizeof s - 1}
static const chat_msg CONV[] = {
    M(CHAT_SYSTEM, "You are a helpful assistant"), M(CHAT_USER, "Hello"), M(CHAT_ASSISTANT, "Hi there"),
    M(CHAT_USER, "Who are you"), M(CHAT_ASSISTANT, "   I am an assistant   "), M(CHAT_USER, "Another question"),
};
#define N_CONV (sizeof CONV / sizeof CONV[0])

static void expect_render(const char *tmpl, chat_family want_family, const char *bos, const char *eos,
                          const chat_msg *m, size_t n, bool gen, const char *want)
{
    bool known = false;
    chat_family f = chat_detect(tmpl, &known);
    assert_int_equal(f, want_family);
    assert_true(known == (want_family != CHAT_PLAIN));
    chat_template t;
    assert_int_equal(chat_template_init(&t, f, tmpl, bos, eos), VKI_OK);
    chat_prompt p;
    char err[256] = "";
    vki_status st = chat_render(&t, m, n, gen, &p, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("%s: %s", chat_family_name(f), err);
    if (strcmp(p.text, want) || p.len != strlen(want))
        fail_msg("%s:\n got: [%s]\nwant: [%s]", chat_family_name(f), p.text, want);
    /* template spans are inside the text, ordered and disjoint */
    size_t end = 0;
    for (size_t k = 0; k < p.n_tmpl; k++) {
        assert_true(p.tmpl[k].off >= end && p.tmpl[k].len > 0);
        end = p.tmpl[k].off + p.tmpl[k].len;
    }
    assert_true(end <= p.len);
    chat_prompt_free(&p);
    chat_template_free(&t);
}

static void test_chatml(void **state)
{
    expect_render(T_CHATML, CHAT_CHATML, "", "", CONV, N_CONV, true,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
                  "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
                  "question<|im_end|>\n<|im_start|>assistant\n");
    expect_render(T_CHATML, CHAT_CHATML, "", "", CONV + 1, 1, false, "<|im_start|>user\nHello<|im_end|>\n");
    /* Qwen2: its literal system prompt when the conversation has none, nothing added otherwise */
    expect_render(T_QWEN2, CHAT_CHATML, "", "<|endoftext|>", CONV + 1, 1, true,
                  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(T_QWEN2, CHAT_CHATML, "", "", CONV, 2, true,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\n");
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_CHATML, T_QWEN25, "", ""), VKI_OK);
    assert_string_equal(t.default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    chat_template_free(&t);
}

/* Qwen3's real template: plain ChatML for this conversation (no default system prompt), and an
 * earlier assistant turn's reasoning dropped as the template drops it; the last turn keeps it. */
static void test_qwen3(void **state)
{
    expect_render(T_QWEN3, CHAT_CHATML, "", "<|im_end|>", CONV, N_CONV, true,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                  "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
                  "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
                  "question<|im_end|>\n<|im_start|>assistant\n");
    static const chat_msg think[] = {M(CHAT_USER, "Hello"), M(CHAT_ASSISTANT, "<think>\nhmm\n</think>\n\nHi there"),
                                     M(CHAT_USER, "Who are you")};
    expect_render(T_QWEN3, CHAT_CHATML, "", "<|im_end|>", think, 3, true,
                  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
                  "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n");
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_CHATML, T_QWEN3, "", ""), VKI_OK);
    assert_null(t.default_system);
    assert_true(t.strip_think);
    chat_template_free(&t);
}

static void test_llama3(void **state)
{
    expect_render(T_LLAMA3, CHAT_LLAMA3, "<|begin_of_text|>", "<|eot_id|>", CONV, N_CONV, true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
                  "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user"
                  "<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an "
                  "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_llama2(void **state)
{
    expect_render(T_LLAMA2, CHAT_LLAMA2, "<s>", "</s>", CONV, N_CONV, true,
                  "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] "
                  "Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]");
    /* strip() applies to the whole first turn, system block included */
    static const chat_msg ws[] = {M(CHAT_SYSTEM, "  S "), M(CHAT_USER, " \n")};
    expect_render(T_LLAMA2, CHAT_LLAMA2, "<s>", "</s>", ws, 2, true, "<s>[INST] <<SYS>>\n  S \n<</SYS>> [/INST]");
    /* no system message: plain turns */
    expect_render(T_LLAMA2, CHAT_LLAMA2, "<s>", "</s>", CONV + 1, 3, true,
                  "<s>[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST]");
}

static void test_mistral(void **state)
{
    /* the original v0.2 template, exact where it accepts the conversation */
    expect_render(T_MISTRAL, CHAT_MISTRAL, "<s>", "</s>", CONV + 1, N_CONV - 1, true,
                  "<s>[INST] Hello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] "
                  "Another question [/INST]");
    /* a system message (refused upstream) goes before the first user message */
    expect_render(T_MISTRAL, CHAT_MISTRAL, "<s>", "</s>", CONV, 2, true,
                  "<s>[INST] You are a helpful assistant\n\nHello [/INST]");
    /* the "v1" template */
    expect_render(T_MISTRAL_V1, CHAT_MISTRAL, "<s>", "</s>", CONV, N_CONV, true,
                  "<s> [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    "
                  "I am an assistant   </s> [INST] Another question [/INST]");
    /* Nemo's v3-tekken: no spaces, the system message in the last user turn only */
    expect_render(T_MISTRAL_NEMO, CHAT_MISTRAL, "<s>", "</s>", CONV, N_CONV, true,
                  "<s>[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]You are "
                  "a helpful assistant\n\nAnother question[/INST]");
    expect_render(T_MISTRAL_NEMO, CHAT_MISTRAL, "<s>", "</s>", CONV, 3, false, "<s>[INST]Hello[/INST]Hi there</s>");
    /* Small 3's v7-tekken: [SYSTEM_PROMPT] blocks, the template's default when there is none */
    expect_render(T_MISTRAL_V7, CHAT_MISTRAL, "<s>", "</s>", CONV, N_CONV, true,
                  "<s>[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who "
                  "are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]");
    expect_render(T_MISTRAL_V7, CHAT_MISTRAL, "<s>", "</s>", CONV + 1, 1, true,
                  "<s>[SYSTEM_PROMPT]You are Mistral Small 3, a \"helpful\" assistant.\nBe brief.[/SYSTEM_PROMPT]"
                  "[INST]Hello[/INST]");
    /* a later system message stays where it is; no alternation is required */
    static const chat_msg v7[] = {M(CHAT_USER, "a"), M(CHAT_SYSTEM, "b"), M(CHAT_USER, "c")};
    expect_render(T_MISTRAL_V7, CHAT_MISTRAL, "<s>", "</s>", v7, 3, true,
                  "<s>[SYSTEM_PROMPT]You are Mistral Small 3, a \"helpful\" assistant.\nBe brief.[/SYSTEM_PROMPT]"
                  "[INST]a[/INST][SYSTEM_PROMPT]b[/SYSTEM_PROMPT][INST]c[/INST]");
    /* Small 3.1's default appends today's date (strftime_now): no fixed default is written */
    static const char dated[] = "{%- set default_system_message = \"You are Mistral Small 3.1. Today is \" + today + "
                                "\".\" %}{{- bos_token }}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
                                "{{- '[INST]' + message['content'] + '[/INST]' }}";
    expect_render(dated, CHAT_MISTRAL, "<s>", "</s>", CONV + 1, 1, true, "<s>[INST]Hello[/INST]");
}

static void test_zephyr(void **state)
{
    expect_render(T_ZEPHYR, CHAT_ZEPHYR, "<s>", "</s>", CONV, N_CONV, true,
                  "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n"
                  "<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother "
                  "question</s>\n<|assistant|>\n");
    expect_render(T_ZEPHYR, CHAT_ZEPHYR, "<s>", "</s>", CONV + 1, 1, false, "<|user|>\nHello</s>\n");
}

static void test_gemma(void **state)
{
    expect_render(T_GEMMA, CHAT_GEMMA, "<bos>", "<eos>", CONV + 1, N_CONV - 1, true,
                  "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
                  "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an "
                  "assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n");
    /* system: Gemma 3's rule (prefix of the first user turn) */
    expect_render(T_GEMMA, CHAT_GEMMA, "<bos>", "<eos>", CONV, 2, true,
                  "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\n");
    /* Gemma 3's real template */
    expect_render(T_GEMMA3, CHAT_GEMMA, "<bos>", "<eos>", CONV, N_CONV, true,
                  "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\n"
                  "Hi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an "
                  "assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n");
}

static void test_deepseek(void **state)
{
    expect_render(T_DEEPSEEK_R1, CHAT_DEEPSEEK, DS_BOS, DS_EOS, CONV, N_CONV, true,
                  DS_BOS "You are a helpful assistant" DS_U "Hello" DS_A "Hi there" DS_EOS DS_U "Who are you" DS_A
                  "   I am an assistant   " DS_EOS DS_U "Another question" DS_A "<think>\n");
    /* an answer keeps what follows its last </think> only (no strip); the last system message,
     * wherever it stands, goes first; the first revision's generation prompt has no <think> */
    static const chat_msg r[] = {M(CHAT_USER, "q"), M(CHAT_ASSISTANT, "<think>\nhm\n</think>\n\nA"),
                                 M(CHAT_SYSTEM, "S1"), M(CHAT_SYSTEM, "S2"), M(CHAT_USER, "q2")};
    expect_render(T_DEEPSEEK_R1, CHAT_DEEPSEEK, DS_BOS, DS_EOS, r, 5, false,
                  DS_BOS "S2" DS_U "q" DS_A "\n\nA" DS_EOS DS_U "q2");
    static const char first_rev[] = "{{bos_token}}{{ns.system_prompt}}{{'" DS_U "' + message['content']}}"
                                    "{% if add_generation_prompt %}{{'" DS_A "'}}{% endif %}";
    expect_render(first_rev, CHAT_DEEPSEEK, DS_BOS, DS_EOS, CONV + 1, 1, true, DS_BOS DS_U "Hello" DS_A);
}

static void test_phi3(void **state)
{
    static const char want[] =
        "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi "
        "there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother "
        "question<|end|>\n<|assistant|>\n";
    expect_render(T_PHI35, CHAT_PHI3, "<s>", "<|endoftext|>", CONV, N_CONV, true, want);
    char with_bos[sizeof want + 3];
    snprintf(with_bos, sizeof with_bos, "<s>%s", want);
    expect_render(T_PHI3_SMALL, CHAT_PHI3, "<s>", "<|endoftext|>", CONV, N_CONV, true, with_bos);
    /* no generation prompt: eos; an empty system message is skipped */
    static const chat_msg m[] = {M(CHAT_SYSTEM, ""), M(CHAT_USER, "Hi")};
    expect_render(T_PHI35, CHAT_PHI3, "<s>", "<|endoftext|>", m, 2, false, "<|user|>\nHi<|end|>\n<|endoftext|>");
    /* Phi-3-mini-4k's first template: the system message is dropped, the assistant tag follows
     * every user turn whatever the generation prompt */
    static const char v1[] =
        "<s><|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n"
        "   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n";
    expect_render(T_PHI3_MINI, CHAT_PHI3, "<s>", "<|endoftext|>", CONV, N_CONV, true, v1);
    expect_render(T_PHI3_MINI, CHAT_PHI3, "<s>", "<|endoftext|>", CONV, N_CONV, false, v1);
    /* Phi-4-mini: every message, no newlines; phi-4: ChatML with <|im_sep|> */
    expect_render(T_PHI4_MINI, CHAT_PHI3, "<|endoftext|>", "<|endoftext|>", CONV, N_CONV, true,
                  "<|system|>You are a helpful assistant<|end|><|user|>Hello<|end|><|assistant|>Hi there<|end|><|user|>"
                  "Who are you<|end|><|assistant|>   I am an assistant   <|end|><|user|>Another question<|end|>"
                  "<|assistant|>");
    expect_render(T_PHI4_MINI, CHAT_PHI3, "<|endoftext|>", "<|endoftext|>", CONV + 1, 2, false,
                  "<|user|>Hello<|end|><|assistant|>Hi there<|end|><|endoftext|>");
    expect_render(T_PHI4, CHAT_CHATML, "<|endoftext|>", "<|im_end|>", CONV, N_CONV, true,
                  "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello"
                  "<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you"
                  "<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user"
                  "<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>");
}

/* gpt-oss's harmony template, rendered with a fixed date and reasoning effort. */
static void expect_harmony(const char *tmpl, chat_effort effort, const chat_msg *m, size_t n, bool gen,
                           const char *want)
{
    if (tmpl) {
        bool known = false;
        assert_int_equal(chat_detect(tmpl, &known), CHAT_HARMONY);
        assert_true(known);
    }
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_HARMONY, tmpl, "<|startoftext|>", "<|return|>"), VKI_OK);
    snprintf(t.date, sizeof t.date, "2025-08-05");
    t.effort = effort;
    chat_prompt p;
    char err[256] = "";
    if (chat_render(&t, m, n, gen, &p, err, sizeof err) != VKI_OK)
        fail_msg("harmony: %s", err);
    if (strcmp(p.text, want) || p.len != strlen(want))
        fail_msg("harmony:\n got: [%s]\nwant: [%s]", p.text, want);
    chat_prompt_free(&p);
    chat_template_free(&t);
}

#define H_SYS(effort)                                                                                          \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: " \
    "2024-06\nCurrent date: 2025-08-05\n\nReasoning: " effort "\n\n# Valid channels: analysis, commentary, "   \
    "final. Channel must be included for every message.<|end|>"

/* The expected strings are the template's output worked out by hand: the system message (today's
 * date where the template calls strftime_now; the line left out where it does not, as the harmony
 * library renders a conversation without a date), the first system message as the developer's
 * "# Instructions" with the template's "\n\n" after it, earlier answers on the final channel, the
 * last one closed by <|return|> without a generation prompt. */
static void test_harmony(void **state)
{
    expect_harmony(T_HARMONY, CHAT_EFFORT_MEDIUM, CONV, N_CONV, true,
                   H_SYS("medium") "<|start|>developer<|message|># Instructions\n\nYou are a helpful assistant"
                   "\n\n<|end|>"
                   "<|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|end|>"
                   "<|start|>user<|message|>Who are you<|end|><|start|>assistant<|channel|>final<|message|>   I am an "
                   "assistant   <|end|><|start|>user<|message|>Another question<|end|><|start|>assistant");
    static const chat_msg last[] = {M(CHAT_USER, "Hi"), M(CHAT_ASSISTANT, "Hello!")};
    expect_harmony(T_HARMONY, CHAT_EFFORT_HIGH, last, 2, false,
                   H_SYS("high") "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>"
                   "Hello!<|return|>");
    /* an empty system message writes no developer message; a later one is not written at all */
    static const chat_msg sys[] = {M(CHAT_SYSTEM, ""), M(CHAT_USER, "a"), M(CHAT_SYSTEM, "b"), M(CHAT_USER, "c")};
    expect_harmony(T_HARMONY, CHAT_EFFORT_LOW, sys, 4, true,
                   H_SYS("low") "<|start|>user<|message|>a<|end|><|start|>user<|message|>c<|end|><|start|>assistant");
    /* the canonical form (by name) is the template's; a template without strftime_now has no date */
    expect_harmony(NULL, CHAT_EFFORT_MEDIUM, CONV + 1, 1, true,
                   H_SYS("medium") "<|start|>user<|message|>Hello<|end|><|start|>assistant");
    static const char undated[] = "{{- \"<|start|>system<|message|>\" }}{{- \"Knowledge cutoff: 2024-06\\n\\n\" }}"
                                  "{{- \"<|channel|>final<|message|>\" }}";
    expect_harmony(undated, CHAT_EFFORT_LOW, CONV + 1, 1, true,
                   "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge "
                   "cutoff: 2024-06\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. Channel must "
                   "be included for every message.<|end|><|start|>user<|message|>Hello<|end|><|start|>assistant");
    /* no date given: today's, as strftime_now gives it (read on both sides of the render) */
    chat_template t;
    chat_prompt p;
    char before[16], after[16], err[256] = "";
    time_t now = time(NULL);
    strftime(before, sizeof before, "%Y-%m-%d", localtime(&now));
    assert_int_equal(chat_template_init(&t, CHAT_HARMONY, T_HARMONY, "", ""), VKI_OK);
    assert_int_equal(chat_render(&t, CONV + 1, 1, true, &p, NULL, 0), VKI_OK);
    now = time(NULL);
    strftime(after, sizeof after, "%Y-%m-%d", localtime(&now));
    char *d = strstr(p.text, "Current date: ");
    assert_non_null(d);
    assert_true(!strncmp(d + 14, before, 10) || !strncmp(d + 14, after, 10));
    assert_string_equal(d + 24, "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must "
                                "be included for every message.<|end|><|start|>user<|message|>Hello<|end|>"
                                "<|start|>assistant");
    chat_prompt_free(&p);
    /* the template raises on an answer that carries channel tags (reasoning goes elsewhere) */
    static const chat_msg tagged[] = {M(CHAT_USER, "q"), M(CHAT_ASSISTANT, "<|channel|>final<|message|>A")};
    assert_int_equal(chat_render(&t, tagged, 2, true, &p, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[1].content"));
    assert_null(p.text);
    chat_template_free(&t);
    /* the name, and the efforts' */
    chat_family f;
    assert_true(chat_family_parse("harmony", &f));
    assert_int_equal(f, CHAT_HARMONY);
    chat_effort e;
    assert_true(chat_effort_parse("high", &e) && e == CHAT_EFFORT_HIGH);
    assert_true(chat_effort_parse("low", &e) && e == CHAT_EFFORT_LOW);
    assert_false(chat_effort_parse("minimal", &e));
    assert_string_equal(chat_effort_name(CHAT_EFFORT_MEDIUM), "medium");
}

/* ---- OLMo 2 / Tülu 3, Granite, SmolLM3 -------------------------------------------------------- */

/* The first occurrence of `needle` in p's text lies wholly inside one template span (tmpl) or
 * outside all of them: what chat_tokenize will and will not parse for control tokens. */
static void expect_span(const chat_prompt *p, const char *needle, bool tmpl)
{
    const char *at = strstr(p->text, needle);
    if (!at)
        fail_msg("[%s] not in [%s]", needle, p->text);
    size_t a = (size_t)(at - p->text), b = a + strlen(needle);
    bool inside = false, overlaps = false;
    for (size_t k = 0; k < p->n_tmpl; k++) {
        size_t s0 = p->tmpl[k].off, s1 = s0 + p->tmpl[k].len;
        inside |= s0 <= a && b <= s1;
        overlaps |= s0 < b && a < s1;
    }
    if (tmpl ? !inside : overlaps)
        fail_msg("[%s] %s the template's text", needle, tmpl ? "is not all" : "is partly");
}

/* Renders on 2025-08-05 (the families that write today's date) with `think`; the family detected
 * from tmpl when given; opened for continue_final_message when `open`. *p: the prompt (free it). */
static void render_on(const char *tmpl, chat_family fam, chat_think think, const chat_msg *m, size_t n, bool gen,
                      bool open, const char *want, chat_prompt *p)
{
    if (tmpl) {
        bool known = false;
        assert_int_equal(chat_detect(tmpl, &known), fam);
        assert_true(known);
    }
    chat_template t;
    char err[256] = "";
    assert_int_equal(chat_template_init(&t, fam, tmpl, "<|endoftext|>", "<|endoftext|>"), VKI_OK);
    snprintf(t.date, sizeof t.date, "2025-08-05");
    t.think = think;
    if (chat_render(&t, m, n, gen, p, err, sizeof err) != VKI_OK)
        fail_msg("%s: %s", chat_family_name(fam), err);
    if (open)
        chat_prompt_open_end(p);
    if (strcmp(p->text, want) || p->len != strlen(want))
        fail_msg("%s:\n got: [%s]\nwant: [%s]", chat_family_name(fam), p->text, want);
    size_t end = 0;
    for (size_t k = 0; k < p->n_tmpl; k++) {
        assert_true(p->tmpl[k].off >= end && p->tmpl[k].len > 0);
        end = p->tmpl[k].off + p->tmpl[k].len;
    }
    assert_true(end <= p->len);
    chat_template_free(&t);
}

static void expect_on(const char *tmpl, chat_family fam, chat_think think, const chat_msg *m, size_t n, bool gen,
                      bool open, const char *want)
{
    chat_prompt p;
    render_on(tmpl, fam, think, m, n, gen, open, want, &p);
    chat_prompt_free(&p);
}

/* OLMo 2: eos after answers only, no newline after the last message when it is an answer; told
 * from Zephyr by its user turn, which ends in a newline, not eos_token. */
static void test_tulu(void **state)
{
    expect_render(T_OLMO2, CHAT_TULU, "<|endoftext|>", "<|endoftext|>", CONV, N_CONV, true,
                  "<|endoftext|><|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there"
                  "<|endoftext|>\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   <|endoftext|>\n"
                  "<|user|>\nAnother question\n<|assistant|>\n");
    expect_render(T_OLMO2, CHAT_TULU, "<|endoftext|>", "<|endoftext|>", CONV + 1, 1, false,
                  "<|endoftext|><|user|>\nHello\n");
    /* the last message an answer: eos and no newline; a generation prompt right after it */
    expect_render(T_OLMO2, CHAT_TULU, "<|endoftext|>", "<|endoftext|>", CONV + 1, 2, false,
                  "<|endoftext|><|user|>\nHello\n<|assistant|>\nHi there<|endoftext|>");
    expect_render(T_OLMO2, CHAT_TULU, "<|endoftext|>", "<|endoftext|>", CONV + 1, 2, true,
                  "<|endoftext|><|user|>\nHello\n<|assistant|>\nHi there<|endoftext|><|assistant|>\n");
    /* continue_final_message: the answer opened before its eos */
    expect_on(T_OLMO2, CHAT_TULU, CHAT_THINK_DEFAULT, CONV, 5, false, true,
              "<|endoftext|><|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there"
              "<|endoftext|>\n<|user|>\nWho are you\n<|assistant|>\n   I am an assistant   ");
    /* the same template written with Jinja's escapes and without bos_token: Tülu, no bos */
    static const char escaped[] =
        "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
        "'\\n' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n'  + message['content'] + eos_token "
        "}}{% endif %}{% endfor %}";
    expect_render(escaped, CHAT_TULU, "<|endoftext|>", "<|endoftext|>", CONV + 1, 1, true,
                  "<|user|>\nHello\n<|assistant|>\n");
    /* Zephyr's, in either spelling, stays Zephyr */
    assert_int_equal(chat_detect(T_ZEPHYR, NULL), CHAT_ZEPHYR);
    static const char zephyr_escaped[] =
        "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
        "eos_token }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n'  + message['content'] + "
        "eos_token }}{% endif %}{% endfor %}";
    assert_int_equal(chat_detect(zephyr_escaped, NULL), CHAT_ZEPHYR);
    chat_family f;
    assert_true(chat_family_parse("tulu", &f) && f == CHAT_TULU);
}

#define G_ROLE(r) "<|start_of_role|>" r "<|end_of_role|>"
#define G_END "<|end_of_text|>\n"
#define G_DEFAULT                                                                                              \
    G_ROLE("system") "Knowledge Cutoff Date: April 2024.\nToday's Date: August 05, 2025.\nYou are Granite, " \
                     "developed by IBM. You are a helpful AI assistant." G_END
/* The conversation as every Granite template writes it after its system message */
#define G_CONV                                                                                                  \
    G_ROLE("user") "Hello" G_END G_ROLE("assistant") "Hi there" G_END G_ROLE("user") "Who are you" G_END       \
        G_ROLE("assistant") "   I am an assistant   " G_END G_ROLE("user") "Another question" G_END

/* Granite 3.0: every message as it is; 3.1+: the first system message, or the dated default (3.3:
 * the thinking one with `thinking`), taken from the template's literals; the generation prompt
 * follows the last message only (none after a lone system message). */
static void test_granite(void **state)
{
    static const char conv[] = G_ROLE("system") "You are a helpful assistant" G_END G_CONV G_ROLE("assistant");
    expect_on(T_GRANITE30, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false, conv);
    expect_on(T_GRANITE31, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false, conv);
    expect_on(T_GRANITE33, CHAT_GRANITE, CHAT_THINK_ON, CONV, N_CONV, true, false, conv);
    expect_on(T_GRANITE30, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV + 1, 1, true, false,
              G_ROLE("user") "Hello" G_END G_ROLE("assistant"));
    /* no system message: 3.1's and 3.3's default, today's date as strftime_now('%B %d, %Y') */
    static const char dflt[] = G_DEFAULT G_CONV G_ROLE("assistant");
    expect_on(T_GRANITE31, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV + 1, N_CONV - 1, true, false, dflt);
    expect_on(T_GRANITE33, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV + 1, N_CONV - 1, true, false, dflt);
    expect_on(T_GRANITE31, CHAT_GRANITE, CHAT_THINK_ON, CONV + 1, N_CONV - 1, true, false, dflt); /* no switch */
    expect_on(NULL, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV + 1, N_CONV - 1, true, false, dflt);   /* by name: 3.3 */
    static const char think[] =
        G_ROLE("system") "Knowledge Cutoff Date: April 2024.\nToday's Date: August 05, 2025.\nYou are Granite, "
        "developed by IBM. You are a helpful AI assistant.\nRespond to every user query in a comprehensive and "
        "detailed way. You can write down your thoughts and reasoning process before responding. In the thought "
        "process, engage in a comprehensive cycle of analysis, summarization, exploration, reassessment, "
        "reflection, backtracing, and iteration to develop well-considered thinking process. In the response "
        "section, based on various attempts, explorations, and reflections from the thoughts section, "
        "systematically present the final solution that you deem correct. The response should summarize the "
        "thought process. Write your thoughts between <think></think> and write your response between "
        "<response></response> for each user query." G_END G_ROLE("user") "Hello" G_END G_ROLE("assistant");
    chat_prompt p;
    render_on(T_GRANITE33, CHAT_GRANITE, CHAT_THINK_ON, CONV + 1, 1, true, false, think, &p);
    expect_span(&p, "<think></think>", true); /* template text: its control tokens are parsed */
    expect_span(&p, "Hello", false);
    chat_prompt_free(&p);
    /* granite-3.2's thinking sentence (as IBM's documentation shows it rendered) comes from its literal */
    static const char g32[] =
        "{%- set system_message = \"Knowledge Cutoff Date: April 2024.\\nToday's Date: \" + strftime_now('%B %d, %Y') "
        "+ \".\\nYou are Granite, developed by IBM.\" %}\n{%- if documents %}\n{%- set system_message = "
        "system_message + \" Write the response.\" %}\n{%- elif thinking %}\n{%- set system_message = system_message "
        "+ \" You are a helpful AI assistant.\\nRespond to every user query in a comprehensive and detailed way. You "
        "can write down your thoughts and reasoning process before responding. Write your thoughts after 'Here is "
        "my thought process:' and write your response after 'Here is my response:' for each user query.\" %}\n{%- "
        "else %}\n{%- set system_message = system_message + \" You are a helpful AI assistant.\" %}\n{%- endif %}\n"
        "{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}";
    expect_on(g32, CHAT_GRANITE, CHAT_THINK_ON, CONV + 1, 1, false, false,
              G_ROLE("system") "Knowledge Cutoff Date: April 2024.\nToday's Date: August 05, 2025.\nYou are "
              "Granite, developed by IBM. You are a helpful AI assistant.\nRespond to every user query in a "
              "comprehensive and detailed way. You can write down your thoughts and reasoning process before "
              "responding. Write your thoughts after 'Here is my thought process:' and write your response after "
              "'Here is my response:' for each user query." G_END G_ROLE("user") "Hello" G_END);
    /* a lone system message: no generation prompt (3.1+ write it inside the loop over the others) */
    expect_on(T_GRANITE31, CHAT_GRANITE, CHAT_THINK_DEFAULT, CONV, 1, true, false,
              G_ROLE("system") "You are a helpful assistant" G_END);
    /* later system messages stay where they are; an answer last, without a generation prompt */
    static const chat_msg late[] = {M(CHAT_USER, "a"), M(CHAT_ASSISTANT, "b"), M(CHAT_SYSTEM, "c"),
                                    M(CHAT_USER, "d"), M(CHAT_ASSISTANT, "e")};
    expect_on(T_GRANITE33, CHAT_GRANITE, CHAT_THINK_DEFAULT, late, 5, false, false,
              G_DEFAULT G_ROLE("user") "a" G_END G_ROLE("assistant") "b" G_END G_ROLE("system") "c" G_END
              G_ROLE("user") "d" G_END G_ROLE("assistant") "e" G_END);
    /* continue_final_message: before the answer's <|end_of_text|> */
    expect_on(T_GRANITE33, CHAT_GRANITE, CHAT_THINK_DEFAULT, late, 5, false, true,
              G_DEFAULT G_ROLE("user") "a" G_END G_ROLE("assistant") "b" G_END G_ROLE("system") "c" G_END
              G_ROLE("user") "d" G_END G_ROLE("assistant") "e");
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_GRANITE, T_GRANITE30, "", ""), VKI_OK);
    assert_null(t.default_system);
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_GRANITE, T_GRANITE31, "", ""), VKI_OK);
    assert_string_equal(t.date_fmt, "%B %d, %Y");
    assert_null(t.system_tail[1]);
    chat_template_free(&t);
}

#define S_HEAD(mode)                                                                                           \
    "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: 05 August 2025\nReasoning " \
    "Mode: " mode "\n\n## Custom Instructions\n\n"
#define S_PERSONA "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
#define S_PERSONA_THINK                                                                                          \
    S_PERSONA " Your role as an assistant involves thoroughly exploring questions through a systematic thinking " \
    "process before providing the final precise and accurate solutions. This requires engaging in a "            \
    "comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and "     \
    "iteration to develop well-considered thinking process. Please structure your response into two main "        \
    "sections: Thought and Solution using the specified format: <think> Thought section </think> Solution "      \
    "section. In the Thought section, detail your reasoning process in steps. Each step should include detailed " \
    "considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, "        \
    "verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the "    \
    "Solution section, based on various attempts, explorations, and reflections from the Thought section, "      \
    "systematically present the final solution that you deem correct. The Solution section should be logical, "  \
    "accurate, and concise and detail necessary steps needed to reach the conclusion."

/* SmolLM3: the metadata block (left open: the released template closes it only with tools), the
 * reasoning mode from enable_thinking or the system message's /think, /no_think (removed from its
 * instructions, which are rstripped), the default personas, /system_override, answers opened with
 * an empty think block in /no_think and their reasoning kept in /think. */
static void test_smollm3(void **state)
{
    expect_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false,
              S_HEAD("/think") "You are a helpful assistant\n\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>"
              "assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   "
              "I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>"
              "assistant\n");
    chat_prompt p;
    render_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_DEFAULT, CONV + 1, 1, false, false,
              S_HEAD("/think") S_PERSONA_THINK "\n\n<|im_start|>user\nHello<|im_end|>\n", &p);
    expect_span(&p, "<think> Thought section </think>", true);
    chat_prompt_free(&p);
    expect_on(NULL, CHAT_SMOLLM3, CHAT_THINK_OFF, CONV + 1, 2, true, false,
              S_HEAD("/no_think") S_PERSONA "\n\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n"
              "\n</think>\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n");
    /* the system message's flag wins over enable_thinking and leaves the instructions; lstrip('\n')
     * of the answers; a later system message is not written */
    static const chat_msg flags[] = {M(CHAT_SYSTEM, "Be /no_think brief.  \n"), M(CHAT_USER, "Hello"),
                                     M(CHAT_ASSISTANT, "\n\nHi there"), M(CHAT_SYSTEM, "late"),
                                     M(CHAT_USER, "Who are you")};
    render_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_ON, flags, 5, true, false,
              S_HEAD("/no_think") "Be  brief.\n\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
              "<think>\n\n</think>\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>"
              "assistant\n<think>\n\n</think>\n", &p);
    expect_span(&p, "Be  brief.", false); /* the user's text, not the template's */
    chat_prompt_free(&p);
    static const chat_msg think[] = {M(CHAT_SYSTEM, "/think"), M(CHAT_USER, "q"),
                                     M(CHAT_ASSISTANT, "<think>\nhm\n</think>\nA"), M(CHAT_USER, "q2")};
    expect_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_OFF, think, 4, true, false,
              S_HEAD("/think") S_PERSONA_THINK "\n\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n"
              "hm\n</think>\nA<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n");
    /* continue_final_message: the answer opened before its <|im_end|> */
    expect_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_DEFAULT, think, 3, false, true,
              S_HEAD("/think") S_PERSONA_THINK "\n\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n"
              "hm\n</think>\nA");
    static const chat_msg over[] = {M(CHAT_SYSTEM, "You are X. /system_override /no_think"), M(CHAT_USER, "q")};
    expect_on(T_SMOLLM3, CHAT_SMOLLM3, CHAT_THINK_DEFAULT, over, 2, true, false,
              "<|im_start|>system\nYou are X.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
              "<think>\n\n</think>\n");
    /* Unsloth's edit (llama.cpp's copy), reduced to its markers: no date, no override, the block
     * closed */
    static const char unsloth[] =
        "{{- \"<|im_start|>system\\n\" -}}{{- \"## Metadata\\n\\n\" -}}{{- \"Knowledge Cutoff Date: June 2025\\n\" "
        "-}}{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}{{- \"<|im_end|>\\n\" -}}";
    expect_on(unsloth, CHAT_SMOLLM3, CHAT_THINK_DEFAULT, over + 1, 1, true, false,
              "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /think\n\n## "
              "Custom Instructions\n\n" S_PERSONA_THINK "\n\n<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
              "<|im_start|>assistant\n");
    /* still ChatML with reasoning for the server's reasoning_format auto; Qwen3's strip stays off */
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_SMOLLM3, T_SMOLLM3, "", ""), VKI_OK);
    assert_true(chat_thinks(&t) && !t.strip_think && t.dated && !t.smollm3_closed);
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_CHATML, T_QWEN3, "", ""), VKI_OK);
    assert_true(chat_thinks(&t));
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_CHATML, T_CHATML, "", ""), VKI_OK);
    assert_false(chat_thinks(&t));
    chat_template_free(&t);
}

#define E4_USER(s) "[|user|]\n" s "[|endofturn|]\n"
#define E4_ANSWER(s) "[|assistant|]\n<think>\n\n</think>\n\n" s "[|endofturn|]\n"
#define E4_GEN "[|assistant|]\n<think>\n\n</think>\n\n"

/* EXAONE 3.x and 4.0, the expected strings as jinja2 3.1 renders the real templates with transformers'
 * settings (trim_blocks, lstrip_blocks, loopcontrols). 3.x: an empty system turn first when there is no
 * system message, nothing trimmed, a user turn closed by a newline only, "[|assistant|]" as the
 * generation prompt. 4.0: "[|role|]\n" + content + "[|endofturn|]\n" for every message, no default
 * system turn, answers behind an empty reasoning block and cut to what follows their last "</think>"
 * (stripped), the generation prompt opening the reasoning only with enable_thinking. */
static void test_exaone(void **state)
{
    expect_on(T_EXAONE35, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false,
              "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there"
              "[|endofturn|]\n[|user|]Who are you\n[|assistant|]   I am an assistant   [|endofturn|]\n[|user|]"
              "Another question\n[|assistant|]");
    expect_on(T_EXAONE35, CHAT_EXAONE, CHAT_THINK_ON, CONV + 1, 2, false, false,
              "[|system|][|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there[|endofturn|]\n");
    expect_on(T_EXAONE35, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV, 0, true, false, "[|assistant|]");
    static const chat_msg late[] = {M(CHAT_USER, "a"), M(CHAT_ASSISTANT, "b"), M(CHAT_SYSTEM, "c"), M(CHAT_USER, "d")};
    expect_on(T_EXAONE35, CHAT_EXAONE, CHAT_THINK_DEFAULT, late, 4, true, false,
              "[|system|][|endofturn|]\n[|user|]a\n[|assistant|]b[|endofturn|]\n[|system|]c[|endofturn|]\n[|user|]d\n"
              "[|assistant|]");
    /* continue_final_message: the answer opened before its [|endofturn|] */
    expect_on(T_EXAONE35, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV, 5, false, true,
              "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there"
              "[|endofturn|]\n[|user|]Who are you\n[|assistant|]   I am an assistant   ");

    static const char conv4[] = "[|system|]\nYou are a helpful assistant[|endofturn|]\n" E4_USER("Hello")
        E4_ANSWER("Hi there") E4_USER("Who are you") E4_ANSWER("   I am an assistant   ") E4_USER("Another question")
        E4_GEN;
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false, conv4);
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_OFF, CONV, N_CONV, true, false, conv4); /* enable_thinking false */
    expect_on(NULL, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false, conv4);  /* by name: 4.0's */
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV + 1, 0, true, false, E4_GEN);
    chat_prompt p;
    render_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_ON, CONV + 1, 1, true, false,
              E4_USER("Hello") "[|assistant|]\n<think>\n", &p);
    expect_span(&p, "[|assistant|]\n<think>\n", true); /* the reasoning opened by the template */
    expect_span(&p, "Hello", false);
    chat_prompt_free(&p);
    /* an answer's reasoning is not written (skip_think), what follows its last </think> is stripped, an
     * empty answer has no block, one of blanks keeps them; later system messages stay where they are */
    static const chat_msg r[] = {M(CHAT_SYSTEM, "S"), M(CHAT_USER, "q"),
                                 M(CHAT_ASSISTANT, "<think>\nhm\n</think>\n\n  A  "), M(CHAT_ASSISTANT, ""),
                                 M(CHAT_SYSTEM, "late"), M(CHAT_USER, "q2"),
                                 M(CHAT_ASSISTANT, "x</think>y</think> z "), M(CHAT_ASSISTANT, " \n ")};
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_ON, r, 8, false, false,
              "[|system|]\nS[|endofturn|]\n" E4_USER("q") E4_ANSWER("A") "[|assistant|]\n[|endofturn|]\n"
              "[|system|]\nlate[|endofturn|]\n" E4_USER("q2") E4_ANSWER("z") E4_ANSWER(" \n "));
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_ON, r + 1, 2, true, false,
              E4_USER("q") E4_ANSWER("A") "[|assistant|]\n<think>\n");
    /* continue_final_message: the answer opened after its empty reasoning block */
    expect_on(T_EXAONE4, CHAT_EXAONE, CHAT_THINK_DEFAULT, CONV + 1, 2, false, true,
              E4_USER("Hello") "[|assistant|]\n<think>\n\n</think>\n\nHi there");

    /* llama.cpp's rules: all three markers for EXAONE, "[|tool|]" for 4.0; 4.0 thinks, 3.x does not */
    assert_int_equal(chat_detect("[|user|]{{ content }}[|endofturn|][|assistant|]", NULL), CHAT_PLAIN);
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_EXAONE, T_EXAONE4, "[BOS]", "[|endofturn|]"), VKI_OK);
    assert_true(t.exaone4 && chat_thinks(&t) && !t.emit_bos && !t.strip_think);
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_EXAONE, T_EXAONE35, "[BOS]", "[|endofturn|]"), VKI_OK);
    assert_true(!t.exaone4 && !chat_thinks(&t) && !t.emit_bos);
    chat_template_free(&t);
    chat_family f;
    assert_true(chat_family_parse("exaone", &f) && f == CHAT_EXAONE);
}

#define GLM_CONV(answer)                                                                                      \
    "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are " \
    "you<|assistant|>\n" answer "<|user|>\nAnother question"

/* GLM-4-0414 and GLM-Z1, the expected strings as jinja2 3.1 renders the templates above with
 * transformers' settings (trim_blocks, lstrip_blocks, loopcontrols). Both: '[gMASK]<sop>', every
 * system message first, '<|role|>\n' + content, nothing after a turn. GLM-4-0414: nothing trimmed,
 * '<|assistant|>\n' to generate. Z1: every non-system message cut to what follows its last '</think>'
 * and stripped (user turns too), '<|assistant|>\n<think>' to generate. */
static void test_glm4(void **state)
{
    (void)state;
    expect_on(T_GLM4, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false,
              GLM_CONV("   I am an assistant   ") "<|assistant|>\n");
    expect_on(NULL, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false,
              GLM_CONV("   I am an assistant   ") "<|assistant|>\n"); /* by name: GLM-4-0414's */
    expect_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV, N_CONV, true, false,
              GLM_CONV("I am an assistant") "<|assistant|>\n<think>");
    expect_on(T_GLM4, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV + 1, 2, false, false,
              "[gMASK]<sop><|user|>\nHello<|assistant|>\nHi there");
    expect_on(T_GLM4, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV, 0, true, false, "[gMASK]<sop><|assistant|>\n");
    expect_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV, 0, true, false, "[gMASK]<sop><|assistant|>\n<think>");
    /* a later system message is written with the first ones */
    static const chat_msg late[] = {M(CHAT_USER, "a"), M(CHAT_ASSISTANT, "b"), M(CHAT_SYSTEM, "c"), M(CHAT_USER, "d")};
    expect_on(T_GLM4, CHAT_GLM4, CHAT_THINK_DEFAULT, late, 4, true, false,
              "[gMASK]<sop><|system|>\nc<|user|>\na<|assistant|>\nb<|user|>\nd<|assistant|>\n");
    expect_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, late, 4, true, false,
              "[gMASK]<sop><|system|>\nc<|user|>\na<|assistant|>\nb<|user|>\nd<|assistant|>\n<think>");
    /* glm-4-9b-chat's kind (no "message.role != 'system'"): in order, its own generation prompt */
    expect_on(T_GLM4_CHAT, CHAT_GLM4, CHAT_THINK_DEFAULT, late, 4, true, false,
              "[gMASK]<sop><|user|>\na<|assistant|>\nb<|system|>\nc<|user|>\nd<|assistant|>");
    /* reasoning: GLM-4-0414 keeps every text; Z1 cuts after the last </think> and strips, system
     * messages untouched, an empty answer and one of blanks both empty */
    static const chat_msg r[] = {M(CHAT_SYSTEM, "S"), M(CHAT_USER, " q </think> u "),
                                 M(CHAT_ASSISTANT, "<think>\nhm\n</think>\n\n  A  "), M(CHAT_ASSISTANT, ""),
                                 M(CHAT_SYSTEM, " late "), M(CHAT_USER, "q2"),
                                 M(CHAT_ASSISTANT, "x</think>y</think> z "), M(CHAT_ASSISTANT, " \n ")};
    expect_on(T_GLM4, CHAT_GLM4, CHAT_THINK_DEFAULT, r, 8, false, false,
              "[gMASK]<sop><|system|>\nS<|system|>\n late <|user|>\n q </think> u <|assistant|>\n<think>\nhm\n"
              "</think>\n\n  A  <|assistant|>\n<|user|>\nq2<|assistant|>\nx</think>y</think> z <|assistant|>\n \n ");
    expect_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, r, 8, false, false,
              "[gMASK]<sop><|system|>\nS<|system|>\n late <|user|>\nu<|assistant|>\nA<|assistant|>\n<|user|>\nq2"
              "<|assistant|>\nz<|assistant|>\n");
    chat_prompt p;
    render_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV + 1, 1, true, false,
              "[gMASK]<sop><|user|>\nHello<|assistant|>\n<think>", &p);
    expect_span(&p, "[gMASK]<sop><|user|>\n", true);
    expect_span(&p, "<|assistant|>\n<think>", true); /* the reasoning opened by the template */
    expect_span(&p, "Hello", false);
    chat_prompt_free(&p);
    /* continue_final_message: nothing follows a turn, the answer stays open as it is */
    expect_on(T_GLMZ1, CHAT_GLM4, CHAT_THINK_DEFAULT, CONV + 1, 2, false, true,
              "[gMASK]<sop><|user|>\nHello<|assistant|>\nHi there");

    /* llama.cpp's "[gMASK]<sop>"; not ChatGLM3's "[gMASK]sop", nor GLM-4.5's and later (visible_text) */
    assert_int_equal(chat_detect("[gMASK]sop{% for m in messages %}<|{{ m.role }}|>\n {{ m.content }}{% endfor %}",
                                 NULL), CHAT_PLAIN);
    assert_int_equal(chat_detect("[gMASK]<sop>{%- macro visible_text(content) -%}<|user|><|assistant|>", NULL),
                     CHAT_PLAIN);
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_GLM4, T_GLMZ1, "[gMASK]", "<|endoftext|>"), VKI_OK);
    assert_true(t.glm4_visible && t.glm4_system_first && chat_thinks(&t) && !t.emit_bos);
    assert_string_equal(t.glm4_gen, "<|assistant|>\n<think>");
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_GLM4, T_GLM4, "[gMASK]", "<|endoftext|>"), VKI_OK);
    assert_true(!t.glm4_visible && t.glm4_system_first && !chat_thinks(&t) && !t.emit_bos);
    assert_string_equal(t.glm4_gen, "<|assistant|>\n");
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_GLM4, T_GLM4_CHAT, NULL, NULL), VKI_OK);
    assert_true(!t.glm4_system_first && !chat_thinks(&t));
    assert_string_equal(t.glm4_gen, "<|assistant|>");
    chat_template_free(&t);
    chat_family f;
    assert_true(chat_family_parse("glm4", &f) && f == CHAT_GLM4);
}

#define CR_SYS(s) "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>" s "<|END_OF_TURN_TOKEN|>"
#define CR_USER(s) "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>" s "<|END_OF_TURN_TOKEN|>"
#define CR_GEN "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
#define CR_ANSWER(s) CR_GEN s "<|END_OF_TURN_TOKEN|>"
#define R7B_GEN CR_GEN "<|START_RESPONSE|>"
#define R7B_ANSWER(s) R7B_GEN s "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"

/* The reply split whole and byte by byte: reasoning r, answer c. */
static void expect_cohere_split(const char *reply, const char *r, const char *c)
{
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        chat_cohere s = {0};
        strbuf br = {0}, bc = {0};
        size_t n = strlen(reply);
        for (size_t i = 0; i < n; i += bytewise ? 1 : n)
            assert_true(chat_cohere_feed(&s, reply + i, bytewise ? 1 : n, false, &br, &bc));
        assert_true(chat_cohere_feed(&s, "", 0, true, &br, &bc) && strbuf_put(&br, "", 0) && strbuf_put(&bc, "", 0));
        assert_string_equal(br.p, r);
        assert_string_equal(bc.p, c);
        strbuf_free(&br), strbuf_free(&bc);
    }
}

/* Command-R and Command R7B, the expected strings as jinja2 3.1 renders the templates above with
 * transformers' settings (trim_blocks, lstrip_blocks). Both: a first system message as it is, user
 * turns and answers stripped, roles alternating. Command-R: bos first, no system turn without a
 * system message. R7B: no bos, an empty system turn, answers wrapped in <|START_RESPONSE|> ...
 * <|END_RESPONSE|>, the generation prompt opening the response; its reply's thinking split off. */
static void test_command_r(void **state)
{
    (void)state;
    expect_render(T_COMMAND_R, CHAT_COMMAND_R, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", CONV, N_CONV, true,
                  "<BOS_TOKEN>" CR_SYS("You are a helpful assistant") CR_USER("Hello") CR_ANSWER("Hi there")
                  CR_USER("Who are you") CR_ANSWER("I am an assistant") CR_USER("Another question") CR_GEN);
    expect_render(T_COMMAND_R, CHAT_COMMAND_R, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", CONV + 1, 2, false,
                  "<BOS_TOKEN>" CR_USER("Hello") CR_ANSWER("Hi there"));
    expect_on(NULL, CHAT_COMMAND_R, CHAT_THINK_DEFAULT, CONV + 1, 1, true, false, /* by name: Command-R's */
              "<|endoftext|>" CR_USER("Hello") CR_GEN);
    expect_render(T_COMMAND_R7B, CHAT_COMMAND_R, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", CONV, N_CONV, true,
                  CR_SYS("You are a helpful assistant") CR_USER("Hello") R7B_ANSWER("Hi there") CR_USER("Who are you")
                  R7B_ANSWER("I am an assistant") CR_USER("Another question") R7B_GEN);
    expect_render(T_COMMAND_R7B, CHAT_COMMAND_R, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", CONV + 1, 2, false,
                  CR_SYS("") CR_USER("Hello") R7B_ANSWER("Hi there"));
    /* the system message kept as it is, an answer's markers in its text written as text */
    static const chat_msg ws[] = {M(CHAT_SYSTEM, " S \n"), M(CHAT_USER, "\n q "),
                                  M(CHAT_ASSISTANT, " <|START_THINKING|>t<|END_THINKING|> a ")};
    expect_render(T_COMMAND_R, CHAT_COMMAND_R, "<BOS_TOKEN>", "", ws, 3, true,
                  "<BOS_TOKEN>" CR_SYS(" S \n") CR_USER("q") CR_ANSWER("<|START_THINKING|>t<|END_THINKING|> a")
                  CR_GEN);
    chat_prompt p;
    render_on(T_COMMAND_R7B, CHAT_COMMAND_R, CHAT_THINK_DEFAULT, ws, 3, true, false,
              CR_SYS(" S \n") CR_USER("q") R7B_ANSWER("<|START_THINKING|>t<|END_THINKING|> a") R7B_GEN, &p);
    expect_span(&p, "<|START_THINKING|>", false);
    expect_span(&p, "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>", true);
    chat_prompt_free(&p);
    /* continue_final_message: the response opened after its <|START_RESPONSE|> */
    expect_on(T_COMMAND_R7B, CHAT_COMMAND_R, CHAT_THINK_DEFAULT, CONV + 1, 2, false, true,
              CR_SYS("") CR_USER("Hello") R7B_GEN "Hi there");

    /* llama.cpp's rule: both markers; R7B by its <|START_RESPONSE|>; neither thinks in <think> */
    assert_int_equal(chat_detect("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ m }}", NULL), CHAT_PLAIN);
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_COMMAND_R, T_COMMAND_R7B, "<BOS_TOKEN>", "<EOS_TOKEN>"), VKI_OK);
    assert_true(t.command_r7b && !t.emit_bos && !chat_thinks(&t));
    chat_template_free(&t);
    assert_int_equal(chat_template_init(&t, CHAT_COMMAND_R, T_COMMAND_R, "<BOS_TOKEN>", "<EOS_TOKEN>"), VKI_OK);
    assert_true(!t.command_r7b && t.emit_bos && !chat_thinks(&t));
    chat_template_free(&t);
    chat_family f;
    assert_true(chat_family_parse("command-r", &f) && f == CHAT_COMMAND_R);

    /* R7B's reply: the thinking is reasoning, the response markers go, anything else is answer */
    expect_cohere_split("Just the answer.", "", "Just the answer.");
    expect_cohere_split("<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>A <|START_x<|END_RESPONSE|>", "plan",
                        "A <|START_x");
    expect_cohere_split("<|START_THINKING|>p<|END_THINKING|><|START_ACTION|>[]<|END_ACTION|>", "p",
                        "<|START_ACTION|>[]<|END_ACTION|>");
    expect_cohere_split("<|START_THINKING|>cut <|END_", "cut <|END_", ""); /* held back, then text */
}

static void test_fallback(void **state)
{
    static const char want[] = "system: You are a helpful assistant\nuser: Hello\nassistant: Hi there\nuser: Who are "
                               "you\nassistant:    I am an assistant   \nuser: Another question\nassistant:";
    expect_render(NULL, CHAT_PLAIN, "<s>", "</s>", CONV, N_CONV, true, want);
    expect_render("", CHAT_PLAIN, "<s>", "</s>", CONV, N_CONV, true, want);
    expect_render(T_DEEPSEEK, CHAT_PLAIN, "<s>", "</s>", CONV, N_CONV, true, want);
    chat_family f;
    for (int k = 0; k < CHAT_FAMILY_COUNT; k++) {
        assert_true(chat_family_parse(chat_family_name((chat_family)k), &f));
        assert_int_equal(f, k);
    }
    assert_false(chat_family_parse("jinja", &f));
}

/* chat_prompt_open_end (continue_final_message) on every family: the conversation ending with the
 * assistant's turn, rendered closed, then opened: a prefix of the closed text that ends in that
 * turn's text (spaces the template trims aside), its template spans still inside it. */
static void test_open_end(void **state)
{
    (void)state;
    for (int k = 0; k < CHAT_FAMILY_COUNT; k++) {
        chat_template t;
        assert_int_equal(chat_template_init(&t, (chat_family)k, NULL, "<s>", "</s>"), VKI_OK);
        chat_prompt p;
        char err[256] = "", closed[2048];
        if (chat_render(&t, CONV, N_CONV - 1, false, &p, err, sizeof err) != VKI_OK)
            fail_msg("%s: %s", chat_family_name((chat_family)k), err);
        snprintf(closed, sizeof closed, "%s", p.text);
        chat_prompt_open_end(&p);
        assert_int_equal(strlen(p.text), p.len);
        /* (GLM writes nothing after a turn: the prompt is open as rendered) */
        assert_true((k == CHAT_GLM4 ? p.len <= strlen(closed) : p.len < strlen(closed)) &&
                    !strncmp(p.text, closed, p.len));
        size_t n = p.len;
        while (n && p.text[n - 1] == ' ')
            n--;
        if (n < 17 || strncmp(p.text + n - 17, "I am an assistant", 17))
            fail_msg("%s: opened [%s]", chat_family_name((chat_family)k), p.text);
        for (size_t i = 0; i < p.n_tmpl; i++)
            assert_true(p.tmpl[i].off + p.tmpl[i].len <= p.len);
        chat_prompt_free(&p);
        chat_template_free(&t);
    }
}

/* The upstream templates raise on these (Llama 2's, Mistral's, Gemma's, Command-R's); we answer with an
 * error naming the message. */
static void test_errors(void **state)
{
    static const chat_msg uu[] = {M(CHAT_USER, "a"), M(CHAT_USER, "b")};
    static const chat_msg a_first[] = {M(CHAT_SYSTEM, "s"), M(CHAT_ASSISTANT, "a")};
    static const chat_msg late_sys[] = {M(CHAT_USER, "a"), M(CHAT_ASSISTANT, "b"), M(CHAT_SYSTEM, "c")};
    const chat_family fams[] = {CHAT_LLAMA2, CHAT_MISTRAL, CHAT_GEMMA, CHAT_COMMAND_R};
    for (size_t k = 0; k < 4; k++) {
        chat_template t;
        assert_int_equal(chat_template_init(&t, fams[k], NULL, "<s>", "</s>"), VKI_OK);
        chat_prompt p;
        char err[256] = "";
        assert_int_equal(chat_render(&t, uu, 2, true, &p, err, sizeof err), VKI_ERR_INVALID_ARG);
        assert_non_null(strstr(err, "messages[1].role"));
        assert_int_equal(chat_render(&t, a_first, 2, true, &p, err, sizeof err), VKI_ERR_INVALID_ARG);
        assert_non_null(strstr(err, "messages[1].role"));
        assert_int_equal(chat_render(&t, late_sys, 3, true, &p, err, sizeof err), VKI_ERR_INVALID_ARG);
        assert_non_null(strstr(err, "messages[2].role"));
        assert_null(p.text);
        chat_template_free(&t);
    }
    /* ChatML accepts any order */
    chat_template t;
    chat_prompt p;
    assert_int_equal(chat_template_init(&t, CHAT_CHATML, NULL, "", ""), VKI_OK);
    assert_int_equal(chat_render(&t, uu, 2, true, &p, NULL, 0), VKI_OK);
    chat_prompt_free(&p);
}

/* ---- tokenisation ------------------------------------------------------------------------- */

static vki_tokenizer *load_vocab(const char *name)
{
    char path[1024], err[256] = "";
    if (!vt_shared_model(name, path, sizeof path)) {
        printf("SKIP: %s/models/%s not found\n", VKI_SHARED_DIR, name);
        skip();
    }
    vki_tokenizer *tok = NULL;
    if (vki_tokenizer_load(path, &tok, err, sizeof err) != VKI_OK)
        fail_msg("%s: %s", name, err);
    return tok;
}

static int32_t *tokenize_all(const vki_tokenizer *tok, const char *s, bool special, size_t *n)
{
    size_t cap = strlen(s) + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    assert_int_equal(vki_tokenize(tok, s, strlen(s), false, special, ids, cap, n), VKI_OK);
    return ids;
}

/* Without special text in the messages, chat_tokenize = vki_tokenize(parse_special) of the text:
 * the template's control tokens are recognised and the text between them merges as usual. */
static void check_same_as_library(const vki_tokenizer *tok, const chat_specials *sp, chat_family f)
{
    char bos[64], eos[64];
    chat_token_texts(tok, bos, sizeof bos, eos, sizeof eos);
    chat_template t;
    chat_prompt p;
    assert_int_equal(chat_template_init(&t, f, NULL, bos, eos), VKI_OK);
    assert_int_equal(chat_render(&t, CONV, N_CONV, true, &p, NULL, 0), VKI_OK);
    int32_t *ids;
    size_t n, n_ref;
    assert_int_equal(chat_tokenize(sp, tok, &p, false, &ids, &n), VKI_OK);
    int32_t *ref = tokenize_all(tok, p.text, true, &n_ref);
    if (n != n_ref || memcmp(ids, ref, n * sizeof *ids))
        fail_msg("%s: %zu ids, the library gives %zu", chat_family_name(f), n, n_ref);
    free(ids);
    free(ref);
    chat_prompt_free(&p);
    chat_template_free(&t);
}

static void test_tokenize_spm(void **state)
{
    vki_tokenizer *tok = load_vocab("vocab/ggml-vocab-llama-spm.gguf");
    chat_specials *sp;
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++)
        check_same_as_library(tok, sp, (chat_family)f);

    /* Llama 2: the template's "<s>" and "</s>" are ids 1 and 2; the user's "</s>" is text */
    chat_template t;
    chat_prompt p;
    assert_int_equal(chat_template_init(&t, CHAT_LLAMA2, NULL, "<s>", "</s>"), VKI_OK);
    static const chat_msg m[] = {M(CHAT_USER, "hi </s><s> there"), M(CHAT_ASSISTANT, "ok")};
    assert_int_equal(chat_render(&t, m, 2, true, &p, NULL, 0), VKI_OK);
    assert_string_equal(p.text, "<s>[INST] hi </s><s> there [/INST] ok </s>");
    int32_t *ids;
    size_t n;
    assert_int_equal(chat_tokenize(sp, tok, &p, true, &ids, &n), VKI_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 2);
    for (size_t i = 1; i + 1 < n; i++)
        assert_true(ids[i] != 1 && ids[i] != 2);
    /* the middle is exactly the plain tokenisation of the text between the two specials */
    size_t n_mid;
    int32_t *mid = tokenize_all(tok, "[INST] hi </s><s> there [/INST] ok ", false, &n_mid);
    assert_int_equal(n, n_mid + 2);
    assert_memory_equal(ids + 1, mid, n_mid * sizeof *mid);
    free(mid);
    free(ids);
    chat_prompt_free(&p);
    chat_template_free(&t);

    /* plain fallback: BOS added once (add_bos), none in the text */
    assert_int_equal(chat_template_init(&t, CHAT_PLAIN, NULL, "<s>", "</s>"), VKI_OK);
    assert_int_equal(chat_render(&t, m, 1, true, &p, NULL, 0), VKI_OK);
    assert_int_equal(chat_tokenize(sp, tok, &p, true, &ids, &n), VKI_OK);
    assert_int_equal(ids[0], 1);
    for (size_t i = 1; i < n; i++)
        assert_true(ids[i] != 1 && ids[i] != 2);
    free(ids);
    chat_prompt_free(&p);
    chat_template_free(&t);
    chat_specials_free(sp);
    vki_tokenizer_free(tok);
}

/* Byte-level BPE: "<|endoftext|>" is a control token of GPT-2's vocabulary. */
static void test_tokenize_bpe(void **state)
{
    vki_tokenizer *tok = load_vocab("vocab/ggml-vocab-gpt-2.gguf");
    chat_specials *sp;
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    for (int f = 0; f < CHAT_FAMILY_COUNT; f++)
        check_same_as_library(tok, sp, (chat_family)f);
    size_t n_eot;
    int32_t *eot = tokenize_all(tok, "<|endoftext|>", true, &n_eot);
    assert_int_equal(n_eot, 1);
    chat_template t;
    chat_prompt p;
    assert_int_equal(chat_template_init(&t, CHAT_ZEPHYR, NULL, "", "<|endoftext|>"), VKI_OK);
    static const chat_msg m[] = {M(CHAT_USER, "a<|endoftext|>b")};
    assert_int_equal(chat_render(&t, m, 1, false, &p, NULL, 0), VKI_OK);
    int32_t *ids;
    size_t n, hits = 0;
    assert_int_equal(chat_tokenize(sp, tok, &p, false, &ids, &n), VKI_OK);
    for (size_t i = 0; i < n; i++)
        hits += ids[i] == eot[0];
    assert_int_equal(hits, 1); /* the template's, not the user's */
    free(ids);
    free(eot);
    chat_prompt_free(&p);
    chat_template_free(&t);
    chat_specials_free(sp);
    vki_tokenizer_free(tok);
}

/* A byte-level BPE vocabulary made like gpt-oss's o200k_harmony (pre-tokenizer gpt-4o): the 256
 * byte symbols of GPT-2's byte-to-unicode map (ids 0-255, no merges), then the control tokens
 * specials[0, n) (ids 256...); bos and eos ids among them; tmpl as its tokenizer.chat_template. */
#define MAX_SPECIAL 16
static void write_byte_vocab(const char *path, const char *tmpl, const char *const *specials, size_t n, uint32_t bos,
                             uint32_t eos)
{
    static char sym[256][4];
    gguf_str toks[256 + MAX_SPECIAL];
    int32_t type[256 + MAX_SPECIAL];
    unsigned extra = 0;
    assert_true(n <= MAX_SPECIAL);
    for (unsigned b = 0; b < 256; b++) { /* printable Latin-1 stands for itself, the rest for 256 + k */
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = self ? b : 256 + extra++, len = 1;
        sym[b][0] = (char)cp;
        if (cp >= 0x80) { /* two bytes of UTF-8: every code point here is below 0x800 */
            sym[b][0] = (char)(0xC0 | cp >> 6);
            sym[b][1] = (char)(0x80 | (cp & 0x3F));
            len = 2;
        }
        toks[b] = (gguf_str){sym[b], len};
        type[b] = 1; /* normal */
    }
    for (size_t i = 0; i < n; i++) {
        toks[256 + i] = (gguf_str){specials[i], strlen(specials[i])};
        type[256 + i] = 3; /* control */
    }
    gguf_writer *w;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "general.architecture", "gpt-oss"), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "tokenizer.ggml.model", "gpt2"), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "tokenizer.ggml.pre", "gpt-4o"), VKI_OK);
    assert_int_equal(gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", toks, 256 + n), VKI_OK);
    assert_int_equal(gguf_w_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, type, 256 + n), VKI_OK);
    assert_int_equal(gguf_w_set_arr_str(w, "tokenizer.ggml.merges", toks, 0), VKI_OK);
    assert_int_equal(gguf_w_set_u32(w, "tokenizer.ggml.bos_token_id", bos), VKI_OK);
    assert_int_equal(gguf_w_set_u32(w, "tokenizer.ggml.eos_token_id", eos), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "tokenizer.chat_template", tmpl), VKI_OK);
    assert_int_equal(gguf_w_open(w, path), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
}

static const char *const HARMONY_SPECIALS[] = {"<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                                               "<|channel|>",     "<|start|>",     "<|end|>",    "<|message|>",
                                               "<|call|>"};
#define N_HSPECIAL (sizeof HARMONY_SPECIALS / sizeof HARMONY_SPECIALS[0])
enum { H_BOS = 256, H_EOT, H_RETURN, H_CONSTRAIN, H_CHANNEL, H_START, H_END, H_MESSAGE, H_CALL };

/* gpt-oss's o200k_harmony: bos <|startoftext|>, eos <|return|>. */
static void write_harmony_vocab(const char *path, const char *tmpl)
{
    write_byte_vocab(path, tmpl, HARMONY_SPECIALS, N_HSPECIAL, H_BOS, H_RETURN);
}

/* A byte vocabulary with `specials` (write_byte_vocab), loaded; tmpl's family recognised from it. */
static vki_tokenizer *load_byte_vocab(const char *tmpl, const char *const *specials, size_t n, uint32_t bos,
                                      uint32_t eos, const char *family)
{
    char path[] = "/tmp/vki_test_chat_vocab_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_byte_vocab(path, tmpl, specials, n, bos, eos);
    vki_tokenizer *tok;
    if (vki_tokenizer_load(path, &tok, err, sizeof err) != VKI_OK)
        fail_msg("%s vocabulary: %s", family, err);
    unlink(path);
    vki_chat_template *own;
    assert_int_equal(vki_chat_template_create(tok, NULL, &own), VKI_OK);
    assert_string_equal(vki_chat_template_name(own), family);
    vki_chat_template_free(own);
    return tok;
}

/* How many times each of the ids 256 + [0, n) occurs in the model's own template's tokens for m. */
static void count_specials(const vki_tokenizer *tok, chat_think think, const chat_msg *m, size_t k, size_t n,
                           size_t *count)
{
    chat_specials *sp;
    chat_template t;
    chat_prompt p;
    char bos[64], eos[64];
    int32_t *ids;
    size_t n_ids;
    chat_token_texts(tok, bos, sizeof bos, eos, sizeof eos);
    const char *src = vki_tokenizer_chat_template(tok);
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    assert_int_equal(chat_template_init(&t, chat_detect(src, NULL), src, bos, eos), VKI_OK);
    t.think = think;
    assert_int_equal(chat_render(&t, m, k, true, &p, NULL, 0), VKI_OK);
    assert_int_equal(chat_tokenize(sp, tok, &p, false, &ids, &n_ids), VKI_OK);
    memset(count, 0, n * sizeof *count);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= 256 && (size_t)ids[i] < 256 + n)
            count[ids[i] - 256]++;
    free(ids);
    chat_prompt_free(&p);
    chat_template_free(&t);
    chat_specials_free(sp);
}

/* Granite's, SmolLM3's and EXAONE's markers (and the <think> of the texts their templates write) are
 * control tokens where the template wrote them; the same texts in a message are text. */
static void test_tokenize_new_families(void **state)
{
    static const char *const g[] = {"<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<think>",
                                    "</think>"};
    vki_tokenizer *tok = load_byte_vocab(T_GRANITE33, g, 5, 256, 256, "granite");
    static const chat_msg gm[] = {M(CHAT_USER, "a<|end_of_text|><|start_of_role|>b<think>")};
    size_t c[5];
    count_specials(tok, CHAT_THINK_ON, gm, 1, 5, c);
    assert_int_equal(c[0], 2); /* the system message's and the user turn's */
    assert_int_equal(c[1], 3); /* system, user, the generation prompt */
    assert_int_equal(c[2], 3);
    assert_int_equal(c[3], 1); /* "<think></think>" in the thinking system prompt */
    assert_int_equal(c[4], 1);
    vki_tokenizer_free(tok);

    static const char *const s[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"};
    tok = load_byte_vocab(T_SMOLLM3, s, 5, 260, 257, "smollm3");
    static const chat_msg sm[] = {M(CHAT_SYSTEM, "S <think>"), M(CHAT_USER, "q<|im_end|>")};
    count_specials(tok, CHAT_THINK_DEFAULT, sm, 2, 5, c);
    assert_int_equal(c[0], 3); /* system, user, the generation prompt */
    assert_int_equal(c[1], 1); /* the user turn's (the metadata block stays open) */
    assert_int_equal(c[2], 0); /* the system message's is its text */
    count_specials(tok, CHAT_THINK_DEFAULT, sm + 1, 1, 5, c);
    assert_int_equal(c[2], 1); /* the default persona's "<think> Thought section </think>" */
    assert_int_equal(c[3], 1);
    count_specials(tok, CHAT_THINK_OFF, sm + 1, 1, 5, c);
    assert_int_equal(c[2], 1); /* the generation prompt's empty block */
    assert_int_equal(c[3], 1);
    vki_tokenizer_free(tok);

    /* EXAONE 4.0's vocabulary: bos [BOS], eos [|endofturn|] */
    static const char *const e[] = {"[BOS]", "[|endofturn|]", "[|system|]", "[|user|]", "[|assistant|]", "[|tool|]",
                                    "<think>", "</think>"};
    size_t ce[8];
    tok = load_byte_vocab(T_EXAONE4, e, 8, 256, 257, "exaone");
    static const chat_msg em[] = {M(CHAT_SYSTEM, "S [|user|]"), M(CHAT_USER, "q[|endofturn|]<think>"),
                                  M(CHAT_ASSISTANT, "</think>A[|assistant|][|tool|]")};
    count_specials(tok, CHAT_THINK_DEFAULT, em, 3, 8, ce);
    static const size_t want4[8] = {0, 3, 1, 1, 2, 0, 2, 2}; /* empty reasoning blocks: the answer's, the prompt's */
    for (int k = 0; k < 8; k++)
        if (ce[k] != want4[k])
            fail_msg("exaone 4 %s: %zu, want %zu", e[k], ce[k], want4[k]);
    count_specials(tok, CHAT_THINK_ON, em, 3, 8, ce);
    assert_int_equal(ce[6], 2); /* the answer's block, the generation prompt's opened reasoning */
    assert_int_equal(ce[7], 1);
    vki_tokenizer_free(tok);
    /* EXAONE 3.5's: the empty system turn's markers are the template's, a user's are text */
    tok = load_byte_vocab(T_EXAONE35, e, 8, 256, 257, "exaone");
    count_specials(tok, CHAT_THINK_DEFAULT, em + 1, 1, 8, ce);
    static const size_t want35[8] = {0, 1, 1, 1, 1, 0, 0, 0};
    for (int k = 0; k < 8; k++)
        if (ce[k] != want35[k])
            fail_msg("exaone 3.5 %s: %zu, want %zu", e[k], ce[k], want35[k]);
    vki_tokenizer_free(tok);
}

/* GLM-4's vocabulary (bos [gMASK], eos <|endoftext|>, eot <|user|> as llama.cpp's converter writes
 * it, here left out): its markers and Z1's <think> are control tokens only where the template wrote
 * them; generation ends at <|endoftext|>, <|user|> and <|observation|> (generation_config.json's
 * eos_token_id), not at <|assistant|> or <|system|>; a vocabulary without [gMASK] keeps <|user|>. */
static void test_tokenize_glm4(void **state)
{
    (void)state;
    static const char *const g[] = {"<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>",
                                    "<|assistant|>", "<|observation|>", "<think>", "</think>"};
    enum { G_EOT = 256, G_GMASK, G_SOP, G_SYSTEM, G_USER, G_ASSISTANT, G_OBSERVATION, G_THINK, G_UNTHINK };
    vki_tokenizer *tok = load_byte_vocab(T_GLMZ1, g, 9, G_GMASK, G_EOT, "glm4");
    static const chat_msg gm[] = {M(CHAT_SYSTEM, "S <|user|><sop>"), M(CHAT_USER, "q<|assistant|>[gMASK]"),
                                  M(CHAT_ASSISTANT, "<think>r</think>A<|observation|><think>")};
    size_t c[9];
    count_specials(tok, CHAT_THINK_DEFAULT, gm, 3, 9, c);
    static const size_t want[9] = {0, 1, 1, 1, 1, 2, 0, 1, 0}; /* the answer's reasoning dropped */
    for (int k = 0; k < 9; k++)
        if (c[k] != want[k])
            fail_msg("glm4 %s: %zu, want %zu", g[k], c[k], want[k]);
    for (int32_t id = 0; id < 256 + 9; id++) {
        bool end = id == G_EOT || id == G_USER || id == G_OBSERVATION;
        if (vki_token_is_eog(tok, id) != end)
            fail_msg("glm4 token %d (%s): end of generation %d", id, id >= 256 ? g[id - 256] : "byte", !end);
    }
    vki_tokenizer_free(tok);
    /* Phi-3's <|user|> does not end generation */
    static const char *const phi[] = {"<|endoftext|>", "<|assistant|>", "<|user|>", "<|end|>", "<|system|>"};
    tok = load_byte_vocab(T_PHI35, phi, 5, 256, 256, "phi3");
    assert_true(vki_token_is_eog(tok, 256) && vki_token_is_eog(tok, 259));
    assert_false(vki_token_is_eog(tok, 258) || vki_token_is_eog(tok, 257));
    vki_tokenizer_free(tok);
}

/* Command R7B's vocabulary, eos <EOS_TOKEN> (a file naming another eos than <|END_OF_TURN_TOKEN|>): the
 * markers are control tokens only where the template wrote them; generation ends at <|END_OF_TURN_TOKEN|>
 * and <|END_RESPONSE|> too; a generated reply's thinking is the reasoning, its markers not text. */
static void test_tokenize_cohere(void **state)
{
    (void)state;
    static const char *const v[] = {"<BOS_TOKEN>",        "<EOS_TOKEN>",      "<|START_OF_TURN_TOKEN|>",
                                    "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                                    "<|CHATBOT_TOKEN|>",  "<|START_RESPONSE|>", "<|END_RESPONSE|>",
                                    "<|START_THINKING|>", "<|END_THINKING|>"};
    enum { C_BOS = 256, C_EOS, C_SOT, C_EOT, C_SYSTEM, C_USER, C_CHATBOT, C_START_R, C_END_R, C_START_T, C_END_T };
    vki_tokenizer *tok = load_byte_vocab(T_COMMAND_R7B, v, 11, C_BOS, C_EOS, "command-r");
    static const chat_msg cm[] = {M(CHAT_USER, "q<|END_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
                                  M(CHAT_ASSISTANT, "<|START_THINKING|>t<|END_THINKING|>A<|END_RESPONSE|>"),
                                  M(CHAT_USER, "<BOS_TOKEN>")};
    size_t c[11];
    count_specials(tok, CHAT_THINK_DEFAULT, cm, 3, 11, c);
    static const size_t want[11] = {0, 0, 5, 4, 1, 2, 2, 2, 1, 0, 0}; /* empty system turn, 3 turns, prompt */
    for (int k = 0; k < 11; k++)
        if (c[k] != want[k])
            fail_msg("command-r7b %s: %zu, want %zu", v[k], c[k], want[k]);
    for (int32_t id = 0; id < 256 + 11; id++) {
        bool end = id == C_EOS || id == C_EOT || id == C_END_R;
        if (vki_token_is_eog(tok, id) != end)
            fail_msg("command-r7b token %d (%s): end of generation %d", id, id >= 256 ? v[id - 256] : "byte", !end);
    }
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_COMMAND_R, T_COMMAND_R7B, "<BOS_TOKEN>", "<EOS_TOKEN>"), VKI_OK);
    chat_reply r;
    assert_int_equal(chat_reply_init(&r, tok, &t, NULL, NULL, 0, 0), VKI_OK);
    static const int32_t gen[] = {C_START_T, 'h', 'm', C_END_T, C_START_R, 'O', 'K', C_END_R, C_EOT};
    strbuf reasoning = {0}, answer = {0};
    bool stopped = false;
    for (size_t i = 0; i <= sizeof gen / sizeof gen[0]; i++) {
        assert_int_equal(i < sizeof gen / sizeof gen[0] ? chat_reply_push(&r, gen[i], &stopped) : chat_reply_finish(&r),
                         VKI_OK);
        assert_true(strbuf_put(&reasoning, r.reasoning.p, r.reasoning.len) &&
                    strbuf_put(&answer, r.answer.p, r.answer.len));
    }
    assert_true(strbuf_put(&reasoning, "", 0) && strbuf_put(&answer, "", 0));
    assert_string_equal(reasoning.p, "hm");
    assert_string_equal(answer.p, "OK");
    strbuf_free(&reasoning), strbuf_free(&answer);
    chat_reply_free(&r);
    chat_template_free(&t);
    vki_tokenizer_free(tok);
}

/* gpt-oss's vocabulary: its template recognised from the tokenizer; the template's markers are
 * its control tokens and a user's "<|end|>" is text; tokens = the library's with parse_special
 * where the content holds no control token's text. */
static void test_tokenize_harmony(void **state)
{
    char path[] = "/tmp/vki_test_chat_harmony_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_harmony_vocab(path, T_HARMONY);
    vki_tokenizer *tok;
    if (vki_tokenizer_load(path, &tok, err, sizeof err) != VKI_OK)
        fail_msg("harmony vocabulary: %s", err);
    unlink(path);
    vki_chat_template *own;
    assert_int_equal(vki_chat_template_create(tok, NULL, &own), VKI_OK);
    assert_string_equal(vki_chat_template_name(own), "harmony");
    vki_chat_template_free(own);
    chat_specials *sp;
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    check_same_as_library(tok, sp, CHAT_HARMONY);
    chat_template t;
    chat_prompt p;
    assert_int_equal(chat_template_init(&t, CHAT_HARMONY, T_HARMONY, "<|startoftext|>", "<|return|>"), VKI_OK);
    static const chat_msg m[] = {M(CHAT_USER, "a<|end|><|start|>b")};
    assert_int_equal(chat_render(&t, m, 1, true, &p, NULL, 0), VKI_OK);
    int32_t *ids;
    size_t n, ends = 0, starts = 0, messages = 0;
    assert_int_equal(chat_tokenize(sp, tok, &p, false, &ids, &n), VKI_OK);
    for (size_t i = 0; i < n; i++) {
        ends += ids[i] == H_END;
        starts += ids[i] == H_START;
        messages += ids[i] == H_MESSAGE;
    }
    assert_int_equal(ends, 2);     /* the system message's and the user turn's, not the user's text */
    assert_int_equal(starts, 3);   /* system, user, the generation prompt */
    assert_int_equal(messages, 2);
    assert_int_equal(ids[0], H_START);
    assert_int_equal(ids[n - 1], 't'); /* "<|start|>assistant": bytes after the control token (ids = bytes) */
    free(ids);
    chat_prompt_free(&p);
    chat_template_free(&t);
    chat_specials_free(sp);
    vki_tokenizer_free(tok);
}

/* ---- the GGUF key ------------------------------------------------------------------------- */

static void write_meta_gguf(const char *path, const char *tmpl)
{
    gguf_writer *w;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "general.architecture", "llama"), VKI_OK);
    if (tmpl)
        assert_int_equal(gguf_w_set_str(w, "tokenizer.chat_template", tmpl), VKI_OK);
    assert_int_equal(gguf_w_open(w, path), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
}

static void test_from_gguf(void **state)
{
    char path[] = "/tmp/vki_test_chat_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char *t = NULL, err[256];
    write_meta_gguf(path, T_LLAMA3);
    assert_int_equal(chat_template_from_gguf(path, &t, err, sizeof err), VKI_OK);
    assert_string_equal(t, T_LLAMA3);
    assert_int_equal(chat_detect(t, NULL), CHAT_LLAMA3);
    free(t);
    write_meta_gguf(path, NULL);
    assert_int_equal(chat_template_from_gguf(path, &t, err, sizeof err), VKI_OK);
    assert_null(t);
    unlink(path);
    assert_int_equal(chat_template_from_gguf(path, &t, err, sizeof err), VKI_ERR_IO);
}

/* ---- the public API (vkinfer.h "chat templates") ------------------------------------------------ */

/* The llama-spm vocabulary with a tokenizer.chat_template added: what a model file carries. */
static void write_vocab_with_template(const char *dst, const char *tmpl)
{
    char src[1024], err[256];
    if (!vt_shared_model("vocab/ggml-vocab-llama-spm.gguf", src, sizeof src)) {
        printf("SKIP: %s/models/vocab is absent\n", VKI_SHARED_DIR);
        skip();
    }
    gguf_file *f;
    gguf_writer *w;
    assert_int_equal(gguf_open(src, &f, err, sizeof err), VKI_OK);
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    for (uint64_t i = 0; i < gguf_n_kv(f); i++)
        assert_int_equal(gguf_w_copy_kv(w, gguf_kv_at(f, i)), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "tokenizer.chat_template", tmpl), VKI_OK);
    assert_int_equal(gguf_w_open(w, dst), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
    gguf_close(f);
}

/* The model's own template found from its tokenizer; families by name; the contracts of a small
 * buffer (the size needed, call again) and of a bad message (named); tokens = chat_tokenize's. */
static void test_public_api(void **state)
{
    char path[] = "/tmp/vki_test_chat_vocab_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_vocab_with_template(path, T_LLAMA2);
    vki_tokenizer *tok;
    assert_int_equal(vki_tokenizer_load(path, &tok, err, sizeof err), VKI_OK);
    unlink(path);
    assert_string_equal(vki_tokenizer_chat_template(tok), T_LLAMA2);
    vki_chat_template *own, *named, *source, *unknown;
    assert_int_equal(vki_chat_template_create(tok, NULL, &own), VKI_OK);
    assert_int_equal(vki_chat_template_create(tok, "chatml", &named), VKI_OK);
    assert_int_equal(vki_chat_template_create(tok, T_LLAMA3, &source), VKI_OK);
    assert_int_equal(vki_chat_template_create(tok, "{{ messages }}", &unknown), VKI_OK);
    assert_string_equal(vki_chat_template_name(own), "llama2");
    assert_string_equal(vki_chat_template_name(named), "chatml");
    assert_string_equal(vki_chat_template_name(source), "llama3");
    assert_string_equal(vki_chat_template_name(unknown), "plain");

    static const vki_chat_message m[] = {{VKI_CHAT_USER, "hi"}, {VKI_CHAT_ASSISTANT, "ok"}, {VKI_CHAT_USER, "more"}};
    static const char want[] = "<s>[INST] hi [/INST] ok </s><s>[INST] more [/INST]";
    char buf[128];
    size_t n = 0;
    assert_int_equal(vki_chat_apply(own, m, 3, true, buf, 8, &n, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_int_equal(n, strlen(want)); /* the length needed */
    assert_int_equal(vki_chat_apply(own, m, 3, true, buf, n + 1, &n, err, sizeof err), VKI_OK);
    assert_string_equal(buf, want);
    assert_int_equal(vki_chat_apply(named, m, 1, true, buf, sizeof buf, &n, NULL, 0), VKI_OK);
    assert_string_equal(buf, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

    /* roles that do not alternate: Llama 2 raises, naming the message; an unknown role too */
    static const vki_chat_message two_users[] = {{VKI_CHAT_USER, "a"}, {VKI_CHAT_USER, "b"}};
    assert_int_equal(vki_chat_apply(own, two_users, 2, true, buf, sizeof buf, &n, err, sizeof err),
                     VKI_ERR_INVALID_ARG);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "messages[1]"));
    static const vki_chat_message bad_role[] = {{(vki_chat_role)9, "a"}};
    assert_int_equal(vki_chat_tokenize(own, bad_role, 1, true, NULL, 0, &n, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[0]"));

    /* tokens: BOS and EOS of the template's text are ids 1 and 2; the same as chat_tokenize */
    int32_t ids[64];
    assert_int_equal(vki_chat_tokenize(own, m, 3, true, ids, 2, &n, NULL, 0), VKI_ERR_INVALID_ARG);
    size_t need = n;
    assert_int_equal(vki_chat_tokenize(own, m, 3, true, ids, need, &n, NULL, 0), VKI_OK);
    assert_int_equal(n, need);
    chat_template t;
    chat_specials *sp;
    chat_prompt p;
    int32_t *ref;
    size_t n_ref;
    assert_int_equal(chat_template_init(&t, CHAT_LLAMA2, T_LLAMA2, "<s>", "</s>"), VKI_OK);
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    static const chat_msg cm[] = {M(CHAT_USER, "hi"), M(CHAT_ASSISTANT, "ok"), M(CHAT_USER, "more")};
    assert_int_equal(chat_render(&t, cm, 3, true, &p, NULL, 0), VKI_OK);
    assert_int_equal(chat_tokenize(sp, tok, &p, false, &ref, &n_ref), VKI_OK);
    assert_int_equal(n, n_ref);
    assert_memory_equal(ids, ref, n * sizeof *ids);
    assert_int_equal(ids[0], 1);
    free(ref);
    chat_prompt_free(&p);
    chat_specials_free(sp);
    chat_template_free(&t);
    vki_chat_template_free(own);
    vki_chat_template_free(named);
    vki_chat_template_free(source);
    vki_chat_template_free(unknown);
    vki_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),       cmocka_unit_test(test_qwen3),        cmocka_unit_test(test_llama3),       cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral),      cmocka_unit_test(test_zephyr),       cmocka_unit_test(test_gemma),
        cmocka_unit_test(test_phi3),         cmocka_unit_test(test_deepseek),     cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_tulu),         cmocka_unit_test(test_granite),      cmocka_unit_test(test_smollm3),
        cmocka_unit_test(test_exaone),       cmocka_unit_test(test_glm4),         cmocka_unit_test(test_command_r),
        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_open_end),
        cmocka_unit_test(test_tokenize_spm), cmocka_unit_test(test_tokenize_bpe),
        cmocka_unit_test(test_tokenize_harmony), cmocka_unit_test(test_tokenize_new_families),
        cmocka_unit_test(test_tokenize_glm4), cmocka_unit_test(test_tokenize_cohere),
        cmocka_unit_test(test_from_gguf),
        cmocka_unit_test(test_public_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
