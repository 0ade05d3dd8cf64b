// The official OpenAI Node SDK against a running `moestream serve`, for schema-following output
// and the serving fixes: response_format json_schema (the SDK's structured-output request), a
// forced call whose arguments follow their schema, strict tools refused when the schema cannot be
// enforced, models.retrieve, completions with max_tokens 0 and echo + logprobs. The values are
// checked here field by field (not with the server's code).
// Usage: node schema_clients.mjs http://127.0.0.1:PORT  (openai resolved from $MOESTREAM_NODE_DIR).
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
  console.error('usage: node schema_clients.mjs http://HOST:PORT');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-checked', maxRetries: 0, timeout: 120_000 });

let failures = 0;
function check(cond, what, detail) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}${detail === undefined ? '' : `: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`}`);
  }
}
const codePoints = (s) => [...s].length;

const todoSchema = {
  type: 'object',
  properties: {
    todos: {
      type: 'array',
      items: {
        type: 'object',
        properties: {
          content: { type: 'string', minLength: 1 },
          status: { type: 'string', enum: ['pending', 'in_progress', 'completed'] },
          activeForm: { type: 'string', minLength: 1 },
        },
        required: ['content', 'status', 'activeForm'],
        additionalProperties: false,
      },
    },
  },
  required: ['todos'],
  additionalProperties: false,
};

// The TodoWrite schema, checked by hand.
function checkTodos(value, label) {
  check(value && typeof value === 'object' && !Array.isArray(value), `${label}: an object`, value);
  check(Object.keys(value).join() === 'todos' && Array.isArray(value.todos), `${label}: exactly "todos", an array`, value);
  for (const t of value.todos ?? []) {
    check(Object.keys(t).sort().join() === 'activeForm,content,status', `${label}: item keys`, t);
    check(typeof t.content === 'string' && codePoints(t.content) >= 1, `${label}: content`, t);
    check(['pending', 'in_progress', 'completed'].includes(t.status), `${label}: status`, t);
    check(typeof t.activeForm === 'string' && codePoints(t.activeForm) >= 1, `${label}: activeForm`, t);
  }
}

async function structuredOutput() {
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'Plan the work.' }],
      max_tokens: 300,
      seed,
      response_format: { type: 'json_schema', json_schema: { name: 'todos', strict: true, schema: todoSchema } },
    });
    const c = r.choices?.[0];
    check(c?.finish_reason === 'stop', 'json_schema: finish_reason stop', c?.finish_reason);
    let value;
    try {
      value = JSON.parse(c?.message?.content);
    } catch (e) {
      check(false, 'json_schema: the content parses', c?.message?.content);
      continue;
    }
    checkTodos(value, `json_schema seed ${seed}`);
  }
}

async function forcedCall() {
  const weather = {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { enum: ['c', 'f'] } }, required: ['city'] },
    },
  };
  for (const seed of [3, 4]) {
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
      max_tokens: 100,
      seed,
      tools: [weather],
      tool_choice: 'required',
    });
    const call = r.choices?.[0]?.message?.tool_calls?.[0];
    check(r.choices?.[0]?.finish_reason === 'tool_calls', 'forced call: finish_reason', r.choices?.[0]);
    let args;
    try {
      args = JSON.parse(call?.function?.arguments);
    } catch (e) {
      check(false, 'forced call: arguments parse', call);
      continue;
    }
    check(typeof args.city === 'string', 'forced call: the required city is there', args);
    check(Object.keys(args).every((k) => k === 'city' || k === 'unit'), 'forced call: no invented keys', args);
    check(args.unit === undefined || ['c', 'f'].includes(args.unit), 'forced call: unit in its enum', args);
  }
  try {
    await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'x' }],
      tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', properties: { a: { type: 'string', pattern: '^x' } } } } }],
      tool_choice: 'required',
    });
    check(false, 'a strict tool with pattern was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, 'strict pattern: BadRequestError', String(e));
    check(e.param === 'tools[0].function.parameters.properties.a.pattern', 'strict pattern: param names the keyword', e.param);
  }
}

async function models() {
  const m = await client.models.retrieve('tiny');
  check(m.id === 'tiny' && m.object === 'model' && typeof m.created === 'number', 'models.retrieve', m);
  try {
    await client.models.retrieve('gpt-4o');
    check(false, 'models.retrieve of an unknown id succeeded');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError, 'models.retrieve unknown: NotFoundError', String(e));
  }
}

async function scoring() {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 0, echo: true, logprobs: 2 });
  const c = r.choices?.[0];
  check(c?.text === 'Once upon a time', 'max_tokens 0 + echo: the text is the prompt', c?.text);
  check(c?.finish_reason === 'length', 'max_tokens 0: finish_reason length', c?.finish_reason);
  check(r.usage?.completion_tokens === 0 && r.usage?.prompt_tokens > 1, 'max_tokens 0: usage', r.usage);
  const lp = c?.logprobs;
  const n = lp?.tokens?.length ?? 0;
  check(n === r.usage.prompt_tokens - 1, 'echo: one entry per prompt token but the BOS', { n, usage: r.usage });
  check(lp?.tokens?.join('') === 'Once upon a time', 'echo: the tokens spell the prompt', lp?.tokens);
  check(lp?.token_logprobs?.[0] === null && lp?.top_logprobs?.[0] === null, 'echo: the first token has no logprob', lp);
  check(lp?.token_logprobs?.slice(1).every((x) => typeof x === 'number' && x <= 0), 'echo: logprobs of the rest', lp?.token_logprobs);
  check(lp?.top_logprobs?.slice(1).every((t) => Object.keys(t).length === 2), 'echo: top_logprobs', lp?.top_logprobs);
  check(lp?.text_offset?.[0] === 0 && lp.text_offset.every((o, i) => i === 0 || o > lp.text_offset[i - 1]), 'echo: text_offset', lp?.text_offset);
  const chat = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 0 });
  check(chat.choices?.[0]?.finish_reason === 'length' && chat.usage?.completion_tokens === 0, 'chat max_completion_tokens 0', chat);
}

for (const t of [structuredOutput, forcedCall, models, scoring]) {
  try {
    await t();
  } catch (e) {
    failures++;
    console.error(`FAIL: ${t.name} threw: ${e?.stack ?? e}`);
  }
}
if (failures) {
  console.error(`schema_clients: ${failures} failure(s)`);
  process.exit(1);
}
console.log('schema_clients: ok');
