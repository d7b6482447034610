// End-to-end: `vkinfer serve` over stories260K, driven by the official openai npm client.
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

function startServer() {
  const child = spawn(vkinfer, ['serve', '-m', model, '--port', '0', '--no-progress'],
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

  // completions, not streamed: the known greedy answer
  const c = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 48, temperature: 0,
  });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices[0].text, KNOWN);
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.deepEqual(c.usage, { prompt_tokens: 5, completion_tokens: 48, total_tokens: 53 });

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

  // errors arrive as the client's typed errors
  await assert.rejects(
    client.completions.create({ model: 'stories260K', prompt: 'x', temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  await assert.rejects(
    client.chat.completions.create({ model: 'stories260K', messages, n: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
}

const { child, port } = await startServer();
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
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
