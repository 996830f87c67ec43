// The official openai npm client against prefixd proxy: run by
// TestOpenAINpmClient (internal/proxy), which starts the proxy and sets
// OPENAI_BASE_URL and MODEL. Each check prints one line, "ok <name> …";
// a failed check prints "FAIL <name>: …" and exits 1.
import OpenAI from 'openai';

const model = process.env.MODEL;
const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: 'none', timeout: 20000 });
const messages = [{ role: 'user', content: 'hello from the openai npm client' }];
let failed = false;

async function check(name, fn) {
  try {
    console.log(`ok ${name} ${await fn()}`);
  } catch (err) {
    failed = true;
    console.log(`FAIL ${name}: ${err && err.constructor && err.constructor.name} ${err && err.status} ${err && err.message}`);
  }
}

function must(cond, what) {
  if (!cond) throw new Error(what);
}

// An error the SDK must throw, as its class.
async function mustThrow(fn, cls, status) {
  try {
    await fn();
  } catch (err) {
    must(err instanceof cls, `threw ${err.constructor.name} (${err.status}: ${err.message}), want ${cls.name}`);
    must(err.status === status, `status ${err.status}, want ${status}`);
    return `${err.constructor.name} ${err.status} ${JSON.stringify(err.error)}`;
  }
  throw new Error(`no error, want ${cls.name}`);
}

await check('chat', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4 });
  must(r.object === 'chat.completion' && r.choices[0].message.content.length > 0, JSON.stringify(r));
  return JSON.stringify(r.usage);
});

await check('chat_stream', async () => {
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 4, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let usage = null;
  for await (const chunk of stream) {
    must(chunk.object === 'chat.completion.chunk', JSON.stringify(chunk));
    for (const c of chunk.choices) content += c.delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  must(content.length > 0 && usage && usage.completion_tokens === 4, `content ${JSON.stringify(content)} usage ${JSON.stringify(usage)}`);
  return JSON.stringify(usage);
});

await check('completions', async () => {
  const r = await client.completions.create({ model, prompt: 'hello from the openai npm client', max_tokens: 4 });
  must(r.object === 'text_completion' && r.choices[0].text.length > 0, JSON.stringify(r));
  return JSON.stringify(r.usage);
});

await check('completions_stream', async () => {
  const stream = await client.completions.create({ model, prompt: 'hello again from the openai npm client', max_tokens: 4, stream: true });
  let text = '';
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    for (const c of chunk.choices) text += c.text ?? '';
  }
  must(chunks > 1 && text.length > 0, `${chunks} chunks, text ${JSON.stringify(text)}`);
  return `${chunks} chunks`;
});

// An engine's 400 (it serves n = 1 only): BadRequestError, not retried.
await check('bad_request', () =>
  mustThrow(() => client.chat.completions.create({ model, messages, max_tokens: 4, n: 2 }), OpenAI.BadRequestError, 400));

// A model no engine serves: NotFoundError, not retried.
await check('not_found', () =>
  mustThrow(() => client.chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 4 }), OpenAI.NotFoundError, 404));

process.exit(failed ? 1 : 0);
