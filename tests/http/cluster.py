"""A local Strata cluster for the HTTP API's end-to-end tests (docs/http.md §7).

Starts strata-coordinator with --http-listen and --metrics-listen on loopback and N strata-worker
processes from the build tree, optionally with TLS and API tokens on the public ports (certificates
made with the openssl command), and gives HTTP helpers built on Python's standard library only.
Everything it starts is stopped by stop() (SIGTERM, then SIGKILL after 5 s).
"""
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


class Skip(Exception):
    """A tool the test needs is missing: the test reports itself skipped."""


def make_certs(folder):
    """A CA and a leaf for 127.0.0.1/localhost signed by it; returns (ca, cert, key) paths."""
    if shutil.which("openssl") is None:
        raise Skip("openssl is not installed")
    with open(os.path.join(folder, "leaf.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
                "basicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    cmds = [["openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem"],
            ["openssl", "req", *ec, "-subj", "/CN=leaf", "-keyout", "leaf.key", "-out", "leaf.csr"],
            ["openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "leaf.ext", "-out", "leaf.pem"]]
    for c in cmds:
        subprocess.run(c, cwd=folder, check=True, capture_output=True)
    return tuple(os.path.join(folder, n) for n in ("ca.pem", "leaf.pem", "leaf.key"))


class Cluster:
    def __init__(self, build, model, workers=1, tls=False, token=None, coordinator_flags=()):
        self.build = build
        self.model = model
        self.dir = tempfile.mkdtemp(prefix="strata_http_")
        self.procs = []
        self.token = token
        self.ca = None
        self.context = None
        args = [os.path.join(build, "coordinator", "strata-coordinator"), "--model", model,
                "--listen", "127.0.0.1:0", "--internal-listen", "127.0.0.1:0", "--workers", str(workers),
                "--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--insecure-cluster",
                *coordinator_flags]
        if tls:
            self.ca, cert, key = make_certs(self.dir)
            self.context = ssl.create_default_context(cafile=self.ca)
            args += ["--tls-cert", cert, "--tls-key", key]
        else:
            args += ["--insecure-public"]
        if token:
            path = os.path.join(self.dir, "tokens")
            with open(path, "w") as f:
                f.write(f"tester:{token}\n")
            args += ["--api-tokens", path]
        else:
            args += ["--allow-unauthenticated"]
        out = os.path.join(self.dir, "coordinator.out")
        self._spawn(args, out, os.path.join(self.dir, "coordinator.err"))
        lines = self._wait_lines(out, ("internal", "http", "metrics", "listening"))
        self.internal, self.http, self.metrics_address, self.grpc = (
            lines["internal"], lines["http"], lines["metrics"], lines["listening"])
        for i in range(workers):
            self._spawn([os.path.join(build, "worker", "strata-worker"), "--coordinator", self.internal,
                         "--name", f"w{i}", "--threads", "1", "--model-root", model, "--insecure-cluster"],
                        os.path.join(self.dir, f"w{i}.log"), os.path.join(self.dir, f"w{i}.log"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.request("GET", "/health", token=False)[0] == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the cluster did not become ready; logs in {self.dir}")

    def _spawn(self, args, out, err):
        with open(out, "wb") as o, open(err, "ab") as e:
            self.procs.append(subprocess.Popen(args, stdout=o, stderr=e, stdin=subprocess.DEVNULL))

    def _wait_lines(self, path, keys):
        deadline = time.time() + 30
        found = {}
        while time.time() < deadline and len(found) < len(keys):
            with open(path) as f:
                for line in f:
                    k, _, v = line.strip().partition(" ")
                    if k in keys:
                        found[k] = v
            if self.procs[0].poll() is not None:
                break
            time.sleep(0.02)
        if len(found) < len(keys):
            self.stop()
            raise RuntimeError(f"strata-coordinator did not print {keys}; logs in {self.dir}")
        return found

    @property
    def base(self):
        return ("https://" if self.context else "http://") + self.http

    def headers(self, token=True):
        h = {"Content-Type": "application/json"}
        if token is True and self.token:
            h["Authorization"] = "Bearer " + self.token
        elif isinstance(token, str):
            h["Authorization"] = "Bearer " + token
        return h

    def request(self, method, path, body=None, token=True, raw=None, timeout=60):
        """(status, headers, parsed JSON or text) of one request."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers(token))
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as r:
                status, hdrs, payload = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, payload = e.code, dict(e.headers), e.read()
        text = payload.decode("utf-8", "replace")
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def stream(self, path, body, token=True, on_event=None):
        """The SSE events of a streaming request, as (status, [parsed JSON or '[DONE]'], raw text).
        on_event(event, t) is called as each one arrives (t: seconds since the request was sent)."""
        body = dict(body, stream=True)
        host, port = self.http.rsplit(":", 1)
        conn = (http.client.HTTPSConnection(host, int(port), context=self.context, timeout=120) if self.context
                else http.client.HTTPConnection(host, int(port), timeout=120))
        conn.connect()  # time from the request sent, as the server's metrics count
        t0 = time.monotonic()
        conn.request("POST", path, body=json.dumps(body), headers=self.headers(token))
        resp = conn.getresponse()
        if resp.status != 200:
            payload = resp.read().decode()
            conn.close()
            return resp.status, [json.loads(payload)], payload
        assert resp.getheader("Content-Type", "").startswith("text/event-stream"), resp.getheader("Content-Type")
        events, raw, buf = [], [], b""
        while True:
            line = resp.readline()
            if not line:
                break
            raw.append(line.decode())
            buf += line
            if line != b"\n":
                continue
            block, buf = buf.decode(), b""
            if block.startswith(":"):
                continue
            assert block.startswith("data: ") and block.endswith("\n\n"), repr(block)
            payload = block[len("data: "):-2]
            ev = payload if payload == "[DONE]" else json.loads(payload)
            events.append(ev)
            if on_event:
                on_event(ev, time.monotonic() - t0)
            if ev == "[DONE]":
                break
        conn.close()
        return 200, events, "".join(raw)

    def metrics(self):
        """{(name, labels): value} from the metrics port."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            out[(name, "{" + labels if labels else "")] = float(value)
        return out

    def grpc_generate(self, *args):
        """`strata generate --server` (the gRPC path) with --json: its JSON object."""
        cmd = [os.path.join(self.build, "cli", "strata"), "generate", "--server", self.grpc, "--json", *args]
        if self.ca:
            cmd += ["--ca", self.ca]
        if self.token:
            path = os.path.join(self.dir, "token")
            with open(path, "w") as f:
                f.write(self.token)
            cmd += ["--token-file", path]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
        return json.loads(r.stdout)

    def stop(self):
        for p in self.procs[::-1]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs[::-1]:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def cleanup(self, keep):
        """Removes the logs unless `keep` (a failed test: its message names the folder)."""
        if keep:
            print(f"logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
