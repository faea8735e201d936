// Drives a running `sluice serve` on the scripted fixture model with the official SDKs: the OpenAI Responses API,
// and what Claude Code relies on in the Anthropic API (system messages mid-conversation, the overflow wording).
// usage: node responses.test.mjs BASE_URL
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.argv[2];
const TEXT = 'Sunny skies over Paris.';
const THINK = 'The user wants the weather.';
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const ask = [{ role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] }];

let passed = 0, failed = 0;
async function test(name, fn) {
  try { await fn(); passed++; console.log(`ok - ${name}`); }
  catch (e) { failed++; console.log(`FAIL - ${name}: ${e.stack || e}`); }
}

async function collect(stream) {
  const events = [];
  for await (const ev of stream) events.push(ev);
  return events;
}

await test('responses create', async () => {
  const r = await openai.responses.create({ model: 'm', input: 'What is the weather?', instructions: 'Be brief.',
    temperature: 0, store: false, metadata: { k: 'v' }, user: 'u1' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.equal(r.model, 'm');
  assert.equal(r.instructions, 'Be brief.');
  assert.deepEqual(r.metadata, { k: 'v' });
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.deepEqual(m.content, [{ type: 'output_text', text: TEXT, annotations: [], logprobs: [] }]);
  assert.equal(r.output_text, TEXT);
  assert.equal(r.usage.output_tokens, 4);
  assert.ok(r.usage.input_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 4);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.incomplete_details, null);
});

await test('responses stream: the event sequence, and the same text as the whole response', async () => {
  const whole = await openai.responses.create({ model: 'm', input: ask, temperature: 0 });
  const events = await collect(await openai.responses.create({ model: 'm', input: ask, temperature: 0,
    stream: true }));
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const types = events.map((e) => e.type).filter((t, i, a) => t !== a[i - 1]);
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', 'response.output_text.delta', 'response.output_text.done',
    'response.content_part.done', 'response.output_item.done', 'response.completed']);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length >= 4, `only ${deltas.length} deltas: the text was not streamed token by token`);
  const text = deltas.map((e) => e.delta).join('');
  assert.equal(text, whole.output_text);
  assert.equal(events[0].response.status, 'in_progress');
  const id = events[2].item.id;
  assert.ok(deltas.every((e) => e.item_id === id && e.output_index === 0 && e.content_index === 0));
  assert.equal(events.find((e) => e.type === 'response.output_text.done').text, TEXT);
  const done = events.at(-1).response;
  assert.equal(done.id, events[0].response.id);
  assert.equal(done.status, 'completed');
  assert.equal(done.output[0].content[0].text, TEXT);
  assert.equal(done.usage.output_tokens, 4);
});

await test('responses function tools: a call item, then a turn with its output', async () => {
  const r = await openai.responses.create({ model: 'm', input: ask, tools,
    parallel_tool_calls: true, tool_choice: 'auto' });
  assert.equal(r.output.length, 1);
  const call = r.output[0];
  assert.equal(call.type, 'function_call');
  assert.match(call.id, /^fc_/);
  assert.match(call.call_id, /^call_/);
  assert.equal(call.name, 'get_weather');
  assert.equal(call.status, 'completed');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris' });
  const next = await openai.responses.create({ model: 'm', tools, input: [...ask, call,
    { type: 'function_call_output', call_id: call.call_id, output: '{"sky": "clear"}' }] });
  assert.equal(next.output_text, TEXT);
  assert.ok(next.usage.input_tokens_details.cached_tokens > 0);
});

await test('responses function tools streamed, hosted tools skipped', async () => {
  const events = await collect(await openai.responses.create({ model: 'm', input: ask, stream: true,
    tools: [{ type: 'web_search_preview' }, ...tools] }));
  const types = events.map((e) => e.type).filter((t, i, a) => t !== a[i - 1]);
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.function_call_arguments.delta', 'response.function_call_arguments.done',
    'response.output_item.done', 'response.completed']);
  const added = events[2].item;
  assert.equal(added.type, 'function_call');
  assert.equal(added.name, 'get_weather');
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.deepEqual(JSON.parse(args), { city: 'Paris' });
  const done = events.find((e) => e.type === 'response.output_item.done').item;
  assert.equal(done.call_id, added.call_id);
  assert.equal(done.arguments, args);
  assert.deepEqual(events.at(-1).response.output, [done]);
});

await test('responses tool_choice forces a call after a tool result', async () => {
  const input = [...ask, { type: 'function_call', call_id: 'c1', name: 'get_weather', arguments: '{}' },
    { type: 'function_call_output', call_id: 'c1', output: 'sunny' }];
  const auto = await openai.responses.create({ model: 'm', input, tools });
  assert.equal(auto.output_text, TEXT);
  for (const tool_choice of ['required', { type: 'function', name: 'get_weather' }]) {
    const r = await openai.responses.create({ model: 'm', input, tools, tool_choice });
    assert.equal(r.output[0].type, 'function_call');
    assert.equal(r.output[0].name, 'get_weather');
  }
  await assert.rejects(openai.responses.create({ model: 'm', input, tools,
    tool_choice: { type: 'function', name: 'nope' } }), (e) => e.status === 400 && e.param === 'tool_choice.name');
});

await test('responses reasoning: items and events, summary on request', async () => {
  const r = await openai.responses.create({ model: 'm', input: ask, reasoning: { effort: 'high' } });
  assert.equal(r.output[0].type, 'reasoning');
  assert.match(r.output[0].id, /^rs_/);
  assert.deepEqual(r.output[0].content, [{ type: 'reasoning_text', text: THINK }]);
  assert.deepEqual(r.output[0].summary, []);
  assert.equal(r.output_text, TEXT);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 1);
  const events = await collect(await openai.responses.create({ model: 'm', input: ask, stream: true,
    reasoning: { effort: 'medium', summary: 'auto' } }));
  const types = events.map((e) => e.type).filter((t, i, a) => t !== a[i - 1]);
  assert.deepEqual(types.slice(2, 8), ['response.output_item.added', 'response.reasoning_summary_part.added',
    'response.reasoning_summary_text.delta', 'response.reasoning_summary_text.done',
    'response.reasoning_summary_part.done', 'response.output_item.done']);
  const summary = events.filter((e) => e.type === 'response.reasoning_summary_text.delta').map((e) => e.delta);
  assert.equal(summary.join(''), THINK);
  const out = events.at(-1).response.output;
  assert.deepEqual(out.map((i) => i.type), ['reasoning', 'message']);
  assert.deepEqual(out[0].summary, [{ type: 'summary_text', text: THINK }]);
  assert.equal(out[1].content[0].text, TEXT);
  const off = await openai.responses.create({ model: 'm', input: ask, reasoning: { effort: 'none' } });
  assert.deepEqual(off.output.map((i) => i.type), ['message']);
  // a reasoning item sent back is accepted with the turn it belongs to
  const again = await openai.responses.create({ model: 'm', input: [...ask, r.output[0], r.output[1],
    { role: 'user', content: 'And tomorrow?' }] });
  assert.equal(again.output_text, TEXT);
});

await test('responses max_output_tokens: incomplete', async () => {
  const r = await openai.responses.create({ model: 'm', input: ask, max_output_tokens: 2 });
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.output_text, 'Sunny skies');
  assert.equal(r.output[0].status, 'incomplete');
  const events = await collect(await openai.responses.create({ model: 'm', input: ask, max_output_tokens: 2,
    stream: true }));
  assert.equal(events.at(-1).type, 'response.incomplete');
  assert.equal(events.at(-1).response.incomplete_details.reason, 'max_output_tokens');
});

await test('responses text.format json_schema', async () => {
  const r = await openai.responses.create({ model: 'm', input: 'Weather?', text: { format: { type: 'json_schema',
    name: 'weather', strict: true, schema: { type: 'object', properties: { sky: { type: 'string' } } } } } });
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.text.format.schema, { type: 'object', properties: { sky: { type: 'string' } } });
  // the schema reaches the prompt (a system message), so the prompt grows by it
  const plain = await openai.responses.create({ model: 'm', input: 'Weather?' });
  assert.ok(r.usage.input_tokens > plain.usage.input_tokens + 10,
    `${r.usage.input_tokens} against ${plain.usage.input_tokens} without the schema`);
  await assert.rejects(openai.responses.create({ model: 'm', input: 'x', text: { format: { type: 'json_schema',
    name: 'w' } } }), (e) => e.status === 400 && e.param === 'text.format.schema');
});

await test('responses errors name the field', async () => {
  await assert.rejects(openai.responses.create({ model: 'm', input: 'x', previous_response_id: 'resp_1' }),
    (e) => e.status === 400 && e.param === 'previous_response_id' && /stores no responses/.test(e.message));
  await assert.rejects(openai.responses.create({ model: 'm', input: 'x', temperature: 'hot' }),
    (e) => e.status === 400 && e.param === 'temperature');
  await assert.rejects(openai.responses.create({ model: 'm', input: 'x', max_output_tokens: 1e6 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /context holds/.test(e.message));
  await assert.rejects(openai.responses.create({ model: 'm', input: [{ type: 'item_reference', id: 'msg_1' }] }),
    (e) => e.status === 400 && e.param === 'input[0]');
});

await test('openai chat: context overflow carries context_length_exceeded', async () => {
  await assert.rejects(openai.chat.completions.create({ model: 'm', max_tokens: 1e6,
    messages: [{ role: 'user', content: 'x' }] }), (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

await test('anthropic: a system message within messages', async () => {
  const r = await anthropic.messages.create({ model: 'm', max_tokens: 64, system: 'Be brief.', messages: [
    { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' },
    { role: 'system', content: [{ type: 'text', text: 'The user is in Paris.' }] },
    { role: 'user', content: 'What is the weather?' }] });
  assert.deepEqual(r.content, [{ type: 'text', text: TEXT }]);
  const without = await anthropic.messages.countTokens({ model: 'm', system: 'Be brief.', messages: [
    { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' },
    { role: 'user', content: 'What is the weather?' }] });
  assert.ok(r.usage.input_tokens + r.usage.cache_read_input_tokens > without.input_tokens + 5);
});

await test('anthropic: context overflow in Anthropic\'s words', async () => {
  const msg = [{ role: 'user', content: 'What is the weather?' }];
  const c = await anthropic.messages.countTokens({ model: 'm', messages: msg });
  // streamed: the SDK refuses a large max_tokens without streaming before it sends anything
  await assert.rejects(anthropic.messages.create({ model: 'm', max_tokens: 70000, messages: msg, stream: true }),
    (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.equal(e.error.error.message, `input length and \`max_tokens\` exceed context limit: ${c.input_tokens} + ` +
      '70000 > 65536, decrease input length or `max_tokens` and try again');
    return true;
  });
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
