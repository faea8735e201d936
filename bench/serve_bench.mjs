// Throughput and latency of `sluice serve` under N concurrent clients: each client sends streamed
// /v1/completions requests one after another (a prompt of about PROMPT words, MAX tokens, temperature 0)
// until REQUESTS have been sent in all. Reports aggregate generated tok/s, time to first token and
// inter-token latency (p50 / p99) from the arrival times of the streamed chunks (tokens from the usage).
// usage: node serve_bench.mjs BASE_URL [CLIENTS=8] [REQUESTS=4*CLIENTS] [PROMPT=64] [MAX=128]
//        (node >= 18, no packages; loopback only)
const [base, nc = '8', nr, np = '64', nm = '128'] = process.argv.slice(2);
if (!base) {
  console.error('usage: node serve_bench.mjs BASE_URL [CLIENTS] [REQUESTS] [PROMPT_WORDS] [MAX_TOKENS]');
  process.exit(2);
}
const clients = Number(nc), total = Number(nr ?? 4 * clients), promptWords = Number(np), maxTokens = Number(nm);
const words = ['river', 'stone', 'light', 'market', 'paper', 'engine', 'garden', 'signal', 'winter', 'harbor'];
const ttft = [], itl = [];
let next = 0, tokens = 0, failed = 0;

function prompt(i) {
  const w = [];
  for (let k = 0; k < promptWords; k++) w.push(words[(i * 7 + k * 3 + (k >> 2)) % words.length]);
  return `Request ${i}: ${w.join(' ')}`;
}

async function one(i) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: prompt(i), max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true,
      stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) { failed++; await res.text(); return; }
  const dec = new TextDecoder();
  let buf = '', last = null;
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!ev.startsWith('data: {')) continue;
      const now = performance.now();
      const d = JSON.parse(ev.slice(6));
      if (d.usage) tokens += d.usage.completion_tokens;
      if (!d.choices?.[0]?.text) continue;
      if (last === null) ttft.push(now - t0); else itl.push(now - last);
      last = now;
    }
  }
}

async function client() {
  for (let i; (i = next++) < total;) await one(i);
}

function pct(a, p) {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, client));
const secs = (performance.now() - t0) / 1000;
const f = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
console.log('| clients | requests | failed | tokens | seconds | tok/s (all) | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |');
console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
console.log(`| ${clients} | ${total} | ${failed} | ${tokens} | ${secs.toFixed(2)} | ${f(tokens / secs)} | ${f(pct(ttft, 50))} | ` +
  `${f(pct(ttft, 99))} | ${f(pct(itl, 50))} | ${f(pct(itl, 99))} |`);
process.exit(failed ? 1 : 0);
