#!/usr/bin/env python3
"""helm_chart_test: the strata chart passes `helm lint --strict`, renders for 1, 2 and 8
workers with TLS on and off and with and without a LeaderWorkerSet (and the other cases in
harness.py), and every render passes the assertions in checks.py. Values the schema must refuse
are refused. The assertions are shown to fail on broken renders (MUTATIONS below).

Every value must be documented in helm/strata/README.md (docs_check.py).

usage: chart_test.py SOURCE_DIR BUILD_DIR
Exit 0: passed; 1: failed; 77: skipped (helm could not be installed).
"""

import copy
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import docs_check
import harness
from checks import check, grpc_name_matches, COORD, COORD_INTERNAL, KVSTORE, WORKER


def containers(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            spec = d["spec"]
            t = spec["leaderWorkerTemplate"]["workerTemplate"] if kind == "LeaderWorkerSet" else spec["template"]
            return t["spec"], t["spec"]["containers"][0]
    raise KeyError(name)


def set_arg(c, prefix, new):
    c["args"] = [new if a.startswith(prefix) else a for a in c["args"]]


def _model_rw(d):
    spec, _ = containers(d, "StatefulSet", WORKER)
    next(x for x in spec["volumes"] if x["name"] == "model")["persistentVolumeClaim"]["readOnly"] = False


def _shm_disk(d):
    spec, _ = containers(d, "StatefulSet", WORKER)
    next(x for x in spec["volumes"] if x["name"] == "shm")["emptyDir"].pop("medium")


def _grace_eq_drain(d):
    spec, _ = containers(d, "Deployment", COORD)
    spec["terminationGracePeriodSeconds"] = 60


def _probe_port(d):
    _, c = containers(d, "StatefulSet", WORKER)
    c["readinessProbe"]["grpc"]["port"] = 50061


def _probe_service(d):
    _, c = containers(d, "Deployment", COORD)
    c["readinessProbe"]["grpc"]["service"] = "strata.v1.Worker"


def _insecure_with_tls(d):
    _, c = containers(d, "StatefulSet", harness.RELEASE + "-strata-kvstore")
    c["args"].append("--insecure-cluster")


def _no_gpu(d):
    _, c = containers(d, "StatefulSet", WORKER)
    c["resources"]["limits"].pop("nvidia.com/gpu")


def _root(d):
    spec, _ = containers(d, "Deployment", COORD)
    spec["securityContext"]["runAsNonRoot"] = False


def _caps(d):
    _, c = containers(d, "StatefulSet", WORKER)
    c["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}


def _internal_ready_only(d):
    next(x for x in d if x["kind"] == "Service" and x["metadata"]["name"] == COORD_INTERNAL)["spec"].pop(
        "publishNotReadyAddresses")


def _worker_count(d):
    _, c = containers(d, "Deployment", COORD)
    set_arg(c, "--workers=", "--workers=3")


def _typo_flag(d):
    _, c = containers(d, "StatefulSet", WORKER)
    set_arg(c, "--gpu-kv-bytes=", "--gpu-kv-byte=17179869184")


def _short_advertise(d):
    _, c = containers(d, "StatefulSet", WORKER)
    set_arg(c, "--advertise=", f"--advertise=$(POD_NAME).{WORKER}:50061")


def _extra_env(d):
    _, c = containers(d, "StatefulSet", WORKER)
    c["env"].append({"name": "CUDA_VISIBLE_DEVICES", "value": "0"})


def _pdb_selector(d):
    pdb = next(x for x in d if x["kind"] == "PodDisruptionBudget")
    pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "worker"


def _wrong_secret(d):
    spec, _ = containers(d, "Deployment", COORD)
    next(x for x in spec["volumes"] if x["name"] == "public-tls")["secret"]["secretName"] = "other"


def _ordered(d):
    next(x for x in d if x["kind"] == "StatefulSet" and x["metadata"]["name"] == WORKER)["spec"][
        "podManagementPolicy"] = "OrderedReady"


def _worker_metrics_port(d):
    _, c = containers(d, "StatefulSet", WORKER)
    c["ports"] = [p for p in c["ports"] if p["name"] != "metrics"]


def _kvstore_metrics_flag(d):
    _, c = containers(d, "StatefulSet", KVSTORE)
    c["args"] = [a for a in c["args"] if not a.startswith("--metrics-listen=")]


def _worker_metrics_ready_only(d):
    next(x for x in d if x["kind"] == "Service" and x["metadata"]["name"] == f"{WORKER}-metrics")["spec"].pop(
        "publishNotReadyAddresses")


def _label(d):
    d[0]["metadata"]["labels"].pop("app.kubernetes.io/part-of")


# Broken renders (of the default values) and a piece of the failure each must produce.
MUTATIONS = [
    (_model_rw, "model PVC not read-only"),
    (_shm_disk, "/dev/shm is not memory"),
    (_grace_eq_drain, "is not above the drain timeout"),
    (_probe_port, "readinessProbe port"),
    (_probe_service, "readinessProbe service"),
    (_insecure_with_tls, "--insecure-cluster with mTLS on"),
    (_no_gpu, "nvidia.com/gpu limit"),
    (_root, "pod runAsNonRoot"),
    (_caps, "capabilities"),
    (_internal_ready_only, "publishNotReadyAddresses"),
    (_worker_count, "--workers=3"),
    (_typo_flag, "not a flag of strata-worker"),
    (_short_advertise, "--advertise=$(POD_NAME).prod-strata-worker:50061"),
    (_extra_env, "environment variable CUDA_VISIBLE_DEVICES"),
    (_pdb_selector, "PodDisruptionBudget selects"),
    (_wrong_secret, "from Secret other"),
    (_ordered, "podManagementPolicy"),
    (_label, "app.kubernetes.io/part-of missing"),
    (_worker_metrics_port, "no metrics container port"),
    (_kvstore_metrics_flag, f"StatefulSet {KVSTORE}: --metrics-listen"),
    (_worker_metrics_ready_only, "publish not-ready workers"),
]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source, build = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    try:
        helm = harness.ensure_helm(build)
    except harness.Skip as e:
        harness.skip(str(e))
    installed = time.monotonic()
    defaults = harness.default_values(source)
    version = harness.app_version(source)
    tmp = harness.new_tmp()
    chart = str(harness.chart_dir(source))
    passed, failed = 0, 0

    def report(name, errors):
        nonlocal passed, failed
        if errors:
            failed += 1
            print(f"FAIL {name}")
            for e in errors[:40]:
                print(f"     {e}")
        else:
            passed += 1
            print(f"ok   {name}")

    report("every value documented in helm/strata/README.md", docs_check.check(source))
    report("docs/deploy.md lists the flags the chart may pass", docs_check.check_flags(source))
    # The certificate check follows gRPC's wildcard rule: no match without a dot after the label.
    rule = [("*.w.ns.svc.cluster.local", "w-0.w.ns.svc.cluster.local", True), ("*.w", "w-0.w", False),
            ("*.w.ns", "w-0.w.ns", True), ("*.w.ns", "a.w-0.w.ns", False), ("kv.ns", "KV.ns", True),
            ("*.w.ns", "w.ns", False)]
    report("gRPC's wildcard rule", [f"{san} vs {host}: {not want}" for san, host, want in rule
                                    if grpc_name_matches(san, host) != want])
    r = harness.helm_run(helm, ["lint", "--strict", chart])
    report("helm lint --strict (default values)", [] if r.returncode == 0 else [r.stdout + r.stderr])

    # helm spends most of its time starting up, so four at a time even on two cores.
    def run_case(case):
        name, override = case
        values_file = harness.write_values(tmp, name, override)
        r = harness.helm_run(helm, ["lint", "--strict", chart, "-f", values_file])
        errors = [] if r.returncode == 0 else ["helm lint --strict: " + r.stdout + r.stderr]
        docs, r = harness.render(helm, source, values_file)
        if docs is None:
            errors.append("helm template: " + r.stderr)
        else:
            errors += check(docs, harness.merged(defaults, override), version)
        return name, errors, docs

    def run_bad(case):
        name, override, message = case
        docs, r = harness.render(helm, source, harness.write_values(tmp, name, override))
        if docs is not None:
            return f"refuses {name}", ["helm template accepted it"]
        return f"refuses {name}", [] if message in r.stderr else [f"no {message!r} in: {r.stderr.strip()}"]

    cases = [("default values", {})] + harness.MATRIX + harness.EXTRA_CASES
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run_case, cases))
        bad = list(pool.map(run_bad, harness.BAD_CASES))
    for name, errors, _ in results:
        report(name, errors)
    for name, errors in bad:
        report(name, errors)
    default_docs = results[0][2]

    # The assertions can fail: each broken copy of the default render must be caught.
    if default_docs is not None:
        for mutate, message in MUTATIONS:
            docs = copy.deepcopy(default_docs)
            mutate(docs)
            errors = check(docs, defaults, version)
            hit = [e for e in errors if message in e]
            report(f"catches {mutate.__name__[1:]}", [] if hit else [f"no failure containing {message!r}: {errors}"])

    end = time.monotonic()
    print(f"helm install {installed - start:.1f} s, checks {end - installed:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
