// The official OpenAI Node SDK (`openai` 6.x, pinned in scripts/setup.sh) against a running
// `moestream serve`: streamed chat completions with tools and usage, a forced tool call, text
// completions, the model list, and API errors. The forged model emits random tokens, so
// free-form answers are checked for their shape (what a client parses), forced tool calls for
// their content.
// Usage: node serve_clients.mjs http://127.0.0.1:PORT  (the openai package is resolved from
// $MOESTREAM_NODE_DIR/node_modules, default .deps/node of the repository).
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = process.env.MOESTREAM_NODE_DIR || path.join(here, '..', '..', '.deps', 'node');
const require = createRequire(path.join(nodeDir, 'package.json'));
const openaiModule = require('openai');
const OpenAI = openaiModule.OpenAI ?? openaiModule.default ?? openaiModule;

const base = process.argv[2];
if (!base) {
  console.error('usage: node serve_clients.mjs http://HOST:PORT');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-checked', maxRetries: 0, timeout: 60_000 });

let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}${detail === undefined ? '' : `: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`}`);
  }
}

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const weatherQuestion = [{ role: 'user', content: 'What is the weather in Paris right now?' }];

// Checks a streamed chat completion's chunks; returns the tool calls assembled from the deltas.
function checkChatStream(chunks, label) {
  check(chunks.length >= 3, `${label}: at least a token, the finish and the usage chunk`, chunks.length);
  const id = chunks[0]?.id;
  let finishes = 0, roles = 0, sawChoices = false;
  const calls = [];
  chunks.forEach((c, i) => {
    check(c.object === 'chat.completion.chunk', `${label}: chunk ${i} object`, c.object);
    check(c.id === id, `${label}: chunk ${i} keeps the id`, c.id);
    check(Array.isArray(c.choices), `${label}: chunk ${i} has a choices array`, c);
    const last = i === chunks.length - 1;
    if (last) {
      check(c.choices.length === 0, `${label}: the usage chunk has choices []`, c.choices);
      return;
    }
    check(c.choices.length === 1, `${label}: chunk ${i} has one choice`, c.choices);
    check(!c.usage, `${label}: only the last chunk carries usage`, c.usage);
    const ch = c.choices[0];
    sawChoices = true;
    if (ch.delta?.role !== undefined) {
      roles++;
      check(ch.delta.role === 'assistant', `${label}: role`, ch.delta.role);
    }
    if (ch.finish_reason !== null && ch.finish_reason !== undefined) {
      finishes++;
      check(['stop', 'length', 'tool_calls'].includes(ch.finish_reason), `${label}: finish_reason`, ch.finish_reason);
    }
    for (const t of ch.delta?.tool_calls ?? []) {
      check(Number.isInteger(t.index), `${label}: a tool call delta has an index`, t);
      calls[t.index] ??= { id: '', name: '', arguments: '' };
      if (t.id) calls[t.index].id = t.id;
      if (t.function?.name) calls[t.index].name += t.function.name;
      if (t.function?.arguments) calls[t.index].arguments += t.function.arguments;
    }
  });
  check(sawChoices, `${label}: chunks with choices`);
  check(roles === 1, `${label}: the role is sent once`, roles);
  check(finishes === 1, `${label}: finish_reason is set exactly once`, finishes);
  const usage = chunks[chunks.length - 1].usage;
  check(usage && usage.completion_tokens > 0 && usage.prompt_tokens > 0, `${label}: usage in the last chunk`, usage);
  if (usage) check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens, `${label}: total_tokens`, usage);
  return { calls, finish: chunks.at(-2)?.choices?.[0]?.finish_reason, usage };
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

async function chatStreamWithTools() {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: weatherQuestion, tools: [weatherTool], max_tokens: 24, seed: 11,
    stream: true, stream_options: { include_usage: true },
  });
  const got = checkChatStream(await collect(stream), 'chat stream with tools');
  check(got.usage?.completion_tokens <= 24, 'chat stream: max_tokens honoured', got.usage);
}

async function forcedToolCall() {
  // tool_choice "required": the answer is a call of the one tool with JSON arguments, streamed
  // as OpenAI tool-call deltas and whole.
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: weatherQuestion, tools: [weatherTool], tool_choice: 'required', max_tokens: 96,
    stream: true, stream_options: { include_usage: true },
  });
  const got = checkChatStream(await collect(stream), 'forced tool call stream');
  check(got.finish === 'tool_calls', 'forced tool call stream: finish_reason tool_calls', got.finish);
  check(got.calls.length >= 1 && got.calls[0].name === 'get_weather', 'forced tool call stream: the call', got.calls);
  for (const c of got.calls) {
    check(c.id.length > 0, 'forced tool call stream: the call has an id', c);
    let parsed;
    try { parsed = JSON.parse(c.arguments); } catch { parsed = undefined; }
    check(parsed !== undefined && typeof parsed === 'object', 'forced tool call stream: arguments are JSON', c.arguments);
  }

  const whole = await client.chat.completions.create({
    model: 'tiny', messages: weatherQuestion, tools: [weatherTool], max_tokens: 96,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  check(whole.object === 'chat.completion', 'forced tool call: object', whole.object);
  const choice = whole.choices?.[0];
  check(choice?.finish_reason === 'tool_calls', 'forced tool call: finish_reason', choice?.finish_reason);
  const call = choice?.message?.tool_calls?.[0];
  check(call?.type === 'function' && call?.function?.name === 'get_weather' && call?.id, 'forced tool call: the call', call);
  let args;
  try { args = JSON.parse(call?.function?.arguments ?? ''); } catch { args = undefined; }
  check(args !== undefined, 'forced tool call: arguments parse as JSON', call?.function?.arguments);
  check(whole.usage?.completion_tokens > 0, 'forced tool call: usage', whole.usage);
}

async function chatWithToolsWhole() {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: weatherQuestion, tools: [weatherTool], max_tokens: 16, seed: 5,
  });
  check(r.object === 'chat.completion', 'chat with tools: object', r.object);
  check(r.id?.startsWith('chatcmpl-'), 'chat with tools: id', r.id);
  check(r.model === 'tiny', 'chat with tools: model echoed', r.model);
  const c = r.choices?.[0];
  check(c?.message?.role === 'assistant', 'chat with tools: role', c?.message);
  check(['stop', 'length', 'tool_calls'].includes(c?.finish_reason), 'chat with tools: finish_reason', c?.finish_reason);
  check(typeof c?.message?.content === 'string' || Array.isArray(c?.message?.tool_calls), 'chat with tools: content or calls', c?.message);
  check(r.usage?.completion_tokens > 0 && r.usage.completion_tokens <= 16, 'chat with tools: usage', r.usage);
}

async function completions() {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, echo: true, logprobs: 2, temperature: 0 });
  check(r.object === 'text_completion', 'completions: object', r.object);
  const c = r.choices?.[0];
  check(c?.text?.startsWith('Once upon a time'), 'completions: echo puts the prompt first', c?.text);
  // With echo the prompt's tokens (but the BOS) come first, the first without a logprob.
  check(c?.logprobs?.tokens?.length === r.usage?.prompt_tokens - 1 + r.usage?.completion_tokens, 'completions: one logprob per echoed and generated token', { lp: c?.logprobs, usage: r.usage });
  check(c?.logprobs?.token_logprobs?.[0] === null && c?.logprobs?.top_logprobs?.[0] === null, 'completions: the first echoed token has no logprob', c?.logprobs);
  check(c?.logprobs?.top_logprobs?.slice(1).every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2), 'completions: top_logprobs', c?.logprobs?.top_logprobs);
  check(r.usage?.completion_tokens === 8, 'completions: 8 tokens (greedy, no EOS expected this soon)', r.usage);

  const stream = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
  const chunks = await collect(stream);
  const text = chunks.map((k) => k.choices?.[0]?.text ?? '').join('');
  check(chunks.at(-1)?.choices?.length === 0 && chunks.at(-1)?.usage?.completion_tokens === 8, 'completions stream: usage chunk', chunks.at(-1));
  check(`Once upon a time${text}` === c?.text, 'completions stream: the same greedy text as the whole answer', { text, whole: c?.text });
}

async function models() {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m);
  check(ids.length === 1 && ids[0].id === 'tiny' && ids[0].object === 'model', 'models.list', ids);
}

async function apiErrors() {
  try {
    await client.chat.completions.create({ model: 'tiny', messages: weatherQuestion, max_tokens: -5 });
    check(false, 'a negative max_tokens was accepted');
  } catch (e) {
    check(e instanceof OpenAI.APIError, 'bad request: an APIError', String(e));
    check(e.status === 400, 'bad request: status 400', e.status);
    check(e.type === 'invalid_request_error', 'bad request: type', e.type);
    check(e.param === 'max_tokens', 'bad request: param', e.param);
  }
  // The first error of a stream is an HTTP error too, so the SDK throws at create().
  try {
    const long = 'many words '.repeat(2000);
    await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: long }], stream: true });
    check(false, 'a prompt longer than the context was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'context overflow: BadRequestError', String(e));
    check(/maximum context length/.test(e.message), 'context overflow: the phrase agents look for', e.message);
  }
}

async function abortMidStream() {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: weatherQuestion, max_tokens: 400, stream: true, ignore_eos: true,
  });
  let n = 0;
  for await (const chunk of stream) {
    void chunk;
    if (++n === 3) {
      stream.controller.abort();
      break;
    }
  }
  check(n === 3, 'abort: three chunks were read', n);
  // The server freed the sequence and keeps serving.
  const r = await client.completions.create({ model: 'tiny', prompt: 'Hi', max_tokens: 2 });
  check(r.choices?.length === 1, 'abort: the server still serves', r);
}

const cases = [chatStreamWithTools, forcedToolCall, chatWithToolsWhole, completions, models, apiErrors, abortMidStream];
for (const c of cases) {
  try {
    await c();
  } catch (e) {
    failures++;
    console.error(`FAIL: ${c.name} threw: ${e?.stack ?? e}`);
  }
}
if (failures) {
  console.error(`serve_clients.mjs: ${failures} check(s) failed`);
  process.exit(1);
}
console.log(`serve_clients.mjs: ${cases.length} client cases passed`);
