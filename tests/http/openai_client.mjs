// The `openai` npm package against Strata's HTTP API (tests/http/http_e2e_test.py, docs/http.md §7):
// streams a chat completion and a completion with a seed and prints their text as JSON, with the
// model list and the status codes of a bad key and of n = 2.
//
// Usage: node openai_client.mjs '{"base_url", "api_key", "model", "messages", "prompt",
//                                 "max_tokens", "temperature", "seed"}'
import OpenAI from "openai";

const req = JSON.parse(process.argv[2]);
const client = new OpenAI({ baseURL: req.base_url, apiKey: req.api_key, maxRetries: 0 });
const params = { model: req.model, max_tokens: req.max_tokens, temperature: req.temperature, seed: req.seed };

const out = { chat: "", completion: "", usage: null, models: [], chunks: 0 };
const chat = await client.chat.completions.create({
  ...params, messages: req.messages, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of chat) {
  out.chunks += 1;
  if (chunk.usage) out.usage = chunk.usage;
  for (const c of chunk.choices) out.chat += c.delta?.content ?? "";
}
const cmpl = await client.completions.create({ ...params, prompt: req.prompt, stream: true });
for await (const chunk of cmpl) {
  for (const c of chunk.choices) out.completion += c.text ?? "";
}
for await (const m of client.models.list()) out.models.push(m.id);

async function statusOf(promise) {
  try {
    await promise;
    return 200;
  } catch (e) {
    return e.status ?? -1;
  }
}
const bad = new OpenAI({ baseURL: req.base_url, apiKey: "not-a-valid-token-123456", maxRetries: 0 });
out.bad_key_status = await statusOf(bad.models.list());
out.n2_status = await statusOf(client.chat.completions.create({ ...params, messages: req.messages, n: 2 }));
console.log(JSON.stringify(out));
