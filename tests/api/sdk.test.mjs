// Drives a running `sluice serve` on the scripted fixture model with the official SDKs. The model's replies
// are fixed (see tools/make_scripted_model.py), so the assertions check content, not only shapes.
// usage: node sdk.test.mjs BASE_URL
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';

const base = process.argv[2];
const TEXT = 'Sunny skies over Paris.';
const THINK = 'The user wants the weather.';
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
const ollama = new Ollama({ host: base });
const oaTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const anTools = [{ name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

let passed = 0, failed = 0;
async function test(name, fn) {
  try { await fn(); passed++; console.log(`ok - ${name}`); }
  catch (e) { failed++; console.log(`FAIL - ${name}: ${e.stack || e}`); }
}

await test('openai chat', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.content, TEXT);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.completion_tokens, 4);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

await test('openai chat stream with usage', async () => {
  const s = await openai.chat.completions.create({ model: 'm', messages: ask, stream: true,
    stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    assert.equal(c.object, 'chat.completion.chunk');
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    text += c.choices[0].delta.content ?? '';
    finish = c.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, TEXT);
  assert.equal(finish, 'stop');
  assert.ok(chunks >= 6, `only ${chunks} chunks: the reply was not streamed token by token`);
  assert.equal(usage.completion_tokens, 4);
  assert.equal(usage.total_tokens, usage.prompt_tokens + 4);
});

await test('openai n choices, whole and streamed (the SDK joins the chunks by index)', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask, n: 2 });
  assert.deepEqual(r.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
    [[0, TEXT, 'stop'], [1, TEXT, 'stop']]);
  assert.equal(r.usage.completion_tokens, 8);
  const s = openai.beta.chat.completions.stream({ model: 'm', messages: ask, n: 2, tools: oaTools,
    stream_options: { include_usage: true } });
  const f = await s.finalChatCompletion();
  assert.deepEqual(f.choices.map((c) => [c.index, c.finish_reason, c.message.tool_calls[0].function.name]),
    [[0, 'tool_calls', 'get_weather'], [1, 'tool_calls', 'get_weather']]);
  assert.notEqual(f.choices[0].message.tool_calls[0].id, f.choices[1].message.tool_calls[0].id);
  assert.deepEqual(JSON.parse(f.choices[1].message.tool_calls[0].function.arguments), { city: 'Paris' });
});

await test('openai tool call', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask, tools: oaTools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, null);
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris' });
  assert.ok(m.tool_calls[0].id.length > 0);
});

await test('openai tool call stream, then the tool result turn reuses the cached prefix', async () => {
  const s = await openai.chat.completions.create({ model: 'm', messages: ask, tools: oaTools, stream: true });
  const calls = [];
  let finish = null;
  for await (const c of s) {
    const ch = c.choices[0];
    if (!ch) continue;
    finish = ch.finish_reason ?? finish;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { id: '', name: '', args: '' };
      if (d.id) calls[d.index].id = d.id;
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].args += d.function.arguments;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].args), { city: 'Paris' });
  const r = await openai.chat.completions.create({ model: 'm', tools: oaTools, messages: [...ask,
    { role: 'assistant', content: null, tool_calls: [{ id: calls[0].id, type: 'function',
      function: { name: calls[0].name, arguments: calls[0].args } }] },
    { role: 'tool', tool_call_id: calls[0].id, content: '{"sky": "clear"}' }] });
  assert.equal(r.choices[0].message.content, TEXT);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const cached = r.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 100 && cached < r.usage.prompt_tokens, `cached_tokens ${cached} of ${r.usage.prompt_tokens}`);
});

await test('openai reasoning_content', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask,
    chat_template_kwargs: { enable_thinking: true } });
  assert.equal(r.choices[0].message.reasoning_content, THINK);
  assert.equal(r.choices[0].message.content, TEXT);
  const s = await openai.chat.completions.create({ model: 'm', messages: ask, stream: true,
    chat_template_kwargs: { enable_thinking: true } });
  let reasoning = '', text = '';
  for await (const c of s) {
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    text += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, THINK);
  assert.equal(text, TEXT);
});

await test('openai max_tokens, stop and seed', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask, max_tokens: 2 });
  assert.equal(r.choices[0].message.content, 'Sunny skies');
  assert.equal(r.choices[0].finish_reason, 'length');
  const s = await openai.chat.completions.create({ model: 'm', messages: ask, stop: [' over'], seed: 3,
    temperature: 0.7, top_p: 0.9, presence_penalty: 0.1, frequency_penalty: 0.1, max_completion_tokens: 20 });
  assert.equal(s.choices[0].message.content, 'Sunny skies');
  assert.equal(s.choices[0].finish_reason, 'stop');
});

await test('openai completions', async () => {
  const r = await openai.completions.create({ model: 'm', prompt: 'Tell me the weather' });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, TEXT);
  const s = await openai.completions.create({ model: 'm', prompt: 'Tell me', stream: true, max_tokens: 3 });
  let text = '', finish = null;
  for await (const c of s) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
  assert.equal(text, 'Sunny skies over');
  assert.equal(finish, 'length');
});

await test('openai models and errors', async () => {
  const list = await openai.models.list();
  assert.equal(list.data[0].id, 'scripted_model');
  const one = await openai.models.retrieve('scripted_model');
  assert.equal(one.id, 'scripted_model');
  await assert.rejects(openai.chat.completions.create({ model: 'm', messages: ask, temperature: 'hot' }),
    (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ model: 'm', messages: ask, max_tokens: 1e6 }),
    (e) => e.status === 400 && /context holds/.test(e.message));
});

await test('anthropic message', async () => {
  const r = await anthropic.messages.create({ model: 'claude-x', max_tokens: 64, messages: ask, system: 'Be brief.' });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.model, 'claude-x');
  assert.deepEqual(r.content, [{ type: 'text', text: TEXT }]);
  assert.equal(r.stop_reason, 'end_turn');
  assert.equal(r.usage.output_tokens, 4);
});

await test('anthropic stream with thinking', async () => {
  const s = anthropic.messages.stream({ model: 'm', max_tokens: 64, messages: ask,
    thinking: { type: 'enabled', budget_tokens: 1024 } });
  const types = [];
  s.on('streamEvent', (ev) => types.push(ev.type === 'content_block_delta' ? ev.delta.type : ev.type));
  const m = await s.finalMessage();
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(m.content[0].thinking, THINK);
  assert.equal(m.content[1].text, TEXT);
  assert.equal(types[0], 'message_start');
  assert.ok(types.includes('thinking_delta') && types.includes('text_delta'));
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
});

await test('anthropic tool use stream and tool_result turn', async () => {
  const s = anthropic.messages.stream({ model: 'm', max_tokens: 64, messages: ask, tools: anTools });
  let partial = '';
  s.on('inputJson', (delta) => { partial += delta; });
  const m = await s.finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris' });
  assert.deepEqual(JSON.parse(partial), { city: 'Paris' });
  const r = await anthropic.messages.create({ model: 'm', max_tokens: 64, tools: anTools, messages: [...ask,
    { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'clear sky' }] }] });
  assert.equal(r.content[0].text, TEXT);
  assert.ok(r.usage.cache_read_input_tokens > 0);
});

await test('anthropic stop sequence, max_tokens, count_tokens, errors', async () => {
  const r = await anthropic.messages.create({ model: 'm', max_tokens: 64, messages: ask, stop_sequences: [' over'] });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, ' over');
  assert.equal(r.content[0].text, 'Sunny skies');
  const t = await anthropic.messages.create({ model: 'm', max_tokens: 1, messages: ask });
  assert.equal(t.stop_reason, 'max_tokens');
  assert.equal(t.content[0].text, 'Sunny');
  const c = await anthropic.messages.countTokens({ model: 'm', messages: ask });
  assert.ok(c.input_tokens > 5);
  await assert.rejects(anthropic.messages.create({ model: 'm', messages: ask }),
    (e) => e.status === 400 && /max_tokens/.test(e.message));
});

await test('ollama chat', async () => {
  const r = await ollama.chat({ model: 'm', messages: ask, stream: false });
  assert.equal(r.message.role, 'assistant');
  assert.equal(r.message.content, TEXT);
  assert.equal(r.done, true);
  assert.equal(r.done_reason, 'stop');
  assert.equal(r.eval_count, 4);
  assert.ok(r.total_duration > 0 && r.eval_duration > 0);
});

await test('ollama chat stream, tools and thinking', async () => {
  let text = '', last = null;
  for await (const p of await ollama.chat({ model: 'm', messages: ask, stream: true })) {
    text += p.message.content;
    last = p;
  }
  assert.equal(text, TEXT);
  assert.equal(last.done, true);
  const t = await ollama.chat({ model: 'm', messages: ask, tools: oaTools, stream: false });
  assert.equal(t.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(t.message.tool_calls[0].function.arguments, { city: 'Paris' });
  const th = await ollama.chat({ model: 'm', messages: ask, think: true, stream: false });
  assert.equal(th.message.thinking, THINK);
  assert.equal(th.message.content, TEXT);
});

await test('ollama generate and model routes', async () => {
  let text = '';
  for await (const p of await ollama.generate({ model: 'm', prompt: 'Weather?', stream: true,
    options: { num_predict: 2, temperature: 0 } })) text += p.response;
  assert.equal(text, 'Sunny skies');
  const g = await ollama.generate({ model: 'm', prompt: 'Weather?', raw: true, stream: false });
  assert.equal(g.response, TEXT);
  const tags = await ollama.list();
  assert.equal(tags.models[0].name, 'scripted_model');
  assert.equal(tags.models[0].details.family, 'llama');
  const show = await ollama.show({ model: 'scripted_model' });
  assert.ok(show.capabilities.includes('tools'));
  assert.equal(show.model_info['llama.context_length'], 65536);
  const ps = await ollama.ps();
  assert.equal(ps.models.length, 1);
  await assert.rejects(ollama.chat({ model: 'm', messages: 'nope', stream: false }), /messages/);
});

await test('openai chat logprobs', async () => {
  const r = await openai.chat.completions.create({ model: 'm', messages: ask, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  assert.equal(lp.map((t) => t.token).join(''), TEXT);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
    assert.equal(t.top_logprobs.length, 3);
    const v = t.top_logprobs.map((a) => a.logprob);
    assert.deepEqual(v, [...v].sort((a, b) => b - a));
    assert.ok(v.reduce((a, x) => a + Math.exp(x), 0) <= 1 + 1e-6);
  }
  const s = await openai.chat.completions.create({ model: 'm', messages: ask, logprobs: true, stream: true });
  const streamed = [];
  for await (const c of s) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  assert.equal(streamed.map((t) => t.token).join(''), TEXT);
});

await test('openai embeddings', async () => {
  // the SDK asks for base64 and decodes it
  const r = await openai.embeddings.create({ model: 'm', input: ['Sunny skies', 'over Paris'] });
  assert.equal(r.data.length, 2);
  assert.equal(r.data[1].index, 1);
  for (const d of r.data) {
    assert.ok(d.embedding.length > 8);
    assert.ok(Math.abs(Math.hypot(...d.embedding) - 1) < 1e-5);
  }
  const f = await openai.embeddings.create({ model: 'm', input: 'over Paris', encoding_format: 'float', dimensions: 8 });
  assert.equal(f.data[0].embedding.length, 8);
  const n = Math.hypot(...r.data[1].embedding.slice(0, 8)) || 1; // a zero head stays zero
  f.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - r.data[1].embedding[i] / n) < 1e-5));
  assert.ok(r.usage.prompt_tokens > 0);
});

await test('ollama logprobs and embed', async () => {
  const r = await ollama.chat({ model: 'm', messages: ask, logprobs: true, top_logprobs: 2 });
  assert.equal(r.logprobs.map((t) => t.token).join(''), TEXT);
  assert.ok(r.logprobs.every((t) => t.top_logprobs.length === 2));
  const e = await ollama.embed({ model: 'm', input: ['Sunny skies', 'over Paris'] });
  assert.equal(e.embeddings.length, 2);
  assert.ok(Math.abs(Math.hypot(...e.embeddings[0]) - 1) < 1e-5);
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
