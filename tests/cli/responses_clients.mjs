// The official OpenAI Node SDK (`openai` 6.x, pinned in scripts/setup.sh) against a running
// `moestream serve`, on the Responses API: responses.create whole and streamed, the
// responses.stream helper with function tools and function_call_output round trips,
// previous_response_id, JSON output, errors as the SDK's classes, and an abort mid-stream. The
// forged model writes random tokens: free text is checked for its shape, forced calls for their
// content, and every stream for what the SDK's accumulator needs (sequence numbers, indices,
// deltas that add up to the final items).
// Usage: node responses_clients.mjs http://127.0.0.1:PORT  (openai is resolved from
// $MOESTREAM_NODE_DIR/node_modules, default .deps/node of the repository).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = process.env.MOESTREAM_NODE_DIR || path.join(here, '..', '..', '.deps', 'node');
const require = createRequire(path.join(nodeDir, 'package.json'));
const openaiModule = require('openai');
const OpenAI = openaiModule.OpenAI ?? openaiModule.default ?? openaiModule;
// The package's exports hide package.json; its manifest is read from the installed folder.
const sdkVersion = JSON.parse(readFileSync(path.join(nodeDir, 'node_modules', 'openai', 'package.json'), 'utf8')).version;

const base = process.argv[2];
if (!base) {
  console.error('usage: node responses_clients.mjs http://HOST:PORT');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-checked', maxRetries: 0, timeout: 120_000 });

let failures = 0;
// The request a case is at: a thrown network error (undici's `terminated`) names no request.
let at = '';
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}${detail === undefined ? '' : `: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`}`);
  }
}

const weatherTool = {
  type: 'function',
  name: 'get_weather',
  description: 'The current weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};
const question = 'What is the weather in Paris right now?';

function parses(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function checkUsage(r, label) {
  const u = r.usage;
  check(u && u.input_tokens > 0 && u.output_tokens >= 0, `${label}: usage`, u);
  if (!u) return;
  check(u.total_tokens === u.input_tokens + u.output_tokens, `${label}: total_tokens`, u);
  check(Number.isInteger(u.input_tokens_details?.cached_tokens) && u.input_tokens_details.cached_tokens <= u.input_tokens,
    `${label}: input_tokens_details.cached_tokens`, u);
  check(Number.isInteger(u.output_tokens_details?.reasoning_tokens), `${label}: output_tokens_details.reasoning_tokens`, u);
}

// The events of a raw stream: numbered from 0, created first, one terminal event last; returns
// the text of the output_text deltas and the terminal response.
function checkEvents(events, label) {
  check(events.length >= 3, `${label}: at least created, in_progress and the end`, events.length);
  events.forEach((e, i) => check(e.sequence_number === i, `${label}: event ${i} sequence_number`, e.sequence_number));
  check(events[0]?.type === 'response.created', `${label}: first event`, events[0]?.type);
  const terminal = ['response.completed', 'response.incomplete', 'response.failed'];
  const ends = events.filter((e) => terminal.includes(e.type));
  check(ends.length === 1 && terminal.includes(events.at(-1)?.type), `${label}: one terminal event, last`, events.map((e) => e.type));
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  return { text, response: events.at(-1)?.response };
}

async function collect(stream) {
  const events = [];
  for await (const e of stream) events.push(e);
  return events;
}

async function createWhole() {
  const r = await client.responses.create({ model: 'tiny', input: 'Hello', instructions: 'Be brief.', max_output_tokens: 8 });
  check(r.object === 'response' && r.id?.startsWith('resp_'), 'create: object and id', r);
  check(['completed', 'incomplete'].includes(r.status), 'create: status', r.status);
  check(r.model === 'tiny' && r.instructions === 'Be brief.' && r.max_output_tokens === 8, 'create: echoed fields', r);
  const message = r.output.find((o) => o.type === 'message');
  check(message?.role === 'assistant' && message?.content?.[0]?.type === 'output_text', 'create: a message item', r.output);
  check(typeof r.output_text === 'string' && r.output_text === (message?.content?.[0]?.text ?? ''), 'create: output_text', r.output_text);
  check(r.usage?.output_tokens <= 8, 'create: max_output_tokens honoured', r.usage);
  checkUsage(r, 'create');
}

async function createStreamed() {
  const stream = await client.responses.create({ model: 'tiny', input: 'Tell me about the sea', max_output_tokens: 10, temperature: 0, stream: true });
  const { text, response } = checkEvents(await collect(stream), 'create stream');
  check(['completed', 'incomplete'].includes(response?.status), 'create stream: final status', response?.status);
  const final = response?.output?.filter((o) => o.type === 'message').map((o) => o.content.map((c) => c.text).join('')).join('');
  check(text === final, 'create stream: the deltas add up to the final message', { text, final });
  checkUsage(response ?? {}, 'create stream');
  // The same request whole: greedy, so the same text, and its prompt now comes from the cache.
  const whole = await client.responses.create({ model: 'tiny', input: 'Tell me about the sea', max_output_tokens: 10, temperature: 0 });
  check(whole.output_text === text, 'greedy: the same text streamed and whole', { whole: whole.output_text, text });
  check(whole.usage?.input_tokens_details?.cached_tokens > 0, 'the repeated prompt reuses the prefix cache', whole.usage);
}

async function streamHelperWithTools() {
  // The helper accumulates the events into the final response (it throws on inconsistent
  // indices); a forced call streams its arguments as deltas.
  let argumentDeltas = '';
  const stream = client.responses.stream({
    model: 'tiny', input: question, tools: [weatherTool], tool_choice: 'required', max_output_tokens: 96,
  });
  stream.on('response.function_call_arguments.delta', (e) => { argumentDeltas += e.delta; });
  const final = await stream.finalResponse();
  check(final.status === 'completed', 'stream helper: completed', final.status);
  const call = final.output.find((o) => o.type === 'function_call');
  check(call?.name === 'get_weather' && call?.call_id?.startsWith('call_'), 'stream helper: the forced call', final.output);
  check(typeof parses(call?.arguments) === 'object', 'stream helper: the arguments are a JSON object', call?.arguments);
  check(argumentDeltas === call?.arguments, 'stream helper: the argument deltas add up to the arguments', { argumentDeltas, call });
  checkUsage(final, 'stream helper');

  // The round trip: the previous output as it came, then the tool's result.
  const answer = await client.responses.create({
    model: 'tiny', tools: [weatherTool], max_output_tokens: 8,
    input: [{ role: 'user', content: question }, ...final.output, { type: 'function_call_output', call_id: call?.call_id, output: 'Sunny, 21 C' }],
  });
  check(['completed', 'incomplete'].includes(answer.status), 'round trip: answered', answer.status);
  check(answer.usage.input_tokens > final.usage.input_tokens, 'round trip: the call and its output are in the prompt', answer.usage);

  // A named function, whole; its output sent back in a streamed request through the helper.
  const named = await client.responses.create({
    model: 'tiny', input: question, tools: [weatherTool], tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 96,
  });
  const namedCall = named.output.find((o) => o.type === 'function_call');
  check(namedCall?.name === 'get_weather' && typeof parses(namedCall?.arguments) === 'object', 'named tool_choice: the call', named.output);
  const followUp = await client.responses.stream({
    model: 'tiny', tools: [weatherTool], max_output_tokens: 6,
    input: [{ role: 'user', content: question }, namedCall, { type: 'function_call_output', call_id: namedCall?.call_id, output: [{ type: 'input_text', text: 'Rain' }] }],
  }).finalResponse();
  check(['completed', 'incomplete'].includes(followUp.status), 'round trip (stream helper): answered', followUp.status);
}

async function previousResponse() {
  const first = await client.responses.create({ model: 'tiny', input: 'My name is Ada.', store: true, max_output_tokens: 6, temperature: 0 });
  check(first.store === true, 'store: echoed', first.store);
  const second = await client.responses.create({
    model: 'tiny', previous_response_id: first.id, input: 'What is my name?', store: true, max_output_tokens: 6,
  });
  check(second.previous_response_id === first.id, 'previous_response_id: echoed', second.previous_response_id);
  check(second.usage.input_tokens > first.usage.input_tokens, 'previous_response_id: the first exchange is in the prompt', { first: first.usage, second: second.usage });
  check(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1,
    'previous_response_id: the first prompt comes from the prefix cache', { first: first.usage, second: second.usage });
  const third = await client.responses.stream({ model: 'tiny', previous_response_id: second.id, input: 'Again?', max_output_tokens: 4 }).finalResponse();
  check(third.usage.input_tokens > second.usage.input_tokens, 'previous_response_id: a chain of three', third.usage);
  try {
    await client.responses.create({ model: 'tiny', previous_response_id: 'resp_00000000000000000000000000000000', input: 'x' });
    check(false, 'an unknown previous_response_id was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'unknown previous_response_id: BadRequestError', String(e));
    check(e.param === 'previous_response_id' && /no stored response/.test(e.message), 'unknown previous_response_id: says so', e.message);
  }
}

async function jsonOutput() {
  const r = await client.responses.create({ model: 'tiny', input: 'One JSON object, please', max_output_tokens: 64, text: { format: { type: 'json_object' } } });
  check(r.status === 'completed', 'json_object: completed', r.status);
  const v = parses(r.output_text);
  check(v !== null && typeof v === 'object' && !Array.isArray(v), 'json_object: the output is one JSON object', r.output_text);
}

async function apiErrors() {
  const refused = async (params, param, label) => {
    at = label;
    try {
      await client.responses.create({ model: 'tiny', ...params });
      check(false, `${label}: accepted`);
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.status === 400, `${label}: BadRequestError`, String(e));
      check(e.param === param, `${label}: param`, { param: e.param, message: e.message });
    }
  };
  await refused({ input: [{ type: 'function_call_output', call_id: 'call_missing', output: 'x' }] }, 'input[0].call_id', 'orphan function_call_output');
  await refused({ input: [{ type: 'web_search_call', id: 'ws_1' }] }, 'input[0].type', 'unknown item type');
  await refused({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] }, 'input[0].content[0].type', 'image input');
  await refused({ input: 'x', max_output_tokens: -1 }, 'max_output_tokens', 'negative max_output_tokens');
  await refused({ input: 'x', temperature: 5 }, 'temperature', 'temperature out of range');
  // A huge limit is a cap, not an error.
  at = 'a huge max_output_tokens (json_object)';
  const capped = await client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 2 ** 40, temperature: 0, text: { format: { type: 'json_object' } } });
  check(capped.status === 'completed', 'a huge max_output_tokens is accepted', capped.status);

  const long = 'many words '.repeat(9000);
  at = 'context overflow';
  try {
    await client.responses.create({ model: 'tiny', input: long });
    check(false, 'a prompt longer than the context was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /maximum context length/.test(e.message), 'context overflow: BadRequestError', String(e));
  }
  // Streamed, the overflow is a response.failed event with the code Codex acts on.
  at = 'context overflow, streamed';
  const events = await collect(await client.responses.create({ model: 'tiny', input: long, stream: true }));
  const { response } = checkEvents(events, 'overflow stream');
  check(response?.status === 'failed' && response?.error?.code === 'context_length_exceeded', 'overflow stream: response.failed', response?.error);
}

async function abortMidStream() {
  const stream = await client.responses.create({ model: 'tiny', input: question, max_output_tokens: 400, stream: true });
  let n = 0;
  for await (const e of stream) {
    void e;
    if (++n === 5) {
      stream.controller.abort();
      break;
    }
  }
  check(n === 5, 'abort: five events were read', n);
  const r = await client.responses.create({ model: 'tiny', input: 'Hi', max_output_tokens: 2 });
  check(r.output.length >= 1, 'abort: the server still serves', r);
}

check(sdkVersion.startsWith('6.'), 'the pinned openai 6.x SDK', sdkVersion);
const cases = [createWhole, createStreamed, streamHelperWithTools, previousResponse, jsonOutput, apiErrors, abortMidStream];
for (const c of cases) {
  at = '';
  try {
    await c();
  } catch (e) {
    failures++;
    const cause = e?.cause ? ` (cause: ${e.cause?.code ?? ''} ${e.cause?.message ?? e.cause})` : '';
    console.error(`FAIL: ${c.name} threw${at ? ` at ${at}` : ''}: ${e?.stack ?? e}${cause}`);
  }
}
if (failures) {
  console.error(`responses_clients.mjs: ${failures} check(s) failed`);
  process.exit(1);
}
console.log(`responses_clients.mjs: ${cases.length} client cases passed (openai ${sdkVersion})`);
