#!/usr/bin/env python3
"""The coordinator's OpenAI-compatible HTTP API against a local cluster on the demo model, with
real clients (docs/http.md §7). One CTest entry per client:

  http_e2e_test.py urllib BUILD SOURCE   Python's standard library: every endpoint, text equal to
                                         the gRPC path's for the same seed, streaming, logprobs,
                                         sessions, errors, disconnects freeing the KV pages
  http_e2e_test.py curl BUILD SOURCE     curl over TLS with an API token
  http_e2e_test.py openai BUILD SOURCE   the `openai` npm package streaming (Node), TLS and a token

Exit 0 when every case passed, 1 when one failed, 77 (skipped) when a tool is missing: curl, node
and npm, or the openai package (installed by tests/http/install_openai.sh into BUILD/http-tools).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, Cluster, Skip  # noqa: E402

PROMPT = "The list type"
CHAT = [{"role": "system", "content": "You answer questions about Python."},
        {"role": "user", "content": "What is a dictionary?"}]
TOKEN = "0123456789abcdef-http-tester"


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def stream_text(events, chat):
    parts = []
    for ev in events:
        if ev == "[DONE]" or not ev.get("choices"):
            continue
        c = ev["choices"][0]
        parts.append(c.get("delta", {}).get("content", "") if chat else c.get("text", ""))
    return "".join(p or "" for p in parts)


def kv_pages(cluster):
    m = cluster.metrics()
    return sum(v for (n, _), v in m.items() if n == "strata_stage_kv_pages_used")


def wait_kv_free(cluster, baseline=0, timeout=15):
    """The KV pages the stages hold once they are back to `baseline` (or after `timeout` s)."""
    deadline = time.time() + timeout
    pages = kv_pages(cluster)
    while pages != baseline and time.time() < deadline:
        time.sleep(0.2)
        pages = kv_pages(cluster)
    return pages


# ---------------------------------------------------------------- urllib (Python's standard library)

def test_health_and_models(c):
    for path in ("/health", "/v1/health"):
        status, _, body = c.request("GET", path, token=False)
        check(status == 200 and body == {"status": "ok"}, f"{path}: {status} {body}")
    status, _, body = c.request("GET", "/v1/models")
    check(status == 200 and body["object"] == "list" and body["data"][0]["id"] == "demo", body)
    check(c.request("GET", "/v1/models/demo")[0] == 200, "/v1/models/demo")
    status, _, body = c.request("GET", "/v1/models/gpt-4")
    check(status == 404 and body["error"]["code"] == "model_not_found", body)


def test_completion_equals_grpc(c):
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": 24, "temperature": 0.8, "top_k": 40, "seed": 1234}
    status, _, r = c.request("POST", "/v1/completions", body)
    check(status == 200, r)
    check(r["object"] == "text_completion" and r["id"].startswith("cmpl-"), r)
    check(r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 24, r)
    check(r["strata"]["seed"] == 1234, r)
    g = c.grpc_generate("--prompt", PROMPT, "--max-tokens", "24", "--temperature", "0.8", "--top-k", "40",
                        "--seed", "1234")
    check(r["choices"][0]["text"] == g["text"], f"HTTP {r['choices'][0]['text']!r} != gRPC {g['text']!r}")
    check(r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 24, r["usage"])
    # Streamed: the same text, usage on the finishing chunk, [DONE] last.
    status, events, raw = c.stream("/v1/completions", body)
    check(status == 200 and events[-1] == "[DONE]", raw)
    check(stream_text(events, False) == g["text"], f"stream {stream_text(events, False)!r} != {g['text']!r}")
    fin = events[-2]
    check(fin["choices"][0]["finish_reason"] == "length" and fin["usage"]["completion_tokens"] == 24, fin)


def test_chat_equals_grpc(c):
    body = {"messages": CHAT, "max_completion_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 99}
    status, _, r = c.request("POST", "/v1/chat/completions", body)
    check(status == 200 and r["object"] == "chat.completion", r)
    msg = r["choices"][0]["message"]
    check(msg["role"] == "assistant", msg)
    g = c.grpc_generate("--system", CHAT[0]["content"], "--chat", CHAT[1]["content"], "--max-tokens", "20",
                        "--temperature", "0.7", "--top-p", "0.9", "--seed", "99")
    check(msg["content"] == g["text"], f"HTTP {msg['content']!r} != gRPC {g['text']!r}")
    status, events, raw = c.stream("/v1/chat/completions", dict(body, stream_options={"include_usage": True}))
    check(status == 200, raw)
    check(events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, events[0])
    check(stream_text(events, True) == g["text"], f"stream {stream_text(events, True)!r}")
    usage = events[-2]
    check(usage["choices"] == [] and usage["usage"]["completion_tokens"] == r["usage"]["completion_tokens"], usage)
    check(all(ev["usage"] is None for ev in events[:-2]), "include_usage: null usage before the last chunk")


def test_greedy_stop_and_logprobs(c):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    _, _, full = c.request("POST", "/v1/completions", body)
    text = full["choices"][0]["text"]
    words = text.split()
    check(len(words) >= 3, f"greedy text too short to test stop: {text!r}")
    stop = words[2]
    _, _, cut = c.request("POST", "/v1/completions", dict(body, stop=[stop]))
    check(cut["choices"][0]["finish_reason"] == "stop", cut)
    check(cut["choices"][0]["text"] == text[:text.index(stop)], f"{cut['choices'][0]['text']!r} vs {text!r}")
    # Chat logprobs: one entry per token, 3 alternatives, the greedy token first among them.
    status, _, r = c.request("POST", "/v1/chat/completions",
                             {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True,
                              "top_logprobs": 3})
    check(status == 200, r)
    content = r["choices"][0]["logprobs"]["content"]
    check(len(content) == r["usage"]["completion_tokens"], r)
    for e in content:
        check(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3, e)
        check(abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6, e)
        check(isinstance(e["bytes"], list), e)
    status, _, r = c.request("POST", "/v1/completions", dict(body, logprobs=2, max_tokens=4))
    lp = r["choices"][0]["logprobs"]
    check(status == 200 and len(lp["tokens"]) == 4 and len(lp["top_logprobs"][0]) <= 2, lp)


def test_tokenize_roundtrip(c):
    status, _, t = c.request("POST", "/tokenize", {"prompt": PROMPT})
    check(status == 200 and t["count"] == len(t["tokens"]) > 0, t)
    status, _, d = c.request("POST", "/detokenize", {"tokens": t["tokens"]})
    check(status == 200 and d["prompt"].endswith(PROMPT), d)
    status, _, m = c.request("POST", "/tokenize", {"messages": CHAT})
    check(status == 200 and m["count"] > t["count"], m)
    # Token ids as a prompt give the same text as the string.
    _, _, a = c.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    _, _, b = c.request("POST", "/v1/completions", {"prompt": t["tokens"], "max_tokens": 8, "temperature": 0})
    check(a["choices"][0]["text"] == b["choices"][0]["text"], (a, b))
    status, _, e = c.request("POST", "/detokenize", {"tokens": [10 ** 8]})
    check(status == 400 and e["error"]["param"] == "tokens", e)


def test_sessions(c):
    sid = "http-session-1"
    turn1 = {"messages": [CHAT[1]], "max_tokens": 8, "temperature": 0, "session_id": sid}
    status, _, r1 = c.request("POST", "/v1/chat/completions", turn1)
    check(status == 200 and r1["strata"]["session_id"] == sid, r1)
    held = r1["strata"]["session_tokens"]
    turn2 = {"messages": [{"role": "user", "content": "And a list?"}], "max_tokens": 8, "temperature": 0,
             "session_id": sid, "stream": True}
    status, events, raw = c.stream("/v1/chat/completions", turn2)
    check(status == 200, raw)
    fin = events[-2]
    check(fin["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, fin)
    check(fin["strata"]["session_tokens"] > held, fin)


def test_errors(c):
    cases = [
        ("POST", "/v1/completions", b"{not json", 400, None),
        ("POST", "/v1/completions", b"[1, 2]", 400, None),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400, "max_tokens"),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "top_p": 7}).encode(), 400, "top_p"),
        ("POST", "/v1/completions", json.dumps({"prompt": ""}).encode(), 400, None),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "tool", "content": "x"}]}).encode(), 400,
         None),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [], "stream": True}).encode(), 400, "messages"),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "model": "other"}).encode(), 404, "model"),
        ("GET", "/v2/anything", None, 404, None),
        ("POST", "/v1/completions", b"[" * 100000, 400, None),
        ("POST", "/v1/completions", b"{\"prompt\": \"" + b"a" * (17 << 20) + b"\"}", 413, None),
    ]
    for method, path, raw, want, param in cases:
        status, _, body = c.request(method, path, raw=raw)
        check(status == want, f"{path} {raw[:40] if raw else ''}: {status} {body}")
        e = body["error"]
        check(set(e) == {"message", "type", "param", "code"} and e["message"], body)
        if param:
            check(e["param"] == param, body)
    # The server is still serving.
    check(c.request("GET", "/health", token=False)[0] == 200, "health after bad input")


def test_disconnect_frees_kv(c):
    before = c.metrics().get(("strata_requests_total", '{finish_reason="abort"}'), 0)
    baseline = kv_pages(c)  # the resident sessions of earlier cases keep theirs
    body = {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True}
    host, port = c.http.rsplit(":", 1)
    for stream in (True, False):
        s = socket.create_connection((host, int(port)))
        payload = json.dumps(dict(body, stream=stream)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        if stream:
            got, deadline = b"", time.time() + 10
            while b"data: " not in got and time.time() < deadline:
                got += s.recv(4096)
            check(b"data: " in got, f"no first event: {got[:200]!r}")
        else:
            time.sleep(0.3)
        s.close()
    pages = wait_kv_free(c, baseline)
    check(pages == baseline, f"{pages} KV pages held after the clients went away, {baseline} before")
    after = c.metrics().get(("strata_requests_total", '{finish_reason="abort"}'), 0)
    check(after - before == 2, f"aborts counted: {after - before}")
    check(c.metrics()[("strata_requests_running", "")] == 0, "requests still running")


def test_concurrent_streams_match(c):
    bodies = [{"prompt": f"{PROMPT} {i}", "max_tokens": 12, "temperature": 0.9, "seed": i} for i in range(8)]
    alone = [c.request("POST", "/v1/completions", b)[2]["choices"][0]["text"] for b in bodies]
    together = [None] * len(bodies)

    def run(i):
        together[i] = stream_text(c.stream("/v1/completions", bodies[i])[1], False)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(alone == together, f"batched text differs: {alone} vs {together}")


# ---------------------------------------------------------------- curl over TLS with a token

def curl(c, *args, token=True):
    cmd = ["curl", "-sS", "--cacert", c.ca, "-w", "\n%{http_code}", *args]
    if token:
        cmd += ["-H", f"Authorization: Bearer {c.token}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    body, _, code = r.stdout.rpartition("\n")
    return int(code or 0), body


def test_curl_auth(c):
    url = c.base + "/v1/models"
    code, body = curl(c, url, token=False)
    check(code == 401 and json.loads(body)["error"]["type"] == "authentication_error", body)
    code, body = curl(c, "-H", "Authorization: Bearer wrong-token-0000000000", url, token=False)
    check(code == 401, body)
    code, body = curl(c, url)
    check(code == 200 and json.loads(body)["data"][0]["id"] == "demo", body)
    code, body = curl(c, c.base + "/health", token=False)
    check(code == 200, body)
    # Plaintext never reaches the TLS port.
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                        "http://" + c.http + "/health"], capture_output=True, text=True)
    check(r.stdout.strip() in ("000", "400"), f"plaintext answered {r.stdout}")


def test_curl_stream_equals_grpc(c):
    body = {"messages": CHAT, "max_tokens": 16, "temperature": 0.6, "seed": 7, "stream": True}
    code, out = curl(c, "-N", "-H", "Content-Type: application/json", "-d", json.dumps(body),
                     c.base + "/v1/chat/completions")
    check(code == 200, out)
    events = [e[len("data: "):] for e in out.split("\n\n") if e.startswith("data: ")]
    check(events[-1] == "[DONE]", out[-200:])
    text = stream_text([json.loads(e) for e in events[:-1]], True)
    g = c.grpc_generate("--system", CHAT[0]["content"], "--chat", CHAT[1]["content"], "--max-tokens", "16",
                        "--temperature", "0.6", "--seed", "7")
    check(text == g["text"], f"curl {text!r} != gRPC {g['text']!r}")
    code, out = curl(c, "-H", "Content-Type: application/json", "-d", json.dumps(dict(body, stream=False)),
                     c.base + "/v1/chat/completions")
    check(code == 200 and json.loads(out)["choices"][0]["message"]["content"] == g["text"], out)


# ---------------------------------------------------------------- the openai npm package

def test_openai_stream_equals_grpc(c, source, build):
    tools = os.path.join(build, "http-tools")
    r = subprocess.run(["bash", os.path.join(source, "tests", "http", "install_openai.sh"), tools],
                       capture_output=True, text=True, timeout=600)
    if r.returncode == SKIP:
        raise Skip(r.stdout.strip() or r.stderr.strip())
    check(r.returncode == 0, f"install_openai.sh: {r.stdout}{r.stderr}")
    env = dict(os.environ, NODE_PATH=os.path.join(tools, "node_modules"), NODE_EXTRA_CA_CERTS=c.ca)
    script = os.path.join(source, "tests", "http", "openai_client.mjs")
    shutil.copy(script, os.path.join(tools, "openai_client.mjs"))  # resolves `openai` from tools/node_modules
    req = {"base_url": c.base + "/v1", "api_key": c.token, "model": "demo", "messages": CHAT, "prompt": PROMPT,
           "max_tokens": 16, "temperature": 0.8, "seed": 4242}
    r = subprocess.run(["node", os.path.join(tools, "openai_client.mjs"), json.dumps(req)], capture_output=True,
                       text=True, timeout=120, env=env)
    check(r.returncode == 0, f"openai_client.mjs: {r.stdout}{r.stderr}")
    out = json.loads(r.stdout)
    g_chat = c.grpc_generate("--system", CHAT[0]["content"], "--chat", CHAT[1]["content"], "--max-tokens", "16",
                             "--temperature", "0.8", "--seed", "4242")
    g_cmpl = c.grpc_generate("--prompt", PROMPT, "--max-tokens", "16", "--temperature", "0.8", "--seed", "4242")
    check(out["chat"] == g_chat["text"], f"openai chat {out['chat']!r} != gRPC {g_chat['text']!r}")
    check(out["completion"] == g_cmpl["text"], f"openai completion {out['completion']!r} != {g_cmpl['text']!r}")
    check(out["usage"]["completion_tokens"] == 16, out)
    check(out["models"] == ["demo"], out)
    check(out["bad_key_status"] == 401, out)
    check(out["n2_status"] == 400, out)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("urllib", "curl", "openai"):
        print(__doc__)
        return 2
    mode, build, source = sys.argv[1], sys.argv[2], sys.argv[3]
    model = os.path.join(source, "models", "demo")
    try:
        if mode == "curl" and shutil.which("curl") is None:
            raise Skip("curl is not installed")
        if mode == "openai" and (shutil.which("node") is None or shutil.which("npm") is None):
            raise Skip("node or npm is not installed")
        if mode == "urllib":
            cluster = Cluster(build, model, workers=2)
            tests = [test_health_and_models, test_completion_equals_grpc, test_chat_equals_grpc,
                     test_greedy_stop_and_logprobs, test_tokenize_roundtrip, test_sessions, test_errors,
                     test_disconnect_frees_kv, test_concurrent_streams_match]
        elif mode == "curl":
            cluster = Cluster(build, model, workers=1, tls=True, token=TOKEN)
            tests = [test_curl_auth, test_curl_stream_equals_grpc]
        else:
            cluster = Cluster(build, model, workers=1, tls=True, token=TOKEN)
            def test_openai(c):
                test_openai_stream_equals_grpc(c, source, build)
            tests = [test_openai]
    except Skip as e:
        print(f"SKIPPED: {e}")
        return SKIP
    passed = failed = 0
    try:
        for t in tests:
            name = getattr(t, "__name__", "test")
            t0 = time.time()
            try:
                t(cluster)
                passed += 1
                print(f"ok   {name} ({time.time() - t0:.1f} s)")
            except Skip as e:
                print(f"SKIPPED: {e}")
                return SKIP
            except Exception:  # noqa: BLE001 — report every case
                failed += 1
                print(f"FAIL {name}\n{traceback.format_exc()}")
    finally:
        cluster.stop()
        cluster.cleanup(keep=failed > 0)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
