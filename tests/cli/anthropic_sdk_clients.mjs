// The official Anthropic TypeScript SDK (@anthropic-ai/sdk, pinned by scripts/setup.sh) against a
// running `moestream serve`: messages.create and messages.stream with text, thinking, tools
// (forced and auto, with tool_result round trips), stop sequences, count_tokens (exact), the
// prefix cache's usage, and the error classes. Raw fetch checks what the SDK hides (pings, the
// order of the SSE events, HEAD /). The forged model's text is random: free text is checked for
// its shape, forced tool calls and greedy runs for their content.
// Usage: node anthropic_sdk_clients.mjs main|overload URL KEY OTHER_KEY
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = process.env.MOESTREAM_NODE_DIR || path.join(here, '..', '..', '.deps', 'node');
const require = createRequire(path.join(nodeDir, 'package.json'));
const sdk = require('@anthropic-ai/sdk');
const Anthropic = sdk.Anthropic ?? sdk.default ?? sdk;

const [mode, base, key, otherKey] = process.argv.slice(2);
if (!mode || !base || !key) {
  console.error('usage: node anthropic_sdk_clients.mjs main|overload URL KEY OTHER_KEY');
  process.exit(2);
}
const client = (opts = {}) => new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120_000, ...opts });
const api = client();

let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}${detail === undefined ? '' : `: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`}`);
  }
}
async function test(name, fn) {
  try {
    await fn();
  } catch (e) {
    failures++;
    console.error(`FAIL: ${name} threw: ${e?.stack ?? e}`);
  }
}
// The error an API call throws (or null when it succeeds).
async function thrown(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return e;
  }
}
function checkError(e, cls, status, type, what) {
  check(e instanceof cls, `${what}: ${cls.name}`, e?.constructor?.name + ' ' + (e?.message ?? e));
  check(e?.status === status, `${what}: status ${status}`, e?.status);
  check(e?.type === type && e?.error?.type === 'error', `${what}: Anthropic error shape with type ${type}`, e?.error);
}

const user = (text) => [{ role: 'user', content: text }];
const weather = {
  name: 'get_weather',
  description: 'The current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const clock = { name: 'get_time', description: 'The time in a time zone', input_schema: { type: 'object', properties: { zone: { type: 'string' } } } };
const usageTotal = (u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;

function checkMessage(m, label, maxTokens) {
  check(typeof m.id === 'string' && m.id.startsWith('msg_'), `${label}: id`, m.id);
  check(m.type === 'message' && m.role === 'assistant', `${label}: type and role`, m);
  check(Array.isArray(m.content), `${label}: content array`, m.content);
  for (const b of m.content) {
    check(['text', 'thinking', 'tool_use'].includes(b.type), `${label}: block type`, b);
    if (b.type === 'text') check(typeof b.text === 'string', `${label}: text block`, b);
    if (b.type === 'thinking') check(typeof b.thinking === 'string' && typeof b.signature === 'string', `${label}: thinking block`, b);
    if (b.type === 'tool_use')
      check(b.id.startsWith('toolu_') && typeof b.name === 'string' && b.input && typeof b.input === 'object', `${label}: tool_use block`, b);
  }
  check(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use', 'model_context_window_exceeded'].includes(m.stop_reason),
    `${label}: stop_reason`, m.stop_reason);
  check(m.stop_sequence === null || m.stop_reason === 'stop_sequence', `${label}: stop_sequence`, m);
  const u = m.usage;
  for (const k of ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens', 'output_tokens'])
    check(Number.isInteger(u?.[k]) && u[k] >= 0, `${label}: usage.${k}`, u);
  if (maxTokens !== undefined) check(u.output_tokens <= maxTokens, `${label}: output_tokens <= max_tokens`, u);
}

// The raw SSE of a streamed request: [{event, data}] in order (pings included).
async function rawStream(body, headers = {}) {
  const res = await fetch(`${base}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': key, 'anthropic-version': '2023-06-01', ...headers },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const text = await res.text();
  const events = [];
  for (const chunk of text.split('\n\n')) {
    if (!chunk.trim()) continue;
    const ev = /^event: (.*)$/m.exec(chunk)?.[1];
    const data = /^data: (.*)$/m.exec(chunk)?.[1];
    events.push({ event: ev, data: data ? JSON.parse(data) : null });
  }
  return { status: res.status, type: res.headers.get('content-type'), events };
}

// The event grammar: message_start, then blocks (start, deltas of its kind, stop) in index
// order, message_delta, message_stop; pings anywhere after message_start; every data.type names
// its event. Returns the blocks assembled from the deltas.
function checkEventOrder(events, label) {
  check(events[0]?.event === 'message_start', `${label}: message_start first`, events[0]);
  const last = events.at(-1), beforeLast = events.at(-2);
  check(last?.event === 'message_stop' && beforeLast?.event === 'message_delta', `${label}: message_delta, message_stop last`,
    events.slice(-2).map((e) => e.event));
  const blocks = [];
  let open = -1;
  for (const { event, data } of events) {
    check(data?.type === event, `${label}: data.type matches the event`, { event, type: data?.type });
    if (event === 'content_block_start') {
      check(open === -1 && data.index === blocks.length, `${label}: blocks start in order, one at a time`, data);
      open = data.index;
      blocks.push({ ...data.content_block, text: data.content_block.text ?? '', thinking: data.content_block.thinking ?? '', json: '' });
    } else if (event === 'content_block_delta') {
      check(data.index === open, `${label}: delta of the open block`, data);
      const b = blocks[open], d = data.delta;
      if (d.type === 'text_delta') { check(b.type === 'text', `${label}: text_delta in a text block`, b.type); b.text += d.text; }
      else if (d.type === 'thinking_delta') { check(b.type === 'thinking', `${label}: thinking_delta in a thinking block`, b.type); b.thinking += d.thinking; }
      else if (d.type === 'input_json_delta') { check(b.type === 'tool_use', `${label}: input_json_delta in a tool_use block`, b.type); b.json += d.partial_json; }
      else check(false, `${label}: delta type`, d);
    } else if (event === 'content_block_stop') {
      check(data.index === open, `${label}: stop of the open block`, data);
      open = -1;
    }
  }
  check(open === -1, `${label}: every block stopped`);
  for (const b of blocks) {
    if (b.type !== 'tool_use') continue;
    let input;
    try { input = JSON.parse(b.json); } catch { check(false, `${label}: input_json_delta fragments concatenate to valid JSON`, b.json); }
    check(input && typeof input === 'object' && !Array.isArray(input), `${label}: the tool input is an object`, b.json);
  }
  return blocks;
}

async function main() {
  const long = 'The quick brown fox jumps over the lazy dog. '.repeat(40);

  await test('create: text', async () => {
    const body = { model: 'claude-test', max_tokens: 12, messages: user('Hello there'), temperature: 0.7, top_p: 0.9, top_k: 50,
      metadata: { user_id: 'sdk-test' } };
    const m = await api.messages.create(body);
    checkMessage(m, 'create', 12);
    check(m.model === 'claude-test', 'create: the model is echoed', m.model);
    check(m.content.every((b) => b.type === 'text'), 'create: text blocks only', m.content);
    // count_tokens renders the very prompt generation submits.
    const { input_tokens } = await api.messages.countTokens({ model: 'claude-test', messages: user('Hello there') });
    check(input_tokens === usageTotal(m.usage), 'count_tokens equals the prompt the generation used', { input_tokens, usage: m.usage });
  });

  await test('count_tokens: with system, tools and thinking', async () => {
    const body = { model: 'x', system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }],
      tools: [weather, clock], messages: user('Weather in Paris?'), thinking: { type: 'enabled', budget_tokens: 8 } };
    const { input_tokens } = await api.messages.countTokens(body);
    const m = await api.messages.create({ ...body, max_tokens: 16 });
    check(input_tokens === usageTotal(m.usage), 'count_tokens is exact with tools and thinking', { input_tokens, usage: m.usage });
    const plain = await api.messages.countTokens({ model: 'x', messages: user('Weather in Paris?') });
    check(plain.input_tokens < input_tokens, 'tools and the system prompt count', { plain, input_tokens });
  });

  await test('the prefix cache across turns, and the billing header', async () => {
    const billing = (v) => ({ type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.328.${v}; cc_entrypoint=sdk-cli; cch=${v};` });
    const system = (v) => [billing(v), { type: 'text', text: `You review code. ${long}`, cache_control: { type: 'ephemeral' } }];
    const first = await api.messages.create({ model: 'x', max_tokens: 4, system: system('a1b2c'), messages: user('First question') });
    check(first.usage.cache_creation_input_tokens > 300, 'turn 1 writes its prompt to the cache', first.usage);
    const turn2 = [{ role: 'user', content: 'First question' }, { role: 'assistant', content: first.content.map((b) => b.type === 'text' ? b.text : '').join('') || '.' },
      { role: 'user', content: 'Second question' }];
    // A different billing header value: the server drops it, so the prefix is shared.
    const second = await api.messages.create({ model: 'x', max_tokens: 4, system: system('ffff0'), messages: turn2 });
    check(second.usage.cache_read_input_tokens > 300, 'turn 2 reads the shared prefix from the cache', second.usage);
    check(second.usage.cache_creation_input_tokens < 60, 'turn 2 processes only what is new', second.usage);
    check(second.usage.input_tokens === 0, 'every processed prompt token is kept: none is input_tokens', second.usage);
  });

  await test('stream: text, events in order, finalMessage', async () => {
    const stream = api.messages.stream({ model: 'x', max_tokens: 10, messages: user('Tell me a story') });
    let text = '';
    stream.on('text', (t) => { text += t; });
    const m = await stream.finalMessage();
    checkMessage(m, 'stream', 10);
    check(m.content.filter((b) => b.type === 'text').map((b) => b.text).join('') === text, 'stream: text events add up to the final text');
    const raw = await rawStream({ model: 'x', max_tokens: 10, messages: user('Tell me a story') });
    check(raw.status === 200 && raw.type.startsWith('text/event-stream'), 'raw stream: 200 event-stream', raw);
    checkEventOrder(raw.events, 'raw stream');
    const start = raw.events[0].data.message;
    check(start.content.length === 0 && start.stop_reason === null && start.usage.output_tokens === 0, 'message_start before any token', start);
    const delta = raw.events.at(-2).data;
    check(usageTotal(delta.usage) === usageTotal(start.usage), 'message_start and message_delta agree on the prompt size', { start: start.usage, delta: delta.usage });
  });

  await test('beta route, Bearer token and headers', async () => {
    const bearer = client({ apiKey: null, authToken: key });
    const m = await bearer.beta.messages.create({ model: 'x', max_tokens: 4, messages: user('Hi'), betas: ['interleaved-thinking-2025-05-14'] });
    checkMessage(m, 'beta + Bearer', 4);
    const res = await fetch(`${base}/v1/messages?beta=true`, { method: 'POST', headers: { authorization: `Bearer ${key}`,
      'anthropic-version': '2023-06-01', 'anthropic-beta': 'claude-code-20250219,context-management-2025-06-27' },
      body: JSON.stringify({ model: 'x', max_tokens: 3, messages: user('Hi'), context_management: { edits: [] }, output_config: { effort: 'high' },
        thinking: { type: 'adaptive', display: 'omitted' } }) });
    check(res.status === 200, 'Claude Code\'s fields and headers are accepted', await res.text());
    const head = await fetch(`${base}/`, { method: 'HEAD', headers: { 'x-api-key': key } });
    check(head.status === 200, 'HEAD / answers 200', head.status);
  });

  await test('thinking: enabled with a budget', async () => {
    const body = { model: 'x', max_tokens: 48, thinking: { type: 'enabled', budget_tokens: 12 }, messages: user('Think first') };
    const m = await api.messages.create(body);
    checkMessage(m, 'thinking', 48);
    check(m.content[0]?.type === 'thinking' && m.content[0].thinking.length > 0, 'the reply starts with its reasoning', m.content);
    // The reasoning ends within 12 tokens, so a reply cut at 48 tokens has text after it.
    if (m.stop_reason === 'max_tokens')
      check(m.content.length >= 2 && m.content.slice(1).some((b) => b.type === 'text'), 'the reasoning ended within its budget', m.content);
    const raw = await rawStream(body);
    const blocks = checkEventOrder(raw.events, 'thinking stream');
    check(blocks[0]?.type === 'thinking' && blocks[0].thinking.length > 0, 'thinking_delta events stream the reasoning', blocks);
    const omitted = await rawStream({ ...body, thinking: { type: 'enabled', budget_tokens: 12, display: 'omitted' } });
    const ob = checkEventOrder(omitted.events, 'omitted thinking');
    check(ob[0]?.type === 'thinking' && ob[0].thinking === '' &&
      !omitted.events.some((e) => e.data?.delta?.type === 'thinking_delta'), 'display omitted: a thinking block without text', ob);
  });

  await test('tools: forced by name, streamed and not', async () => {
    const body = { model: 'x', max_tokens: 64, tools: [weather, clock], tool_choice: { type: 'tool', name: 'get_weather' },
      messages: user('What is the weather in Paris?') };
    const m = await api.messages.create(body);
    checkMessage(m, 'forced tool', 64);
    const calls = m.content.filter((b) => b.type === 'tool_use');
    check(calls.length === 1 && calls[0].name === 'get_weather', 'a named tool stays named', m.content);
    check(m.stop_reason === 'tool_use', 'forced tool: stop_reason tool_use', m.stop_reason);
    // The answer goes back as a tool_result, and the conversation goes on.
    const next = await api.messages.create({ model: 'x', max_tokens: 8, tools: [weather, clock], messages: [
      ...user('What is the weather in Paris?'), { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: calls[0].id, content: '18 C, sunny' }, { type: 'text', text: 'And tomorrow?' }] }] });
    checkMessage(next, 'after a tool_result', 8);
    const bad = await thrown(() => api.messages.create({ model: 'x', max_tokens: 8, messages: [
      ...user('What is the weather in Paris?'), { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_unknown', content: 'x' }] }] }));
    checkError(bad, sdk.BadRequestError, 400, 'invalid_request_error', 'a tool_result for an unknown tool_use id');
    check(/toolu_unknown/.test(bad?.message ?? ''), 'the 400 names the unknown id', bad?.message);

    const stream = api.messages.stream(body);
    let json = '';
    stream.on('inputJson', (partial) => { json += partial; });
    const sm = await stream.finalMessage();
    const sc = sm.content.filter((b) => b.type === 'tool_use');
    check(sc.length === 1 && sc[0].name === 'get_weather' && sm.stop_reason === 'tool_use', 'streamed forced call', sm.content);
    check(json.length > 0 && JSON.stringify(JSON.parse(json)) === JSON.stringify(sc[0]?.input), 'input_json_delta fragments concatenate to the input', { json, input: sc[0]?.input });
    checkEventOrder((await rawStream(body)).events, 'forced tool stream');
  });

  await test('tools: any with one call, auto', async () => {
    const any = await api.messages.create({ model: 'x', max_tokens: 64, tools: [weather, clock],
      tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages: user('Weather and time in Oslo?') });
    const calls = any.content.filter((b) => b.type === 'tool_use');
    check(calls.length === 1 && ['get_weather', 'get_time'].includes(calls[0].name) && any.stop_reason === 'tool_use', 'any: one call to one of the tools', any.content);
    const auto = await api.messages.create({ model: 'x', max_tokens: 24, tools: [weather, clock], tool_choice: { type: 'auto' },
      messages: user('Weather in Oslo?') });
    checkMessage(auto, 'auto', 24);
    checkEventOrder((await rawStream({ model: 'x', max_tokens: 24, tools: [weather], messages: user('Weather in Oslo?') })).events, 'auto stream');
    const none = await api.messages.create({ model: 'x', max_tokens: 8, tools: [weather], tool_choice: { type: 'none' }, messages: user('Hi') });
    check(none.content.every((b) => b.type !== 'tool_use'), 'none: no tool call', none.content);
  });

  await test('stop sequences', async () => {
    // Greedy decoding repeats itself, so a piece of a first run's text is where a second run stops.
    const body = { model: 'x', max_tokens: 24, temperature: 0, messages: user('Count to ten') };
    const free = await api.messages.create(body);
    const text = free.content.map((b) => b.text ?? '').join('');
    const cut = [...text].slice(4, 7).join('');
    check(cut.length > 0, 'the greedy run wrote text', text);
    const stopped = await api.messages.create({ ...body, stop_sequences: [cut] });
    const stoppedText = stopped.content.map((b) => b.text ?? '').join('');
    check(stopped.stop_reason === 'stop_sequence' && stopped.stop_sequence === cut, 'stop_reason stop_sequence and the sequence', stopped);
    check(text.startsWith(stoppedText) && !stoppedText.includes(cut) && stoppedText.length <= text.indexOf(cut),
      'the text ends before the stop sequence', { text, stoppedText, cut });
    const raw = await rawStream({ ...body, stop_sequences: [cut] });
    const delta = raw.events.at(-2)?.data?.delta;
    check(delta?.stop_reason === 'stop_sequence' && delta?.stop_sequence === cut, 'streamed stop_sequence', delta);
  });

  await test('a final assistant message starts the reply', async () => {
    const messages = [...user('Name a colour'), { role: 'assistant', content: 'The colour is' }];
    const m = await api.messages.create({ model: 'x', max_tokens: 6, messages });
    checkMessage(m, 'prefill', 6);
    const { input_tokens } = await api.messages.countTokens({ model: 'x', messages });
    check(input_tokens === usageTotal(m.usage), 'the prefill is part of the prompt', { input_tokens, usage: m.usage });
  });

  await test('errors', async () => {
    checkError(await thrown(() => api.messages.create({ model: 'x', max_tokens: 8, messages: [] })),
      sdk.BadRequestError, 400, 'invalid_request_error', 'empty messages');
    checkError(await thrown(() => api.messages.create({ model: 'x', max_tokens: 8, messages: [{ role: 'user',
      content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] })),
    sdk.BadRequestError, 400, 'invalid_request_error', 'an image block');
    const overflow = await thrown(() => api.messages.create({ model: 'x', max_tokens: 8, messages: user(long.repeat(8)) }));
    checkError(overflow, sdk.BadRequestError, 400, 'invalid_request_error', 'a prompt longer than the context');
    check(/prompt is too long: \d+ tokens > \d+ maximum/.test(overflow?.message ?? ''), 'the overflow wording clients parse', overflow?.message);
    checkError(await thrown(() => client({ apiKey: 'wrong-key' }).messages.create({ model: 'x', max_tokens: 8, messages: user('Hi') })),
      sdk.AuthenticationError, 401, 'authentication_error', 'a wrong key');
    checkError(await thrown(() => api.messages.create({ model: 'x', max_tokens: 8, messages: user('x'.repeat(300_000)) })),
      sdk.ContentTooLargeError ?? sdk.APIError, 413, 'request_too_large', 'a body over the limit');
    checkError(await thrown(() => api.post('/v1/messages/batches', { body: {} })), sdk.NotFoundError, 404, 'not_found_error', 'an unknown route');
    // Claude Code's huge max_tokens is a cap, not an error.
    const big = await api.messages.create({ model: 'x', max_tokens: 1_000_000, stop_sequences: ['e', 'a', 'o'], messages: user('Hi') });
    checkMessage(big, 'huge max_tokens');
  });
}

async function overload() {
  const other = client({ apiKey: otherKey });
  const hold = { model: 'x', max_tokens: 6000, messages: user('Write a long story') };
  // Two streams of this key take the only sequence and the only place in the queue.
  const started = [];
  const streams = [0, 1].map(() => new Promise((resolve) => {
    const s = api.messages.stream(hold);
    s.on('streamEvent', (e) => { if (e.type === 'message_start') started.push(s); });
    s.finalMessage().then((m) => resolve({ message: m }), (e) => resolve({ error: e }));
  }));
  for (let i = 0; i < 200 && started.length < 2; ++i) await new Promise((r) => setTimeout(r, 50));
  check(started.length === 2, 'both holding streams were accepted (message_start before their prefill)', started.length);
  const mine = await thrown(() => api.messages.create({ model: 'x', max_tokens: 4, messages: user('One more') }));
  checkError(mine, sdk.RateLimitError, 429, 'rate_limit_error', 'the key that fills the queue');
  check(mine?.headers?.get('retry-after') !== null, '429 carries retry-after', mine?.headers);
  const others = await thrown(() => other.messages.create({ model: 'x', max_tokens: 4, messages: user('Hello') }));
  checkError(others, sdk.OverloadedError, 529, 'overloaded_error', 'another key while the queue is full');
  check(others?.headers?.get('retry-after') !== null, '529 carries retry-after', others?.headers);
  // The holding streams run into the request time limit: an error event after the stream started.
  const ends = await Promise.all(streams);
  for (const [i, end] of ends.entries())
    check(end.error instanceof sdk.APIError && end.error.type === 'timeout_error', `holding stream ${i} ends with an error event`,
      end.error ? `${end.error.constructor.name} ${end.error.type} ${end.error.message}` : end.message?.stop_reason);
  const raw = await rawStream({ ...hold, max_tokens: 6000 });
  const errors = raw.events.filter((e) => e.event === 'error');
  check(raw.status === 200 && raw.events[0]?.event === 'message_start' && errors.length === 1 && raw.events.at(-1).event === 'error' &&
    errors[0].data.type === 'error' && errors[0].data.error.type === 'timeout_error', 'raw: event: error ends the stream', raw.events.slice(-2));
  check(!raw.events.some((e) => e.event === 'message_stop'), 'no message_stop after an error');
}

await (mode === 'overload' ? overload() : main());
if (failures) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log(`anthropic sdk (${mode}): ok`);
