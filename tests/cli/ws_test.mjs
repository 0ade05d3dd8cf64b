// The /v1/ws protocol (docs/websocket.md) against a running `moestream serve`, with the `ws` npm
// package as the client.
// Usage: node ws_test.mjs WS_URL API_KEY SERVER_PID
//   The server must run with --api-key API_KEY, --drain 1 and server.request_timeout_s 6 (see
//   ws_test.sh); the last case sends it SIGTERM.
//   MOESTREAM_NODE_DIR: the folder whose node_modules holds `ws` (default: the repository's .deps/node).
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = process.env.MOESTREAM_NODE_DIR || path.join(here, '..', '..', '.deps', 'node');
const require = createRequire(path.join(nodeDir, 'package.json'));
const WebSocket = require('ws');

const [url, apiKey, serverPid] = process.argv.slice(2);
if (!url || !apiKey || !serverPid) {
  console.error('usage: node ws_test.mjs WS_URL API_KEY SERVER_PID');
  process.exit(2);
}
const auth = { Authorization: `Bearer ${apiKey}` };

function check(cond, what) {
  if (!cond) throw new Error(what);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One connection: every message parsed and kept in order, the close recorded.
class Conn {
  constructor(ws) {
    this.ws = ws;
    this.all = [];
    this.closed = null;
    this.wakers = new Set();
    ws.on('message', (data, isBinary) => {
      check(!isBinary, 'the server sent a binary message');
      this.all.push(JSON.parse(data.toString()));
      this.wake();
    });
    ws.on('close', (code, reason) => {
      this.closed = { code, reason: reason.toString() };
      this.wake();
    });
    ws.on('error', () => {});  // surfaces as a close
  }
  // Resolves once session.created has arrived, so that every case starts from a known state.
  static async open(headers = auth, protocols = ['llmstream.v1']) {
    const conn = await new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols, { headers, perMessageDeflate: false });
      const conn = new Conn(ws);  // listens from the start: session.created may come with the upgrade
      ws.once('open', () => resolve(conn));
      ws.once('unexpected-response', (req, res) => reject(Object.assign(new Error(`HTTP ${res.statusCode}`), { status: res.statusCode })));
      ws.once('error', reject);
    });
    await conn.until(() => conn.all.length >= 1, 'session.created');
    check(conn.all[0].type === 'session.created', `the first message is ${conn.all[0].type}, not session.created`);
    return conn;
  }
  wake() {
    for (const w of this.wakers) w();
  }
  send(obj) {
    this.ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj));
  }
  // Resolves once cond() holds, checked at every message and at the close.
  until(cond, what, ms = 30000) {
    return new Promise((resolve, reject) => {
      const test = () => {
        let v;
        try {
          v = cond();
        } catch (e) {
          finish();
          return reject(e);
        }
        if (v) {
          finish();
          resolve(v);
        }
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`timed out after ${ms} ms waiting for ${what}; last messages: ` +
          JSON.stringify(this.all.slice(-3)).slice(0, 600) + ` close: ${JSON.stringify(this.closed)}`));
      }, ms);
      const finish = () => {
        clearTimeout(timer);
        this.wakers.delete(test);
      };
      this.wakers.add(test);
      test();
    });
  }
  of(id) {
    return this.all.filter((m) => m.id === id);
  }
  done(id) {
    return this.all.find((m) => m.type === 'request.done' && m.id === id);
  }
  untilDone(id, ms) {
    return this.until(() => this.done(id), `request.done of ${id}`, ms);
  }
  // A round trip: everything the server queued before the pong has arrived.
  async sync(tag) {
    this.send({ type: 'ping', t: tag });
    await this.until(() => this.all.find((m) => m.type === 'pong' && m.t === tag), `pong ${tag}`);
  }
  close() {
    this.ws.close();
    return this.until(() => this.closed, 'close');
  }
}

// Checks the protocol's per-request rules and returns the request's deltas and final event.
function stream(conn, id, { accepted = true } = {}) {
  const events = conn.of(id);
  const dones = events.filter((m) => m.type === 'request.done');
  check(dones.length === 1, `${id}: expected exactly one request.done, got ${dones.length}`);
  check(events[events.length - 1].type === 'request.done', `${id}: request.done is not the last message of the id`);
  if (accepted) check(events[0].type === 'request.accepted', `${id}: the first message is ${events[0].type}, not request.accepted`);
  const deltas = events.filter((m) => m.type === 'delta');
  deltas.forEach((d, i) => check(d.seq === i, `${id}: delta ${i} has seq ${d.seq} (gap or reorder)`));
  const text = deltas.map((d) => (d.reasoning || '') + (d.content || '')).join('');
  const tokens = deltas.flatMap((d) => d.token_ids || []);
  return { events, deltas, done: dones[0], text, tokens };
}

const chat = (content, extra = {}) => ({ messages: [{ role: 'user', content }], temperature: 0, ...extra });
const native = (prompt, n, extra = {}) => ({ prompt, n_predict: n, temperature: 0, ignore_eos: true, ...extra });
const create = (id, api, body, options) => ({ type: 'request.create', id, api, body, ...(options ? { options } : {}) });

const cases = [];
const test = (name, fn) => cases.push({ name, fn });
let limits = null;

test('session.created first, subprotocol echoed', async () => {
  const c = await Conn.open();
  check(c.ws.protocol === 'llmstream.v1', `subprotocol '${c.ws.protocol}' was not echoed`);
  const s = c.all[0];
  check(s.type === 'session.created', `first message is ${s.type}`);
  check(typeof s.model === 'string' && s.model.length > 0, 'session.created.model');
  check(typeof s.server === 'string' && s.server.startsWith('moestream'), 'session.created.server');
  check(Number.isInteger(s.n_ctx) && s.n_ctx > 0, 'session.created.n_ctx');
  check(Number.isInteger(s.max_parallel) && s.max_parallel > 0, 'session.created.max_parallel');
  check(s.limits && s.limits.max_message_bytes > 0 && s.limits.max_inflight > 1, 'session.created.limits');
  check(s.limits.soft_queue_bytes < s.limits.hard_queue_bytes, 'soft queue limit below the hard one');
  check(s.limits.max_ping_bytes >= 60002 && s.limits.max_ping_bytes < s.limits.soft_queue_bytes, 'max_ping_bytes');
  limits = s.limits;
  await c.close();
});

test('without the subprotocol: no protocol header, same messages', async () => {
  const c = await Conn.open(auth, []);
  check(c.ws.protocol === '', `unexpected subprotocol '${c.ws.protocol}'`);
  check(c.all[0].type === 'session.created', 'session.created');
  await c.close();
});

test('auth: 401 before the upgrade without or with a wrong key; X-Api-Key works', async () => {
  for (const headers of [{}, { Authorization: 'Bearer wrong' }]) {
    let status = 0;
    try {
      const c = await Conn.open(headers);
      await c.close();
    } catch (e) {
      status = e.status;
    }
    check(status === 401, `upgrade with headers ${JSON.stringify(headers)} got ${status || 'upgraded'}, not 401`);
  }
  const c = await Conn.open({ 'X-Api-Key': apiKey });
  await c.close();
});

test('ping -> pong echoes t', async () => {
  const c = await Conn.open();
  c.send({ type: 'ping', t: 12345.5 });
  c.send({ type: 'ping', t: { nested: ['a', 1, null] } });
  c.send({ type: 'ping' });
  await c.until(() => c.all.filter((m) => m.type === 'pong').length === 3, 'three pongs');
  const pongs = c.all.filter((m) => m.type === 'pong');
  check(pongs[0].t === 12345.5, `pong t ${JSON.stringify(pongs[0].t)}`);
  check(JSON.stringify(pongs[1].t) === '{"nested":["a",1,null]}', `pong t ${JSON.stringify(pongs[1].t)}`);
  check(!('t' in pongs[2]), 'a pong without t carries none');
  const before = c.all.length;
  c.send({ type: 'ping', t: 'x'.repeat(limits.max_ping_bytes) });
  await c.sync('after-big-ping');
  const got = c.all.slice(before, -1);
  check(got.length === 1 && got[0].type === 'error' && got[0].error.param === 't', `an oversized t answered ${JSON.stringify(got).slice(0, 300)}`);
  await c.close();
});

test('two concurrent requests on one socket: interleaved, gap-free, one request.done each', async () => {
  const c = await Conn.open();
  c.send(create('a', 'chat.completions', chat('Tell me a story.', { max_tokens: 24, ignore_eos: true }), { token_ids: true }));
  c.send(create('b', 'completions', { prompt: 'Once upon a time', max_tokens: 24, ignore_eos: true, temperature: 0.7, seed: 3 }, { token_ids: true }));
  await c.untilDone('a');
  await c.untilDone('b');
  const a = stream(c, 'a'), b = stream(c, 'b');
  for (const [id, s] of [['a', a], ['b', b]]) {
    check(s.done.finish_reason === 'length', `${id}: finish_reason ${s.done.finish_reason}`);
    check(s.done.usage && s.done.usage.completion_tokens === 24, `${id}: usage ${JSON.stringify(s.done.usage)}`);
    check(s.done.usage.total_tokens === s.done.usage.prompt_tokens + 24, `${id}: total_tokens`);
    check(s.tokens.length === 24, `${id}: ${s.tokens.length} token ids for 24 tokens`);
    check(s.done.timings && s.done.timings.predicted_n === 24, `${id}: timings ${JSON.stringify(s.done.timings)}`);
    check(s.deltas.every((d) => typeof d.id === 'string' && (d.content !== undefined || d.reasoning !== undefined || d.token_ids)), `${id}: empty delta`);
  }
  // Interleaved: some message of b arrives between the first and the last delta of a (or the
  // reverse), since both are decoded in the same batch.
  const pos = (m) => c.all.indexOf(m);
  const inside = (x, y) => c.all.slice(pos(x.deltas[0]), pos(x.deltas[x.deltas.length - 1])).some((m) => m.id === y);
  check(inside(a, 'b') || inside(b, 'a'), 'the two requests were not interleaved');
  await c.close();
});

// A sample of /metrics (0 when absent), e.g. metric('moestream:request_success_total', 'finished_reason="length"').
async function metric(name, labelPart = '') {
  const httpUrl = url.replace(/^ws/, 'http').replace(/\/v1\/ws$/, '/metrics');
  const res = await fetch(httpUrl, { headers: auth });
  check(res.status === 200, `/metrics answered ${res.status}`);
  let total = 0;
  for (const line of (await res.text()).split('\n')) {
    if (!line.startsWith(name + '{') && !line.startsWith(name + ' ')) continue;
    if (labelPart && !line.includes(labelPart)) continue;
    total += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return total;
}

test('requests are observed in /metrics; the upgrade is counted', async () => {
  const finished0 = await metric('moestream:request_success_total', 'finished_reason="length"');
  const tokens0 = await metric('moestream:generation_tokens_total');
  const c = await Conn.open();
  c.send(create('m', 'completion', native('Metrics', 9)));
  await c.untilDone('m');
  await c.close();
  const finished1 = await metric('moestream:request_success_total', 'finished_reason="length"');
  const tokens1 = await metric('moestream:generation_tokens_total');
  check(finished1 === finished0 + 1, `request_success_total{length} went from ${finished0} to ${finished1}`);
  check(tokens1 === tokens0 + 9, `generation_tokens_total went from ${tokens0} to ${tokens1}`);
  check(await metric('moestream:http_requests_total', 'status="101"') >= 1, 'the upgrade is not counted');
});

test('closing the socket cancels its requests (an abort in /metrics, the engine idle again)', async () => {
  const aborts0 = await metric('moestream:request_success_total', 'finished_reason="abort"');
  const c = await Conn.open();
  c.send(create('gone', 'completion', native('A very long story', 4000)));
  await c.until(() => c.of('gone').some((m) => m.type === 'delta'), 'a delta');
  await c.close();
  let aborts = aborts0, running = 1;
  for (let i = 0; i < 100 && (aborts === aborts0 || running > 0); ++i) {
    await sleep(50);
    aborts = await metric('moestream:request_success_total', 'finished_reason="abort"');
    running = await metric('moestream:num_requests_running');
  }
  check(aborts === aborts0 + 1, `request_success_total{abort} went from ${aborts0} to ${aborts}`);
  check(running === 0, `${running} sequences still running after the close`);
});

test('options: no usage, no timings, no token ids', async () => {
  const c = await Conn.open();
  c.send(create('q', 'completion', native('Hello', 5), { include_usage: false, timings: false, token_ids: false }));
  await c.untilDone('q');
  const q = stream(c, 'q');
  check(!('usage' in q.done) && !('timings' in q.done), `request.done carries ${JSON.stringify(q.done)}`);
  check(q.deltas.every((d) => !('token_ids' in d)), 'token_ids sent without being asked for');
  check(q.deltas.every((d) => (d.content || '').length > 0), 'a delta without text was sent');
  await c.close();
});

test('request.cancel mid-stream -> request.done cancelled; unknown id is a no-op', async () => {
  const c = await Conn.open();
  c.send(create('long', 'completion', native('Count to a thousand:', 4000)));
  await c.until(() => c.of('long').filter((m) => m.type === 'delta').length >= 3, 'three deltas');
  c.send({ type: 'request.cancel', id: 'long' });
  await c.untilDone('long');
  const s = stream(c, 'long');
  check(s.done.finish_reason === 'cancelled', `finish_reason ${s.done.finish_reason}`);
  check(s.done.usage.completion_tokens < 4000 && s.done.usage.completion_tokens >= 3, `usage ${JSON.stringify(s.done.usage)}`);
  const before = c.all.length;
  c.send({ type: 'request.cancel', id: 'long' });
  c.send({ type: 'request.cancel', id: 'never-existed' });
  await c.sync('after-cancel');
  check(c.all.length === before + 1, `cancelling finished/unknown ids answered ${JSON.stringify(c.all.slice(before))}`);
  await c.close();
});

test('bad messages: error events, the connection survives', async () => {
  const c = await Conn.open();
  const bad = [
    ['{"type":', 'not valid JSON'],
    ['[1,2]', 'must be a JSON object'],
    [{ no_type: 1 }, 'type'],
    [{ type: 'request.explode' }, 'unknown message type'],
    [{ type: 'request.create', api: 'completion', body: {} }, 'id'],
    [{ type: 'request.cancel' }, 'id'],
    [{ type: 'session.update' }, 'defaults'],
  ];
  for (const [msg, words] of bad) {
    const before = c.all.length;
    c.send(msg);
    await c.sync(`bad-${before}`);
    const got = c.all.slice(before, -1);
    check(got.length === 1 && got[0].type === 'error', `${JSON.stringify(msg)} answered ${JSON.stringify(got)}`);
    check(!('id' in got[0]), `connection-level error carries an id: ${JSON.stringify(got[0])}`);
    check(got[0].error.code === 400 && got[0].error.type === 'invalid_request_error', `error ${JSON.stringify(got[0])}`);
    check(got[0].error.message.includes(words), `error message lacks '${words}': ${got[0].error.message}`);
  }
  // Binary frames are refused the same way.
  c.ws.send(Buffer.from('{"type":"ping"}'), { binary: true });
  await c.until(() => c.all.some((m) => m.type === 'error' && m.error.message.includes('binary')), 'binary refusal');
  check(c.closed === null, 'the connection closed after bad messages');
  await c.close();
});

test('request.create errors end that id: error {id} then request.done error', async () => {
  const c = await Conn.open();
  const cases = [
    ['e1', create('e1', 'responses', {}), 400, 'api'],
    ['e2', create('e2', 'chat.completions', chat('hi', { temperature: 'hot' })), 400, 'temperature'],
    ['e3', create('e3', 'completion', 'not an object'), 400, 'body'],
    ['e4', create('e4', 'completion', native('hi', 3), { token_ids: 'yes' }), 400, 'options.token_ids'],
    ['e5', create('e5', 'completion', native('word '.repeat(10000), 3)), 400, 'maximum context length'],
  ];
  for (const [id, msg, code, words] of cases) {
    c.send(msg);
    await c.untilDone(id);
    const s = stream(c, id, { accepted: false });
    check(s.events.length === 2 && s.events[0].type === 'error', `${id}: ${JSON.stringify(s.events).slice(0, 400)}`);
    check(s.events[0].error.code === code, `${id}: code ${s.events[0].error.code}`);
    check(JSON.stringify(s.events[0].error).includes(words), `${id}: error lacks '${words}': ${JSON.stringify(s.events[0].error)}`);
    check(s.done.finish_reason === 'error', `${id}: finish_reason ${s.done.finish_reason}`);
  }
  check(c.of('e5')[0].error.type === 'exceed_context_size_error', 'context overflow type');
  await c.close();
});

test('duplicate live id: refused at connection level, the live request unharmed', async () => {
  const c = await Conn.open();
  c.send(create('d', 'completion', native('Tell me more', 4000)));
  await c.until(() => c.of('d').some((m) => m.type === 'delta'), 'a delta of d');
  const before = c.all.length;
  c.send(create('d', 'completion', native('again', 3)));
  await c.until(() => c.all.slice(before).some((m) => m.type === 'error'), 'the duplicate refusal');
  const err = c.all.slice(before).find((m) => m.type === 'error');
  check(!('id' in err) && err.error.code === 409 && err.error.message.includes('"d"'), `refusal ${JSON.stringify(err)}`);
  c.send({ type: 'request.cancel', id: 'd' });
  await c.untilDone('d');
  const s = stream(c, 'd');
  check(s.done.finish_reason === 'cancelled', `d ended with ${s.done.finish_reason}`);
  // Once done, the id may be used again.
  c.send(create('d', 'completion', native('again', 3)));
  await c.until(() => c.of('d').filter((m) => m.type === 'request.done').length === 2, 'the second d');
  await c.close();
});

test('too many requests in flight: 429 for the extra id', async () => {
  const c = await Conn.open();
  const n = limits.max_inflight;
  for (let i = 0; i < n; ++i) c.send(create(`f${i}`, 'completion', native(`Story ${i}:`, 4000)));
  c.send(create('extra', 'completion', native('one more', 3)));
  await c.untilDone('extra');
  const x = stream(c, 'extra', { accepted: false });
  check(x.events[0].type === 'error' && x.events[0].error.code === 429 && x.events[0].error.type === 'rate_limit_error',
    `extra: ${JSON.stringify(x.events[0])}`);
  for (let i = 0; i < n; ++i) check(!c.done(`f${i}`), `f${i} ended early`);
  for (let i = 0; i < n; ++i) c.send({ type: 'request.cancel', id: `f${i}` });
  for (let i = 0; i < n; ++i) await c.untilDone(`f${i}`);
  for (let i = 0; i < n; ++i) check(stream(c, `f${i}`).done.finish_reason === 'cancelled', `f${i} not cancelled`);
  await c.close();
});

test('session.update: defaults apply where the body is silent', async () => {
  const c = await Conn.open();
  c.send({ type: 'session.update', defaults: { max_tokens: 3, ignore_eos: true } });
  await c.until(() => c.all.some((m) => m.type === 'session.updated'), 'session.updated');
  check(c.all.find((m) => m.type === 'session.updated').defaults.max_tokens === 3, 'session.updated echoes the defaults');
  c.send(create('u1', 'completions', { prompt: 'Hello', temperature: 0 }));
  c.send(create('u2', 'completions', { prompt: 'Hello', temperature: 0, max_tokens: 5 }));
  await c.untilDone('u1');
  await c.untilDone('u2');
  check(stream(c, 'u1').done.usage.completion_tokens === 3, `u1 used ${stream(c, 'u1').done.usage.completion_tokens} tokens, default 3`);
  check(stream(c, 'u2').done.usage.completion_tokens === 5, 'the body wins over the default');
  const before = c.all.length;
  c.send({ type: 'session.update', defaults: { prompt: 'x' } });
  await c.sync('upd');
  check(c.all.slice(before).some((m) => m.type === 'error' && m.error.param === 'defaults.prompt'), 'a default prompt is refused');
  c.send({ type: 'session.update', defaults: {} });
  c.send(create('u3', 'completions', { prompt: 'Hello', temperature: 0, max_tokens: 7, ignore_eos: true }));
  await c.untilDone('u3');
  check(stream(c, 'u3').done.usage.completion_tokens === 7, 'cleared defaults');
  await c.close();
});

test('oversized message -> close 1009', async () => {
  const c = await Conn.open();
  c.send({ type: 'ping', t: 'x'.repeat(limits.max_message_bytes) });
  await c.until(() => c.closed, 'the close');
  check(c.closed.code === 1009, `closed with ${c.closed.code}, not 1009`);
  check(!c.all.some((m) => m.type === 'pong'), 'the oversized message was answered');
});

test('a request over the server\'s time limit ends with a 504 error', async () => {
  const c = await Conn.open();
  const t0 = Date.now();
  c.send(create('slow', 'completion', native('An epic in many volumes', 8000)));
  await c.untilDone('slow', 20000);
  const s = stream(c, 'slow');
  const err = s.events.find((m) => m.type === 'error');
  check(err && err.error.code === 504 && err.error.type === 'timeout_error', `slow ended ${JSON.stringify(s.events.slice(-2)).slice(0, 400)}`);
  check(s.done.finish_reason === 'error' && s.deltas.length > 0, `finish_reason ${s.done.finish_reason}, ${s.deltas.length} deltas`);
  check(Date.now() - t0 >= 5500, `ended after ${Date.now() - t0} ms, before the 6 s limit`);
  await c.close();
});

// Reference output of greedy requests, read at full speed.
async function reference(bodies) {
  const c = await Conn.open();
  bodies.forEach((b, i) => c.send(create(`r${i}`, 'completion', b, { token_ids: true })));
  const out = [];
  for (let i = 0; i < bodies.length; ++i) {
    await c.untilDone(`r${i}`);
    out.push(stream(c, `r${i}`));
  }
  await c.close();
  return out;
}

test('slow reader, queue between the limits: deltas merged, nothing lost', async () => {
  const bodies = [native('The history of', 48), native('A recipe for', 48)];
  const ref = await reference(bodies);
  const c = await Conn.open();
  c.ws.pause();
  // About 6 MB of pongs: the socket buffers on both sides hold a few MB (4.3 MB with Linux's
  // defaults), the rest stays queued in the server, above the soft limit and below the hard one.
  const pad = 'p'.repeat(60000);
  const pings = 100;
  for (let i = 0; i < pings; ++i) c.send({ type: 'ping', t: { i, pad } });
  await sleep(500);
  bodies.forEach((b, i) => c.send(create(`s${i}`, 'completion', b, { token_ids: true })));
  await sleep(3000);  // the requests finish while nothing is read
  c.ws.resume();
  await c.until(() => c.closed || bodies.every((_, i) => c.done(`s${i}`)), 'both request.done or a close', 60000);
  if (c.closed) {
    // How much the kernel buffers on a paused connection depends on its TCP autotuning (slower
    // builds, e.g. sanitized ones, see less): then the queue passed the hard limit and the
    // bounded outcome happened instead, which is all this case can check here.
    check(c.closed.code === 1008 && c.closed.reason === 'slow consumer', `closed with ${JSON.stringify(c.closed)}`);
    console.log('   (the socket buffers held less than expected: the queue passed the hard limit, closed 1008; merging not checked in this run)');
    return;
  }
  const pongs = c.all.filter((m) => m.type === 'pong');
  check(pongs.length === pings && pongs.every((p, i) => p.t.i === i && p.t.pad === pad), 'pongs lost or reordered');
  let merged = 0;
  bodies.forEach((_, i) => {
    const s = stream(c, `s${i}`);
    check(s.text === ref[i].text, `s${i}: text differs from the unpaused run`);
    check(JSON.stringify(s.tokens) === JSON.stringify(ref[i].tokens), `s${i}: token ids differ from the unpaused run`);
    check(s.done.usage.completion_tokens === 48, `s${i}: usage`);
    merged += s.tokens.length - s.deltas.length;
  });
  check(merged > 0, 'no delta was merged although the queue was over the soft limit');
  console.log(`   (merged ${merged} of ${2 * 48} token deltas)`);
  await c.close();
});

test('slow reader over the hard limit -> close 1008 "slow consumer"; the server still serves', async () => {
  const c = await Conn.open();
  c.send(create('victim', 'completion', native('Endless', 4000)));
  await c.until(() => c.of('victim').some((m) => m.type === 'delta'), 'a delta');
  c.ws.pause();
  const pad = 'q'.repeat(60000);
  let sent = 0;
  // Up to 30 MB, far beyond the socket buffers plus the hard limit.
  while (sent < 512 && c.ws.readyState === WebSocket.OPEN) {
    for (let k = 0; k < 16; ++k, ++sent) c.send({ type: 'ping', t: pad });
    await sleep(5);
  }
  await sleep(1000);
  c.ws.resume();
  await c.until(() => c.closed, 'the close', 60000);
  check(c.closed.code === 1008 && c.closed.reason === 'slow consumer', `closed with ${JSON.stringify(c.closed)}`);
  const pongs = c.all.filter((m) => m.type === 'pong').length;
  check(pongs < sent, `all ${sent} pongs were delivered: nothing was bounded`);
  check(!c.done('victim'), 'the slow consumer still got request.done after its queue was dropped');
  const d = await Conn.open();
  d.send(create('after', 'completion', native('Still there?', 4)));
  await d.untilDone('after');
  check(stream(d, 'after').done.finish_reason === 'length', 'a new connection after the slow consumer');
  await d.close();
});

test('graceful shutdown: 503 for new requests, in-flight ended, close 1012', async () => {
  const c = await Conn.open();
  c.send(create('inflight', 'completion', native('Going on and on', 4000)));
  await c.until(() => c.of('inflight').some((m) => m.type === 'delta'), 'a delta');
  process.kill(Number(serverPid), 'SIGTERM');
  await sleep(300);
  c.send(create('late', 'completion', native('too late', 3)));
  await c.untilDone('late');
  const late = stream(c, 'late', { accepted: false });
  check(late.events[0].type === 'error' && late.events[0].error.code === 503, `late: ${JSON.stringify(late.events[0])}`);
  await c.untilDone('inflight', 10000);
  const s = stream(c, 'inflight');
  const err = s.events.find((m) => m.type === 'error');
  check(s.done.finish_reason === 'error' && err && err.error.code === 503, `inflight ended ${JSON.stringify(s.events.slice(-2))}`);
  await c.until(() => c.closed, 'the close', 10000);
  check(c.closed.code === 1012, `closed with ${c.closed.code}, not 1012`);
});

let failed = 0;
for (const { name, fn } of cases) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok - ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL - ${name}: ${e.message}`);
    if (name.startsWith('session.created')) break;  // the rest depends on its limits
  }
}
console.log(failed ? `${failed} case(s) failed` : 'all cases passed');
process.exit(failed ? 1 : 0);
