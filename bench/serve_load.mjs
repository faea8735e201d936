// Load test for `sluice serve` on loopback: CLIENTS concurrent clients send REQUESTS requests in all, mixing
// the OpenAI, Anthropic and Ollama routes, streamed and whole, and drop about a fifth of them mid-flight.
// Every response that completes must be well formed; with the scripted fixture model its text is checked too.
// usage: node serve_load.mjs BASE_URL [REQUESTS] [CLIENTS] [--scripted]   (node >= 18, no packages)
const [base, nReq = '500', nCli = '8'] = process.argv.slice(2);
const scripted = process.argv.includes('--scripted');
const TEXT = 'Sunny skies over Paris.';
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
const stats = { ok: 0, aborted: 0, busy: 0, bad: 0, byKind: {} };
let next = 0;

function fail(kind, why) { stats.bad++; console.log(`BAD ${kind}: ${why}`); }

function sse(text) {
  return text.split('\n\n').filter((b) => b.trim()).map((b) => {
    const ev = /^event: (.*)$/m.exec(b)?.[1] ?? null;
    const data = /^data: (.*)$/m.exec(b)?.[1];
    if (data === undefined) throw new Error(`event without data: ${b.slice(0, 80)}`);
    return { ev, data: data === '[DONE]' ? data : JSON.parse(data) };
  });
}

const kinds = {
  async openai_chat(body) { return ['/v1/chat/completions', { model: 'm', messages: ask, ...body }]; },
};
const requests = [
  ['openai_chat', '/v1/chat/completions', { model: 'm', messages: ask }, (t) => {
    const r = JSON.parse(t);
    if (r.object !== 'chat.completion' || !r.usage) throw new Error('shape');
    if (scripted && r.choices[0].message.content !== TEXT) throw new Error(`text ${r.choices[0].message.content}`);
  }],
  ['openai_chat_stream', '/v1/chat/completions', { model: 'm', messages: ask, stream: true,
    stream_options: { include_usage: true } }, (t) => {
    const evs = sse(t);
    if (evs.at(-1).data !== '[DONE]') throw new Error('no [DONE]');
    const text = evs.slice(0, -1).map((e) => e.data.choices[0]?.delta?.content ?? '').join('');
    if (!evs.at(-2).data.usage) throw new Error('no usage chunk');
    if (scripted && text !== TEXT) throw new Error(`text ${text}`);
  }],
  ['completion_stream_long', '/v1/completions', { model: 'm', prompt: scripted ? '<|loop|>' : 'Once', max_tokens: 200,
    stream: true }, (t) => {
    const evs = sse(t);
    if (evs.at(-1).data !== '[DONE]') throw new Error('no [DONE]');
    const text = evs.slice(0, -1).map((e) => e.data.choices[0].text).join('');
    if (scripted && text !== ' la'.repeat(200)) throw new Error(`text length ${text.length}`);
  }],
  ['anthropic', '/v1/messages', { model: 'm', max_tokens: 64, messages: ask }, (t) => {
    const r = JSON.parse(t);
    if (r.type !== 'message' || !r.usage) throw new Error('shape');
    if (scripted && r.content[0].text !== TEXT) throw new Error(`text ${r.content[0].text}`);
  }],
  ['anthropic_stream', '/v1/messages', { model: 'm', max_tokens: 64, messages: ask, stream: true }, (t) => {
    const evs = sse(t);
    if (evs[0].ev !== 'message_start' || evs.at(-1).ev !== 'message_stop') throw new Error('event order');
    const text = evs.filter((e) => e.data.delta?.type === 'text_delta').map((e) => e.data.delta.text).join('');
    if (scripted && text !== TEXT) throw new Error(`text ${text}`);
  }],
  ['ollama_chat_stream', '/api/chat', { model: 'm', messages: ask }, (t) => {
    const lines = t.trim().split('\n').map((l) => JSON.parse(l));
    const last = lines.at(-1);
    if (!last.done || !last.done_reason) throw new Error('no final object');
    const text = lines.map((l) => l.message.content).join('');
    if (scripted && text !== TEXT) throw new Error(`text ${text}`);
  }],
  ['ollama_generate', '/api/generate', { model: 'm', prompt: 'Weather?', stream: false }, (t) => {
    const r = JSON.parse(t);
    if (!r.done) throw new Error('not done');
    if (scripted && r.response !== TEXT) throw new Error(`text ${r.response}`);
  }],
];
void kinds;

async function one(i) {
  const [kind, path, body, check] = requests[i % requests.length];
  const ctl = new AbortController();
  const drop = Math.random() < 0.2;
  const timer = drop ? setTimeout(() => ctl.abort(), Math.random() * 30) : null;
  try {
    const res = await fetch(base + path, { method: 'POST', body: JSON.stringify(body), signal: ctl.signal,
      headers: { 'Content-Type': 'application/json' } });
    const text = await res.text();
    if (timer) clearTimeout(timer);
    if (res.status === 503) { stats.busy++; return; }
    if (res.status !== 200) return fail(kind, `status ${res.status} ${text.slice(0, 200)}`);
    try { check(text); stats.ok++; stats.byKind[kind] = (stats.byKind[kind] ?? 0) + 1; }
    catch (e) { fail(kind, `${e.message}: ${text.slice(0, 200)}`); }
  } catch (e) {
    if (e.name === 'AbortError') stats.aborted++;
    else fail(kind, e.message);
  }
}

async function client() {
  for (let i; (i = next++) < Number(nReq);) await one(i);
}

const t0 = Date.now();
await Promise.all(Array.from({ length: Number(nCli) }, client));
const s = (Date.now() - t0) / 1000;
console.log(JSON.stringify({ requests: Number(nReq), clients: Number(nCli), seconds: s, ...stats }));
process.exit(stats.bad ? 1 : 0);
