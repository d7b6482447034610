// End-to-end: `vkinfer serve` over stories260K (with an API key), driven by the official openai npm
// client: completions and chat (streamed and not), n choices, stop strings, logprobs, embeddings
// (the client asks for base64 and decodes it), vLLM-style extra fields, unknown fields, errors;
// structured output (response_format json_object / json_schema, grammar) and tool calls, whose
// outputs are validated against their schemas with ajv (the model writes gibberish: the
// constraint is what makes them valid), streamed tool calls reassembled by the client's stream().
// The Responses API through the client's responses.create (output_text, usage, status) and its
// responses.stream() helper (which checks the events' order and indices while it accumulates),
// a function tool forced, its call's arguments validated against the tool's schema.
// Then the official ollama npm client against the same server's Ollama API (/api/...): generate
// raw and through the template, streamed and not, chat, embeddings, list / show / ps / version,
// structured output (format: a JSON schema, validated with ajv) and its error on an option vkinfer
// does not have.
// usage: node e2e.mjs VKINFER_BINARY MODEL.gguf
// Exit 0 = pass, 1 = fail, 77 = skipped (the model is absent; ctest SKIP_RETURN_CODE).
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import Ajv from 'ajv';

const [vkinfer, model] = process.argv.slice(2);
if (!vkinfer || !model) {
  console.error('usage: node e2e.mjs VKINFER_BINARY MODEL.gguf');
  process.exit(2);
}
if (!existsSync(model)) {
  console.log(`SKIP: ${model} not found (the model fixtures live in ../shared/models)`);
  process.exit(77);
}

// Greedy, BOS + "Once upon a time", 48 tokens (../shared/models/README.md).
const KNOWN = ', there was a little girl named Lily. She loved to play outside in the park. One day, she saw ' +
  'a big, red ball. She wanted to play with it,';

const KEY = 'sk-e2e-test';

function startServer() {
  const args = ['serve', '-m', model, '--port', '0', '--no-progress', '--api-key', KEY, '-a', 'stories-alias'];
  const child = spawn(vkinfer, args, { stdio: ['ignore', 'inherit', 'pipe'] });
  return new Promise((resolve, reject) => {
    let log = '';
    const timer = setTimeout(() => reject(new Error(`vkinfer serve did not start:\n${log}`)), 120000);
    child.stderr.on('data', (d) => {
      log += d;
      const m = /listening on http:\/\/([^\s]+):(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[2]) });
      }
    });
    child.on('exit', (code) => reject(new Error(`vkinfer serve exited (${code}):\n${log}`)));
  });
}

async function collect(stream, pick) {
  let text = '', usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += pick(c) ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, usage, finish, chunks };
}

async function run(client) {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  assert.deepEqual(ids, ['stories-alias']); // -a, llama-server's --alias
  const info = await client.models.retrieve('stories-alias');
  assert.ok(info.max_model_len > 0 && info.meta.n_ctx === info.max_model_len);

  // completions, not streamed: the known greedy answer
  const c = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0,
  });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices[0].text, KNOWN);
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.equal(c.usage.prompt_tokens, 5);
  assert.equal(c.usage.completion_tokens, 48);
  assert.equal(c.usage.total_tokens, 53);
  assert.equal(typeof c.usage.prompt_tokens_details.cached_tokens, 'number');

  // completions, streamed, with usage
  const s = await collect(await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }), (ch) => ch.text);
  assert.equal(s.text, KNOWN);
  assert.equal(s.finish, 'length');
  assert.equal(s.usage.completion_tokens, 48);

  // a stop string that spans tokens
  const st = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0, stop: ['little girl named'],
  });
  assert.equal(st.choices[0].text, ', there was a ');
  assert.equal(st.choices[0].finish_reason, 'stop');

  // chat, not streamed and streamed: the same answer
  const messages = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me about a cat.' },
  ];
  const chat = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.ok(chat.choices[0].message.content.length > 0);
  assert.ok(chat.usage.prompt_tokens > 10);
  const cs = await collect(await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }), (ch) => ch.delta?.content);
  assert.equal(cs.text, chat.choices[0].message.content);
  assert.equal(cs.finish, chat.choices[0].finish_reason);
  assert.equal(cs.usage.completion_tokens, chat.usage.completion_tokens);

  // chat logprobs
  const lp = await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens);
  assert.equal(lp.choices[0].logprobs.content[0].top_logprobs.length, 2);

  // n choices, each its own seed stream; echo; vLLM-style extra fields; unknown fields accepted
  const n3 = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8, temperature: 1, seed: 7, n: 3, ignore_eos: true,
  });
  assert.deepEqual(n3.choices.map((ch) => ch.index), [0, 1, 2]);
  assert.equal(n3.usage.completion_tokens, 24);
  assert.equal(n3.usage.prompt_tokens, 5);
  const echo = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0, echo: true,
  });
  assert.equal(echo.choices[0].text, 'Once upon a time' + KNOWN);
  const extra = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, return_token_ids: true,
    min_tokens: 2, repetition_penalty: 1.0, cache_prompt: true, skip_special_tokens: true, some_new_field: 1,
  });
  assert.equal(extra.choices[0].token_ids.length, 8);
  assert.equal(extra.choices[0].prompt_token_ids.length, 5);
  const stopId = extra.choices[0].token_ids[2];
  const stopped = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stop_token_ids: [stopId],
  });
  assert.ok(stopped.usage.completion_tokens <= 3);

  // embeddings: the client asks for base64 and decodes it into floats
  const emb = await client.embeddings.create({ model: 'stories260K', input: ['Once upon a time', 'A dog'] });
  assert.equal(emb.data.length, 2);
  const v = emb.data[0].embedding;
  assert.ok(Array.isArray(v) && v.length === info.meta.n_embd);
  assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5);
  const embF = await client.embeddings.create({ model: 'stories260K', input: 'Once upon a time', encoding_format: 'float' });
  assert.deepEqual(embF.data[0].embedding.map((x) => Math.fround(x)), v.map((x) => Math.fround(x)));

  // errors arrive as the client's typed errors
  await assert.rejects(
    client.completions.create({ model: 'stories260K', prompt: 'x', temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  await assert.rejects(
    client.chat.completions.create({ model: 'stories260K', messages, n: 17 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  await assert.rejects(
    client.chat.completions.create({
      model: 'stories260K', messages,
      response_format: {
        type: 'json_schema', json_schema: { name: 'n', schema: { type: 'number', minimum: 3, exclusiveMaximum: 3 } },
      },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format' && /no number lies/.test(e.message));
  await assert.rejects(
    client.completions.create({ model: 'stories260K', prompt: 'x', grammar: 'root ::= valu' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'grammar' && /line 1, column 10/.test(e.message));
  const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
}

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, exclusiveMaximum: 130 },
    score: { type: 'number', minimum: -0.5, exclusiveMaximum: 1 },
    pets: { type: 'array', items: { enum: ['cat', 'dog'] }, maxItems: 2 },
    code: { type: 'string', pattern: '^[A-Z]{2}-\\d{2,3}(?:/[a-z]+)?$' },
  },
  required: ['name', 'age', 'score', 'pets', 'code'],
  additionalProperties: false,
};
const TIME = { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false };
const TOOLS = [
  { type: 'function', function: { name: 'time', description: 'The time in a zone', parameters: TIME } },
];

function valid(schema, text, what) {
  const ajv = new Ajv({ strict: true });
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new Error(`${what}: not JSON: ${text}`);
  }
  assert.ok(ajv.validate(schema, value), `${what}: ${text}: ${ajv.errorsText()}`);
  return value;
}

async function structured(client) {
  // max_tokens: each bounded grammar's worst case (see test_server_struct.c), so outputs complete;
  // any JSON object is unbounded, so json_object is asked greedily
  const messages = [{ role: 'user', content: 'Tell me about a cat.' }];
  const rf = { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } };
  const js = await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 560, seed: 1, response_format: rf,
  });
  valid(PERSON, js.choices[0].message.content, 'json_schema');
  assert.equal(js.choices[0].finish_reason, 'stop');
  const jss = await collect(await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 560, seed: 2, response_format: rf, stream: true,
  }), (ch) => ch.delta?.content);
  valid(PERSON, jss.text, 'json_schema, streamed');
  const jo = await collect(await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 80, temperature: 0, stream: true,
    response_format: { type: 'json_object' },
  }), (ch) => ch.text);
  valid({ type: 'object' }, jo.text, 'json_object, streamed');
  const g = await client.completions.create({
    model: 'stories260K', prompt: 'Once', max_tokens: 8, grammar: 'root ::= "yes" | "no"',
  });
  assert.ok(['yes', 'no'].includes(g.choices[0].text));

  // tools: a forced call (not streamed), a named call streamed and reassembled by the client,
  // a tool result turn
  const req = await client.chat.completions.create({
    model: 'stories260K', messages, max_tokens: 200, seed: 4, tools: TOOLS, tool_choice: 'required',
    parallel_tool_calls: false,
  });
  const call = req.choices[0].message.tool_calls[0];
  assert.equal(req.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'time');
  valid(TIME, call.function.arguments, 'tool_choice required');
  const st = client.chat.completions.stream({
    model: 'stories260K', messages, max_tokens: 200, seed: 5, tools: TOOLS,
    tool_choice: { type: 'function', function: { name: 'time' } }, parallel_tool_calls: false,
  });
  const fin = await st.finalChatCompletion();
  const sc = fin.choices[0].message.tool_calls;
  assert.equal(sc.length, 1);
  assert.match(sc[0].id, /^call_[A-Za-z0-9]{24}$/);
  valid(TIME, sc[0].function.arguments, 'named tool, streamed');
  assert.equal(fin.choices[0].finish_reason, 'tool_calls');
  const turn = await client.chat.completions.create({
    model: 'stories260K', max_tokens: 4, tools: TOOLS,
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '12:00' }],
  });
  assert.ok(turn.usage.prompt_tokens > req.usage.prompt_tokens);
}

async function responses(client) {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about a cat.' }];
  const ref = await client.chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0 });
  const want = ref.choices[0].message.content;
  const r = await client.responses.create({
    model: 'stories260K', instructions: 'Be brief.', input: 'Tell me about a cat.', max_output_tokens: 24, temperature: 0,
  });
  assert.equal(r.object, 'response');
  assert.equal(r.output_text, want); // the SDK's own join of the output_text parts
  assert.equal(r.status, ref.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  assert.equal(r.usage.input_tokens, ref.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, ref.usage.completion_tokens);
  let deltas = '';
  const stream = client.responses.stream({
    model: 'stories260K', instructions: 'Be brief.', max_output_tokens: 24, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me about a cat.' }] }],
  });
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const fin = await stream.finalResponse();
  assert.equal(deltas, want);
  assert.equal(fin.output_text, want);
  const t = await client.responses.create({
    model: 'stories260K', input: 'What time is it?', max_output_tokens: 200, temperature: 0, tool_choice: 'required',
    tools: [{ type: 'function', name: 'get_time', parameters: TIME, strict: true }],
  });
  const call = t.output.find((o) => o.type === 'function_call');
  assert.ok(call && call.name === 'get_time' && call.call_id, 'a function_call item');
  valid(TIME, call.arguments, 'responses function_call arguments');
  await assert.rejects(client.responses.create({ model: 'stories260K', input: 'x', previous_response_id: 'resp_1' }),
    (err) => err.status === 400 && /previous_response_id/.test(err.message), 'stored state is refused');
}

async function ollamaApi(port) {
  const ol = new Ollama({ host: `http://127.0.0.1:${port}`, headers: { Authorization: `Bearer ${KEY}` } });
  const greedy = { temperature: 0, num_predict: 48, repeat_penalty: 1 };
  const g = await ol.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true, options: greedy });
  assert.equal(g.response, KNOWN);
  assert.equal(g.done, true);
  assert.equal(g.done_reason, 'length');
  assert.equal(g.eval_count, 48);
  let text = '', parts = 0, last = null;
  for await (const part of await ol.generate({
    model: 'stories260K', prompt: 'Once upon a time', raw: true, options: greedy, stream: true,
  })) {
    text += part.response;
    parts++;
    last = part;
  }
  assert.equal(text, KNOWN);
  assert.ok(parts > 2 && last.done && last.eval_count === 48, 'a streamed generate ends with its totals');
  const messages = [{ role: 'user', content: 'Once upon a time' }];
  const ref = await (new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0 }))
    .chat.completions.create({ model: 'stories260K', messages, max_tokens: 24, temperature: 0, repetition_penalty: 1 });
  const c = await ol.chat({ model: 'stories260K', messages, options: { temperature: 0, num_predict: 24, repeat_penalty: 1 } });
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.message.content, ref.choices[0].message.content);
  text = '';
  for await (const part of await ol.chat({
    model: 'stories260K', messages, stream: true, options: { temperature: 0, num_predict: 24, repeat_penalty: 1 },
  })) text += part.message.content;
  assert.equal(text, ref.choices[0].message.content);
  const f = await ol.chat({
    model: 'stories260K', messages: [{ role: 'user', content: 'Tell me about a cat.' }], format: PERSON,
    options: { num_predict: 560, seed: 1 },
  });
  valid(PERSON, f.message.content, 'ollama format (schema)');
  const e = await ol.embed({ model: 'stories260K', input: ['Once upon a time', 'a cat'] });
  assert.equal(e.embeddings.length, 2);
  assert.ok(e.embeddings[0].length > 0 && e.embeddings[0].every((v) => typeof v === 'number'));
  const list = await ol.list();
  assert.ok(list.models.length === 1 && list.models[0].details.format === 'gguf', 'ollama list');
  const show = await ol.show({ model: list.models[0].name });
  assert.equal(show.details.family, 'llama');
  const ps = await ol.ps();
  assert.ok(ps.models[0].size_vram > 0, 'ollama ps');
  assert.ok(typeof (await ol.version()).version === 'string');
  await assert.rejects(ol.generate({ model: 'stories260K', prompt: 'x', options: { mirostat: 2 } }),
    (err) => err.status_code === 400 && /mirostat/.test(err.error), 'mirostat is refused with a 400 naming it');
}

const { child, port } = await startServer();
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0 });
let failed = null;
try {
  await run(client);
  await structured(client);
  await responses(client);
  await ollamaApi(port);
} catch (e) {
  failed = e;
}
const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
child.kill('SIGTERM');
const code = await exited;
if (failed) {
  console.error(failed);
  process.exit(1);
}
assert.equal(code, 0, 'vkinfer serve exits 0 after SIGTERM');
const version = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url))).version;
const olv = JSON.parse(readFileSync(new URL('./node_modules/ollama/package.json', import.meta.url))).version;
console.log(`openai ${version} and ollama ${olv} (npm) against vkinfer serve: all checks passed`);
