// End-to-end: `vkinfer serve` over stories260K (with an API key), driven by the official openai npm
// client: completions and chat (streamed and not), n choices, stop strings, logprobs, embeddings
// (the client asks for base64 and decodes it), vLLM-style extra fields, unknown fields, errors.
// usage: node e2e.mjs VKINFER_BINARY MODEL.gguf
// Exit 0 = pass, 1 = fail, 77 = skipped (the model is absent; ctest SKIP_RETURN_CODE).
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

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
  const child = spawn(vkinfer, ['serve', '-m', model, '--port', '0', '--no-progress', '--api-key', KEY],
                      { stdio: ['ignore', 'inherit', 'pipe'] });
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
  assert.deepEqual(ids, ['stories260K']);
  const info = await client.models.retrieve('stories260K');
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
    client.chat.completions.create({ model: 'stories260K', messages, response_format: { type: 'json_object' } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format');
  const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
}

const { child, port } = await startServer();
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0 });
let failed = null;
try {
  await run(client);
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
console.log(`openai ${version} (npm) against vkinfer serve: all checks passed`);
