#!/usr/bin/env python3
"""A bounded load test of the HTTP API (docs/http.md §7, docs/metrics.md §2): STREAMS concurrent
SSE streams against a local 2-worker cluster on the demo model for DURATION seconds, each stream
one completion after another (32 tokens, sampled, end of sequence ignored). Checks:

  - no errors: every request answered 200 and ended with finish_reason "length";
  - the coordinator counted exactly the requests the clients made (strata_requests_total);
  - no leak: the stages' KV pages, running and waiting requests are back to zero at the end, and
    the coordinator's resident memory grew by less than 64 MiB;
  - the metrics agree with the clients: the mean time to first token and the mean inter-token
    latency from the histograms' _sum/_count equal the clients' own measurements within 5 %.

Usage: http_load_test.py BUILD SOURCE [--duration S] [--streams N]
Only loopback traffic; every loop is bounded in time. Prints a summary line and
"N passed, N failed".
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, Cluster, Skip  # noqa: E402


# A prompt of a few hundred tokens, as real requests carry: the time to first token is then mostly
# prefill, and the fixed cost the server cannot see (the client's connection and its own reading,
# about 1-2 ms on a loaded 2-core machine) stays a small part of it.
PROMPT = " ".join([
    "Lists are mutable sequences, typically used to store collections of homogeneous items.",
    "Lists may be constructed in several ways: using a pair of square brackets to denote the empty",
    "list, using square brackets and separating items with commas, using a list comprehension, or",
    "using the type constructor. The constructor builds a list whose items are the same and in the",
    "same order as the items of the iterable. Many other operations also produce lists, including",
    "the sorted built-in. Lists implement all of the common and mutable sequence operations, and",
    "they also provide the following additional method: sort, which sorts the list in place, using",
    "only comparisons between items. Exceptions are not suppressed: if any comparison operations",
    "fail, the entire sort operation will fail and the list will likely be left in a partially",
    "modified state."])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def hist(m, name):
    return m.get((name + "_sum", ""), 0.0), m.get((name + "_count", ""), 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("source")
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    # A client thread whose socket became readable waits for the interpreter lock up to the switch
    # interval (5 ms by default): that wait would count in the clients' times, not the server's.
    sys.setswitchinterval(0.0002)
    try:
        c = Cluster(a.build, os.path.join(a.source, "models", "demo"), workers=2)
    except Skip as e:
        print(f"SKIPPED: {e}")
        return SKIP
    failures = []
    try:
        pid = c.procs[0].pid
        # Warm up (first-use allocations), then take the baseline.
        for _ in range(2):
            c.stream("/v1/completions", {"prompt": "warm up", "max_tokens": a.tokens, "ignore_eos": True})
        m0 = c.metrics()
        rss0 = rss_kib(pid)
        lock = threading.Lock()
        ttfts, itl_sum, itl_n, errors, done = [], [0.0], [0], [], [0]
        stop_at = time.monotonic() + a.duration

        def client(i):
            seed = i * 100000
            while time.monotonic() < stop_at:
                seed += 1
                times = []

                def on_event(ev, t):
                    if ev != "[DONE]" and ev.get("choices") and ev["choices"][0].get("text"):
                        times.append(t)
                body = {"prompt": f"{PROMPT} {i}", "max_tokens": a.tokens, "ignore_eos": True,
                        "temperature": 0.8, "seed": seed}
                try:
                    status, events, raw = c.stream("/v1/completions", body, on_event=on_event)
                except Exception as e:  # noqa: BLE001 — every failure is counted
                    with lock:
                        errors.append(repr(e))
                    continue
                fin = events[-2] if status == 200 and len(events) >= 2 else None
                ok = (status == 200 and events[-1] == "[DONE]" and fin is not None
                      and fin["choices"][0]["finish_reason"] == "length"
                      and fin["usage"]["completion_tokens"] == a.tokens and len(times) >= 2)
                with lock:
                    if not ok:
                        errors.append(f"status {status}: {raw[-300:]}")
                        continue
                    done[0] += 1
                    ttfts.append(times[0])
                    # Tokens whose text came in one event count as one interval: use the span.
                    itl_sum[0] += times[-1] - times[0]
                    itl_n[0] += a.tokens - 1
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=a.duration + 120)
        if any(t.is_alive() for t in threads):
            failures.append("a client thread did not finish")
        time.sleep(0.5)
        m1 = c.metrics()
        rss1 = rss_kib(pid)

        def delta(name, labels=""):
            return m1.get((name, labels), 0.0) - m0.get((name, labels), 0.0)
        if errors:
            failures.append(f"{len(errors)} requests failed, e.g. {errors[0]}")
        counted = delta("strata_requests_total", '{finish_reason="length"}')
        if counted != done[0]:
            failures.append(f"the coordinator counted {counted:.0f} requests ending by length, the clients {done[0]}")
        other = sum(delta("strata_requests_total", f'{{finish_reason="{r}"}}') for r in ("abort", "error", "stop", "eos"))
        if other:
            failures.append(f"{other:.0f} requests ended otherwise than by length")
        pages = sum(v for (n, _), v in m1.items() if n == "strata_stage_kv_pages_used")
        if pages != 0:
            failures.append(f"{pages:.0f} KV pages still held at the end")
        for g in ("strata_requests_running", "strata_requests_waiting"):
            if m1.get((g, ""), -1) != 0:
                failures.append(f"{g} is {m1.get((g, ''))} at the end")
        if rss1 - rss0 > 64 * 1024:
            failures.append(f"the coordinator's memory grew by {(rss1 - rss0) / 1024:.1f} MiB")
        s0, n0 = hist(m0, "strata_time_to_first_token_seconds")
        s1, n1 = hist(m1, "strata_time_to_first_token_seconds")
        i0, k0 = hist(m0, "strata_inter_token_latency_seconds")
        i1, k1 = hist(m1, "strata_inter_token_latency_seconds")
        h0 = m0.get(("strata_http_time_to_first_token_seconds_sum", '{path="/v1/completions"}'), 0.0)
        h1 = m1.get(("strata_http_time_to_first_token_seconds_sum", '{path="/v1/completions"}'), 0.0)
        c0 = m0.get(("strata_http_time_to_first_token_seconds_count", '{path="/v1/completions"}'), 0.0)
        c1 = m1.get(("strata_http_time_to_first_token_seconds_count", '{path="/v1/completions"}'), 0.0)
        sched_ttft = (s1 - s0) / max(1, n1 - n0)
        server_ttft = (h1 - h0) / max(1, c1 - c0)
        server_itl = (i1 - i0) / max(1, k1 - k0)
        client_ttft = sum(ttfts) / max(1, len(ttfts))
        client_itl = itl_sum[0] / max(1, itl_n[0])
        print(f"load: {a.streams} streams, {a.duration:.0f} s, {done[0]} requests, {len(errors)} errors, "
              f"{done[0] * a.tokens / a.duration:.0f} tokens/s; TTFT client {client_ttft * 1e3:.2f} ms, "
              f"metrics {server_ttft * 1e3:.2f} ms (HTTP), {sched_ttft * 1e3:.2f} ms (scheduler); ITL client {client_itl * 1e3:.3f} ms, metrics "
              f"{server_itl * 1e3:.3f} ms; coordinator RSS {rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB")
        if done[0] == 0:
            failures.append("no request completed")
        for what, client_v, server_v in (("TTFT", client_ttft, server_ttft), ("ITL", client_itl, server_itl)):
            if client_v > 0 and abs(server_v - client_v) > 0.05 * client_v:
                failures.append(f"mean {what} from the metrics {server_v * 1e3:.3f} ms is not within 5 % of the "
                                f"clients' {client_v * 1e3:.3f} ms")
    finally:
        c.stop()
        c.cleanup(keep=bool(failures))
    for f in failures:
        print("FAIL", f)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
