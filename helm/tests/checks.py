"""Assertions on the objects `helm template` renders from the strata chart.

check(docs, values, app_version) returns a list of failures (empty: the render is right).
`values` are the effective values (the chart's values.yaml merged with the case's file) and
app_version the chart's appVersion: every expectation is derived from them, never from the
render itself.
"""

import json
import re

from harness import RELEASE, NAMESPACE

FULL = f"{RELEASE}-strata"
COORD = f"{FULL}-coordinator"
COORD_INTERNAL = f"{FULL}-coordinator-internal"
WORKER = f"{FULL}-worker"
KVSTORE = f"{FULL}-kvstore"

RECOMMENDED_LABELS = ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                      "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "helm.sh/chart"]

# The daemons' flags (the contract in docs/deploy.md). Flags without a value are switches.
COMMON_FLAGS = {"health-listen", "cluster-ca", "cluster-cert", "cluster-key", "insecure-cluster", "drain-timeout-s"}
FLAGS = {
    "coordinator": COMMON_FLAGS | {"model", "listen", "internal-listen", "tls-cert", "tls-key", "insecure-public",
                                   "api-tokens", "allow-unauthenticated", "max-concurrent-per-token",
                                   "max-rps-per-token", "workers", "kvstore", "max-running", "max-queued",
                                   "kv-dtype", "down-after-ms", "placement", "http-listen", "http-threads",
                                   "served-model-name", "metrics-listen"},
    "worker": COMMON_FLAGS | {"coordinator", "listen", "advertise", "name", "model-root", "device", "gpu",
                              "gpu-kv-bytes", "threads", "metrics-listen"},
    "kvstore": COMMON_FLAGS | {"dir", "listen", "commit-threads", "metrics-listen"},
}
SWITCHES = {"insecure-cluster", "insecure-public", "allow-unauthenticated"}
READINESS_SERVICE = {"coordinator": "strata.v1.Generation", "worker": "strata.v1.Worker",
                     "kvstore": "strata.v1.KVStore"}
FLAG_RE = re.compile(r"^--([a-z0-9][a-z0-9-]*)(?:=(.*))?$", re.S)


class Checker:
    def __init__(self, docs, v, app_version):
        self.docs, self.v, self.errors = docs, v, []
        self.tag = v["image"]["tag"] or app_version
        self.dialed = {}  # component -> a host name its clients dial (from the flags)

    def host(self, service):
        """The fully qualified name of a Service, as the daemons dial it."""
        return f'{service}.{NAMESPACE}.svc.{self.v["clusterDomain"]}'

    def expect(self, cond, msg):
        if not cond:
            self.errors.append(msg)
        return bool(cond)

    def metrics_components(self):
        """The workloads whose /metrics the chart serves: their metrics Services are NAME-metrics."""
        m = self.v["metrics"]
        if not m["enabled"]:
            return []
        return [COORD] + ([WORKER] if m["workers"] else []) + ([KVSTORE] if m["kvstore"] and self.v["kvstore"]["enabled"] else [])

    def metrics_flag(self, where, flags, ports, workload):
        """--metrics-listen and the container port `metrics` exactly when the workload serves metrics."""
        v = self.v
        if workload in self.metrics_components():
            self.expect(flags.get("metrics-listen") == f'0.0.0.0:{v["ports"]["metrics"]}', f"{where}: --metrics-listen")
            self.expect(v["ports"]["metrics"] in ports, f"{where}: no metrics container port")
        else:
            self.expect("metrics-listen" not in flags, f"{where}: --metrics-listen with its metrics off")
            self.expect(v["ports"]["metrics"] not in ports, f"{where}: a metrics port with its metrics off")

    def find(self, kind, name):
        hits = [d for d in self.docs if d.get("kind") == kind and d["metadata"]["name"] == name]
        return hits[0] if len(hits) == 1 else None

    # -- security switches, as the chart's helpers compute them -------------------------------
    def cluster_tls(self):
        return not self.v["insecureDevMode"] and self.v["tls"]["cluster"]["enabled"]

    def public_tls(self):
        return not self.v["insecureDevMode"] and self.v["tls"]["public"]["enabled"]

    def auth(self):
        return not self.v["insecureDevMode"] and self.v["auth"]["enabled"]

    def cert_manager(self):
        return self.v["tls"]["certManager"]["enabled"] and (self.cluster_tls() or self.public_tls())

    def cluster_secret(self, component):
        given = self.v["tls"]["cluster"]["existingSecrets"][component]
        if given and not self.v["tls"]["certManager"]["enabled"]:
            return given
        return f"{FULL}-{component}-cluster-tls"

    def public_secret(self):
        given = self.v["tls"]["public"]["existingSecret"]
        return given if given and not self.v["tls"]["certManager"]["enabled"] else f"{FULL}-public-tls"

    def tokens_secret(self):
        if self.v["auth"]["tokens"]:
            return f"{FULL}-api-tokens"
        return self.v["auth"]["existingSecret"] or f"{FULL}-api-tokens"

    # -- the whole render ---------------------------------------------------------------------
    def run(self):
        self.inventory()
        self.labels()
        coord = self.find("Deployment", COORD)
        if self.expect(coord, f"Deployment {COORD} missing"):
            self.coordinator(coord)
        workers = self.worker_workload()
        if workers is not None:
            self.worker(*workers)
        if self.v["kvstore"]["enabled"]:
            kv = self.find("StatefulSet", KVSTORE)
            if self.expect(kv, f"StatefulSet {KVSTORE} missing"):
                self.kvstore(kv)
        self.services()
        self.monitoring()
        self.pdb()
        self.secrets()
        self.certificates()
        return self.errors

    def inventory(self):
        v = self.v
        want = {("Deployment", COORD), ("Service", COORD), ("Service", COORD_INTERNAL), ("Service", WORKER),
                ("ServiceAccount", FULL)}
        want.add(("LeaderWorkerSet", WORKER) if v["workers"]["leaderWorkerSet"]["enabled"]
                 else ("StatefulSet", WORKER))
        if v["kvstore"]["enabled"]:
            want |= {("StatefulSet", KVSTORE), ("Service", KVSTORE)}
        if v["coordinator"]["pdb"]["enabled"]:
            want.add(("PodDisruptionBudget", COORD))
        if self.auth() and v["auth"]["tokens"]:
            want.add(("Secret", f"{FULL}-api-tokens"))
        for name in self.metrics_components():
            want.add(("Service", f"{name}-metrics"))
            if v["metrics"]["serviceMonitor"]["enabled"]:
                want.add(("ServiceMonitor", name))
        if v["metrics"]["dashboard"]["enabled"]:
            want.add(("ConfigMap", f"{FULL}-dashboard"))
        have = [(d["kind"], d["metadata"]["name"]) for d in self.docs]
        self.expect(len(have) == len(set(have)), f"objects rendered twice: {sorted(have)}")
        extra = {k for k in have if k[0] not in ("Certificate", "Issuer")} - want
        self.expect(not (want - set(have)), f"objects missing: {sorted(want - set(have))}")
        self.expect(not extra, f"objects nobody asked for: {sorted(extra)}")
        if not self.cert_manager():
            self.expect(not [k for k in have if k[0] in ("Certificate", "Issuer")],
                        "cert-manager objects without tls.certManager.enabled")

    def labels(self):
        tag = self.tag
        for d in self.docs:
            where = f'{d["kind"]} {d["metadata"]["name"]}'
            labels = d["metadata"].get("labels") or {}
            for key in RECOMMENDED_LABELS:
                self.expect(labels.get(key), f"{where}: label {key} missing")
            self.expect(labels.get("app.kubernetes.io/instance") == RELEASE, f"{where}: instance label")
            self.expect(labels.get("app.kubernetes.io/managed-by") == "Helm", f"{where}: managed-by label")
            self.expect(labels.get("app.kubernetes.io/version") == tag, f"{where}: version label is not {tag}")
            for k, val in self.v["commonLabels"].items():
                self.expect(labels.get(k) == val, f"{where}: common label {k} missing")

    # -- pods -----------------------------------------------------------------------------------
    def args(self, where, container, component):
        """Parses --name=value flags; checks each against the daemon's contract."""
        self.expect(container.get("command") == [f"strata-{component}"], f"{where}: command")
        extra = list(self.v[{"worker": "workers"}.get(component, component)]["extraArgs"])
        flags = {}
        for a in container.get("args", []):
            m = FLAG_RE.match(a)
            if not self.expect(m, f"{where}: argument {a!r} is not --name=value"):
                continue
            name, value = m.group(1), m.group(2)
            self.expect(name not in flags, f"{where}: --{name} given twice")
            if a in extra:
                extra.remove(a)
            else:
                self.expect(name in FLAGS[component], f"{where}: --{name} is not a flag of strata-{component}")
                self.expect((value is None) == (name in SWITCHES), f"{where}: --{name} value {value!r}")
            flags[name] = value
        self.expect(not extra, f"{where}: extraArgs not passed: {extra}")
        return flags

    def pod(self, where, template, component, flags, container):
        """What every component's pod must have: security, probes, grace, env, volumes."""
        v, spec = self.v, template["spec"]
        health = v["ports"]["health"]
        # Security.
        psc = spec.get("securityContext") or {}
        self.expect(psc.get("runAsNonRoot") is True, f"{where}: pod runAsNonRoot")
        self.expect(psc.get("runAsUser", 0) != 0, f"{where}: pod runs as root")
        self.expect((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", f"{where}: seccomp")
        self.expect(spec.get("automountServiceAccountToken") is False, f"{where}: service account token mounted")
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            self.expect(not spec.get(host), f"{where}: {host}")
        csc = container.get("securityContext") or {}
        self.expect(csc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation")
        self.expect(csc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem")
        self.expect(csc.get("privileged") is not True, f"{where}: privileged")
        caps = csc.get("capabilities") or {}
        self.expect("ALL" in (caps.get("drop") or []) and not caps.get("add"), f"{where}: capabilities {caps}")
        # Image.
        self.expect(container.get("image") == f'{v["image"]["repository"]}:{self.tag}', f"{where}: image")
        self.expect(container.get("imagePullPolicy") == v["image"]["pullPolicy"], f"{where}: pullPolicy")
        self.expect(spec.get("imagePullSecrets", []) == v["imagePullSecrets"], f"{where}: imagePullSecrets")
        # Health port and probes: gRPC probes on the plaintext health port, nothing else.
        self.expect(flags.get("health-listen") == f"0.0.0.0:{health}", f"{where}: --health-listen")
        ports = {p["containerPort"]: p for p in container.get("ports", [])}
        self.expect(health in ports, f"{where}: health port {health} not a container port")
        probes = {"startupProbe": "", "readinessProbe": READINESS_SERVICE[component], "livenessProbe": ""}
        for probe, service in probes.items():
            p = container.get(probe)
            if not self.expect(p, f"{where}: {probe} missing"):
                continue
            handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in p]
            self.expect(handlers == ["grpc"], f"{where}: {probe} handlers {handlers}")
            g = p.get("grpc") or {}
            self.expect(g.get("port") == health, f"{where}: {probe} port {g.get('port')} is not {health}")
            self.expect(g.get("service", "") == service, f"{where}: {probe} service {g.get('service')!r}")
            want = v["probes"][probe[:-len("Probe")]]
            for key in ("periodSeconds", "failureThreshold", "timeoutSeconds"):
                self.expect(p.get(key) == want[key], f"{where}: {probe}.{key}")
        startup = container.get("startupProbe") or {}
        budget = startup.get("periodSeconds", 0) * startup.get("failureThreshold", 0)
        self.expect(budget >= 1800, f"{where}: startup probe allows only {budget} s to load a model")
        # Drain: the kubelet must wait longer than the daemon drains.
        values = v[{"worker": "workers"}.get(component, component)]
        drain = values["drainTimeoutSeconds"]
        self.expect(flags.get("drain-timeout-s") == str(drain), f"{where}: --drain-timeout-s")
        grace = spec.get("terminationGracePeriodSeconds")
        self.expect(isinstance(grace, int) and grace > int(flags.get("drain-timeout-s") or 0),
                    f"{where}: terminationGracePeriodSeconds {grace} is not above the drain timeout {drain}")
        self.expect(grace == drain + values["terminationGraceExtraSeconds"], f"{where}: grace {grace}")
        # Environment: only what Kubernetes injects, and NCCL_*.
        for e in container.get("env", []):
            if e["name"] in ("POD_NAME", "POD_IP"):
                field = {"POD_NAME": "metadata.name", "POD_IP": "status.podIP"}[e["name"]]
                self.expect(e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == field,
                            f"{where}: {e['name']} is not the downward API's {field}")
            else:
                self.expect(e["name"].startswith("NCCL_") and component == "worker",
                            f"{where}: environment variable {e['name']}")
        self.expect(not container.get("envFrom"), f"{where}: envFrom")
        self.expect(spec.get("enableServiceLinks") is False, f"{where}: service links inject variables")
        # Cluster mTLS.
        vols = {x["name"]: x for x in spec.get("volumes", [])}
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        if self.cluster_tls():
            self.expect("insecure-cluster" not in flags, f"{where}: --insecure-cluster with mTLS on")
            for flag, key in (("cluster-ca", "ca.crt"), ("cluster-cert", "tls.crt"), ("cluster-key", "tls.key")):
                self.secret_file(where, flags.get(flag), vols, mounts, self.cluster_secret(component), key, flag)
        else:
            self.expect("insecure-cluster" in flags, f"{where}: plaintext without --insecure-cluster")
            for flag in ("cluster-ca", "cluster-cert", "cluster-key"):
                self.expect(flag not in flags, f"{where}: --{flag} with mTLS off")
            self.expect(not [x for x in vols.values() if "secret" in x and "cluster" in x["secret"]["secretName"]],
                        f"{where}: cluster certificate mounted with mTLS off")
        # /tmp is the only writable place besides the declared volumes.
        self.expect("/tmp" in mounts and "emptyDir" in vols.get(mounts["/tmp"]["name"], {}),
                    f"{where}: no writable /tmp")
        # Volumes and mounts agree.
        claims = {c["metadata"]["name"] for c in template.get("_claims", [])}
        for m in container.get("volumeMounts", []):
            self.expect(m["name"] in vols or m["name"] in claims, f"{where}: mount of unknown volume {m['name']}")
        used = {m["name"] for m in container.get("volumeMounts", [])}
        self.expect(set(vols) <= used, f"{where}: volumes never mounted: {set(vols) - used}")
        # Scheduling passthrough.
        for key in ("nodeSelector", "tolerations", "affinity"):
            self.expect(spec.get(key) == (values[key] or None), f"{where}: {key} is not the values'")
        self.expect(spec.get("priorityClassName") == (values["priorityClassName"] or None),
                    f"{where}: priorityClassName")
        labels = template["metadata"].get("labels") or {}
        for k, val in values["podLabels"].items():
            self.expect(labels.get(k) == val, f"{where}: pod label {k}")
        return vols, mounts, ports

    def secret_file(self, where, path, vols, mounts, secret, key, flag):
        """The flag names a file that a mounted Secret provides under that key."""
        if not self.expect(path, f"{where}: --{flag} missing"):
            return
        folder, _, file = path.rpartition("/")
        m = mounts.get(folder)
        if not self.expect(m, f"{where}: --{flag}={path}: nothing mounted at {folder}"):
            return
        self.expect(m.get("readOnly") is True, f"{where}: {folder} mounted writable")
        sec = vols.get(m["name"], {}).get("secret")
        if not self.expect(sec, f"{where}: {folder} is not a Secret"):
            return
        self.expect(sec["secretName"] == secret, f"{where}: --{flag} from Secret {sec['secretName']}, not {secret}")
        items = {i["path"]: i["key"] for i in sec.get("items", [])}
        self.expect(items.get(file) == key, f"{where}: --{flag}: {file} is not key {key} of {secret}")

    def model(self, where, vols, mounts):
        """The model PVC: the existing claim, read-only in the volume and the mount."""
        v = self.v["model"]
        m = mounts.get(v["mountPath"])
        if not self.expect(m, f"{where}: model not mounted at {v['mountPath']}"):
            return
        self.expect(m.get("readOnly") is True, f"{where}: model mount is writable")
        pvc = vols.get(m["name"], {}).get("persistentVolumeClaim")
        if self.expect(pvc, f"{where}: model volume is not a PVC"):
            self.expect(pvc.get("claimName") == v["existingClaim"], f"{where}: model claim {pvc.get('claimName')}")
            self.expect(pvc.get("readOnly") is True, f"{where}: model PVC not read-only")

    def resources(self, where, container, want):
        self.expect(container.get("resources") == want, f"{where}: resources {container.get('resources')} != {want}")

    def coordinator(self, dep):
        v, where = self.v, f"coordinator {dep['metadata']['name']}"
        spec = dep["spec"]
        self.expect(spec.get("replicas") == 1, f"{where}: replicas {spec.get('replicas')}")
        self.expect(spec.get("strategy", {}).get("type") == "Recreate", f"{where}: strategy is not Recreate")
        tpl = spec["template"]
        cs = tpl["spec"]["containers"]
        if not self.expect(len(cs) == 1, f"{where}: {len(cs)} containers"):
            return
        c = cs[0]
        flags = self.args(where, c, "coordinator")
        vols, mounts, ports = self.pod(where, tpl, "coordinator", flags, c)
        self.model(where, vols, mounts)
        model_dir = v["model"]["mountPath"].rstrip("/") + ("/" + v["model"]["dir"].strip("/") if v["model"]["dir"] else "")
        self.expect(flags.get("model") == model_dir, f"{where}: --model={flags.get('model')}, not {model_dir}")
        self.expect(flags.get("listen") == f'0.0.0.0:{v["ports"]["public"]}', f"{where}: --listen")
        self.expect(flags.get("internal-listen") == f'0.0.0.0:{v["ports"]["internal"]}', f"{where}: --internal-listen")
        self.expect(v["ports"]["public"] in ports and v["ports"]["internal"] in ports, f"{where}: container ports")
        self.expect(flags.get("workers") == str(v["workers"]["count"]), f"{where}: --workers={flags.get('workers')}")
        want_kv = f'{self.host(KVSTORE)}:{v["ports"]["kvstore"]}' if v["kvstore"]["enabled"] else None
        self.expect(flags.get("kvstore") == want_kv, f"{where}: --kvstore={flags.get('kvstore')}")
        if flags.get("kvstore"):
            self.dialed["kvstore"] = flags["kvstore"].rsplit(":", 1)[0]
        cv = v["coordinator"]
        for flag, key in (("max-running", "maxRunning"), ("max-queued", "maxQueued"), ("kv-dtype", "kvDtype"),
                          ("down-after-ms", "downAfterMs")):
            self.expect(flags.get(flag) == str(cv[key]), f"{where}: --{flag}={flags.get(flag)}")
        self.expect(flags.get("placement") == (cv["placement"] or None), f"{where}: --placement")
        if self.public_tls():
            self.expect("insecure-public" not in flags, f"{where}: --insecure-public with TLS on")
            self.secret_file(where, flags.get("tls-cert"), vols, mounts, self.public_secret(), "tls.crt", "tls-cert")
            self.secret_file(where, flags.get("tls-key"), vols, mounts, self.public_secret(), "tls.key", "tls-key")
        else:
            self.expect("insecure-public" in flags, f"{where}: plaintext public port without --insecure-public")
            self.expect("tls-cert" not in flags and "tls-key" not in flags, f"{where}: --tls-* with TLS off")
        if self.auth():
            self.expect("allow-unauthenticated" not in flags, f"{where}: --allow-unauthenticated with auth on")
            self.secret_file(where, flags.get("api-tokens"), vols, mounts, self.tokens_secret(), "tokens", "api-tokens")
            for flag, key in (("max-concurrent-per-token", "maxConcurrentPerToken"), ("max-rps-per-token", "maxRpsPerToken")):
                want = None if cv[key] is None else str(cv[key])
                self.expect(flags.get(flag) == want, f"{where}: --{flag}={flags.get(flag)}, not {want}")
        else:
            self.expect("allow-unauthenticated" in flags, f"{where}: no tokens without --allow-unauthenticated")
            self.expect("api-tokens" not in flags, f"{where}: --api-tokens with auth off")
        http = v["http"]
        if http["enabled"]:
            self.expect(flags.get("http-listen") == f'0.0.0.0:{v["ports"]["http"]}', f"{where}: --http-listen")
            self.expect(flags.get("http-threads") == str(http["threads"]), f"{where}: --http-threads")
            self.expect(flags.get("served-model-name") == (http["servedModelName"] or None), f"{where}: --served-model-name")
            self.expect(v["ports"]["http"] in ports, f"{where}: no http container port")
        else:
            self.expect(not {"http-listen", "http-threads", "served-model-name"} & set(flags), f"{where}: --http-* with http off")
        self.metrics_flag(where, flags, ports, COORD)
        self.resources(where, c, cv["resources"])

    def monitoring(self):
        """The metrics Services, the ServiceMonitors that scrape them and the dashboard ConfigMap."""
        v = self.v
        for workload in self.metrics_components():
            svc = self.find("Service", f"{workload}-metrics")
            where = f"Service {workload}-metrics"
            if svc:
                ports = svc["spec"]["ports"]
                self.expect(ports == [{"name": "metrics", "port": v["ports"]["metrics"], "targetPort": "metrics",
                                       "protocol": "TCP"}], f"{where}: ports {ports}")
                self.expect(svc["spec"].get("type", "ClusterIP") == "ClusterIP",
                            f"{where}: a metrics Service must stay inside the cluster")
                pods = self.pods_of(svc["spec"].get("selector"))
                self.expect([p[1] for p in pods] == [workload], f"{where} selects {[p[1] for p in pods]}")
                if workload == WORKER:
                    # One endpoint per worker pod, also while it loads its layers.
                    self.expect(svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses"),
                                f"{where}: must be headless and publish not-ready workers")
                    self.expect(self.find("Service", WORKER) is None or
                                not any(p["name"] == "metrics" for p in self.find("Service", WORKER)["spec"]["ports"]),
                                f"Service {WORKER} exposes the metrics port")
            sm = self.find("ServiceMonitor", workload)
            if sm:
                sel = sm["spec"]["selector"]["matchLabels"]
                self.expect(svc is not None and all(svc["metadata"]["labels"].get(k) == x for k, x in sel.items()),
                            f"ServiceMonitor {workload} does not select {where}")
                others = [d["metadata"]["name"] for d in self.docs if d["kind"] == "Service" and d is not svc
                          and all((d["metadata"].get("labels") or {}).get(k) == x for k, x in sel.items())]
                self.expect(not others, f"ServiceMonitor {workload} also selects {others}")
                ep = sm["spec"]["endpoints"]
                self.expect(len(ep) == 1 and ep[0]["port"] == "metrics" and ep[0]["path"] == "/metrics"
                            and ep[0]["interval"] == v["metrics"]["serviceMonitor"]["interval"],
                            f"ServiceMonitor {workload} endpoints {ep}")
                for k, x in v["metrics"]["serviceMonitor"]["labels"].items():
                    self.expect(sm["metadata"]["labels"].get(k) == x, f"ServiceMonitor {workload} label {k}")
        cm = self.find("ConfigMap", f"{FULL}-dashboard")
        if cm:
            try:
                dash = json.loads(cm["data"]["strata.json"])
                exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
                for name in ("strata_requests_total", "strata_time_to_first_token_seconds",
                             "strata_inter_token_latency_seconds", "strata_stage_kv_pages_used",
                             "strata_worker_busy_seconds_total", "strata_worker_steps_total",
                             "strata_worker_hop_seconds_bucket", "strata_worker_downstream_seconds_bucket",
                             "strata_worker_kv_pages_used", "strata_worker_kv_pages_free",
                             "strata_worker_batch_rows_sum", "strata_worker_batch_sequences_sum",
                             "strata_worker_errors_total", "strata_worker_sequences",
                             "strata_kvstore_append_seconds_bucket", "strata_kvstore_fsync_seconds_bucket",
                             "strata_kvstore_appended_bytes_total", "strata_kvstore_read_bytes_total",
                             "strata_kvstore_sessions_open", "strata_kvstore_sessions_stored",
                             "strata_kvstore_rpcs_total"):
                    self.expect(name in exprs, f"the dashboard does not plot {name}")
                variables = {t["name"] for t in dash["templating"]["list"]}
                for var in re.findall(r"\$([a-z_]+)", exprs):
                    self.expect(var.startswith("__") or var in variables, f"the dashboard uses ${var}, never defined")
            except (KeyError, ValueError) as e:
                self.expect(False, f"the dashboard ConfigMap does not hold the dashboard JSON: {e}")
            for k, x in v["metrics"]["dashboard"]["labels"].items():
                self.expect(cm["metadata"]["labels"].get(k) == x, f"dashboard label {k}")

    def worker_workload(self):
        """Returns (where, pod template, pods) of the workers' StatefulSet or LeaderWorkerSet."""
        w = self.v["workers"]
        if w["leaderWorkerSet"]["enabled"]:
            lws = self.find("LeaderWorkerSet", WORKER)
            if not self.expect(lws, "LeaderWorkerSet missing"):
                return None
            spec, where = lws["spec"], f"LeaderWorkerSet {WORKER}"
            t = spec["leaderWorkerTemplate"]
            self.expect(lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1", f"{where}: apiVersion")
            self.expect(spec.get("replicas", 1) * t.get("size", 1) == w["count"],
                        f"{where}: {spec.get('replicas')} groups of {t.get('size')} is not {w['count']} workers")
            self.expect(t.get("size") == w["leaderWorkerSet"]["size"], f"{where}: size")
            self.expect(spec.get("startupPolicy") == "LeaderCreated", f"{where}: startupPolicy")
            self.expect(spec.get("networkConfig", {}).get("subdomainPolicy") == "Shared",
                        f"{where}: pods must be <pod>.{WORKER}")
            self.expect(t.get("restartPolicy") == w["leaderWorkerSet"]["restartPolicy"], f"{where}: restartPolicy")
            self.expect("leaderTemplate" not in t, f"{where}: leader differs from the workers")
            topo = (lws["metadata"].get("annotations") or {}).get("leaderworkerset.sigs.k8s.io/exclusive-topology")
            self.expect(topo == (w["leaderWorkerSet"]["exclusiveTopology"] or None), f"{where}: exclusive topology")
            return where, t["workerTemplate"]
        sts = self.find("StatefulSet", WORKER)
        if not self.expect(sts, "worker StatefulSet missing"):
            return None
        where = f"StatefulSet {WORKER}"
        self.expect(sts["spec"].get("replicas") == w["count"], f"{where}: replicas {sts['spec'].get('replicas')}")
        self.expect(sts["spec"].get("serviceName") == WORKER, f"{where}: serviceName")
        self.expect(sts["spec"].get("podManagementPolicy") == "Parallel", f"{where}: podManagementPolicy")
        self.selector(where, sts)
        return where, sts["spec"]["template"]

    def worker(self, where, tpl):
        v, w = self.v, self.v["workers"]
        cs = tpl["spec"]["containers"]
        if not self.expect(len(cs) == 1, f"{where}: {len(cs)} containers"):
            return
        c = cs[0]
        flags = self.args(where, c, "worker")
        vols, mounts, ports = self.pod(where, tpl, "worker", flags, c)
        self.model(where, vols, mounts)
        self.expect(flags.get("model-root") == v["model"]["mountPath"], f"{where}: --model-root")
        port = v["ports"]["worker"]
        self.expect(flags.get("coordinator") == f'{self.host(COORD_INTERNAL)}:{v["ports"]["internal"]}',
                    f"{where}: --coordinator={flags.get('coordinator')}")
        self.expect(flags.get("listen") == f"0.0.0.0:{port}", f"{where}: --listen")
        self.expect(flags.get("advertise") == f"$(POD_NAME).{self.host(WORKER)}:{port}",
                    f"{where}: --advertise={flags.get('advertise')}")
        if flags.get("coordinator"):
            self.dialed["coordinator"] = flags["coordinator"].rsplit(":", 1)[0]
        if flags.get("advertise"):
            self.dialed["worker"] = flags["advertise"].rsplit(":", 1)[0].replace("$(POD_NAME)", f"{WORKER}-0")
        self.expect(flags.get("name") == "$(POD_NAME)", f"{where}: --name")
        self.expect(port in ports, f"{where}: worker port")
        self.expect(flags.get("threads") == str(w["threads"]), f"{where}: --threads")
        self.metrics_flag(where, flags, ports, WORKER)
        env = {e["name"]: e for e in c.get("env", [])}
        self.expect("POD_NAME" in env, f"{where}: $(POD_NAME) is used but not defined")
        for k, val in w["nccl"].items():
            self.expect(env.get(k, {}).get("value") == val, f"{where}: {k} is not {val!r}")
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = (c.get("resources") or {}).get("requests") or {}
        gpu = w["gpuResource"]
        if w["device"] == "gpu":
            self.expect(str(limits.get(gpu)) == "1", f"{where}: {gpu} limit {limits.get(gpu)}")
            self.expect(gpu not in requests or str(requests[gpu]) == "1", f"{where}: {gpu} request")
            self.expect(flags.get("device") == "gpu" and flags.get("gpu") == "0", f"{where}: --device/--gpu")
            self.expect(flags.get("gpu-kv-bytes") == str(w["gpuKvBytes"]),
                        f"{where}: --gpu-kv-bytes={flags.get('gpu-kv-bytes')}, not {w['gpuKvBytes']}")
            want = {"requests": w["resources"]["requests"], "limits": {**w["resources"]["limits"], gpu: 1}}
        else:
            self.expect(gpu not in limits and gpu not in requests, f"{where}: a CPU worker asks for a GPU")
            self.expect(flags.get("device") == "cpu" and "gpu" not in flags and "gpu-kv-bytes" not in flags,
                        f"{where}: CPU worker flags")
            want = w["resources"]
        self.resources(where, c, want)
        shm = mounts.get("/dev/shm")
        if self.expect(shm, f"{where}: /dev/shm not mounted"):
            ed = vols.get(shm["name"], {}).get("emptyDir") or {}
            self.expect(ed.get("medium") == "Memory", f"{where}: /dev/shm is not memory")
            self.expect(ed.get("sizeLimit") == w["shmSize"], f"{where}: /dev/shm size {ed.get('sizeLimit')}")

    def kvstore(self, sts):
        v, k, where = self.v, self.v["kvstore"], f"StatefulSet {KVSTORE}"
        spec = sts["spec"]
        self.expect(spec.get("replicas") == 1, f"{where}: replicas")
        self.expect(spec.get("serviceName") == KVSTORE, f"{where}: serviceName")
        self.selector(where, sts)
        ret = spec.get("persistentVolumeClaimRetentionPolicy") or {}
        self.expect(ret == k["retention"], f"{where}: claim retention {ret}")
        claims = spec.get("volumeClaimTemplates") or []
        tpl = dict(spec["template"], _claims=claims)
        c = tpl["spec"]["containers"][0]
        flags = self.args(where, c, "kvstore")
        vols, mounts, ports = self.pod(where, tpl, "kvstore", flags, c)
        self.expect(flags.get("listen") == f'0.0.0.0:{v["ports"]["kvstore"]}', f"{where}: --listen")
        self.expect(v["ports"]["kvstore"] in ports, f"{where}: container port")
        self.expect(flags.get("commit-threads") == str(k["commitThreads"]), f"{where}: --commit-threads")
        self.metrics_flag(where, flags, ports, KVSTORE)
        if not self.expect(len(claims) == 1, f"{where}: {len(claims)} volumeClaimTemplates"):
            return
        claim = claims[0]
        cs = claim["spec"]
        self.expect(cs["resources"]["requests"]["storage"] == k["storage"]["size"], f"{where}: claim size")
        self.expect(cs["accessModes"] == k["storage"]["accessModes"], f"{where}: access modes")
        self.expect(cs.get("storageClassName") == (k["storage"]["storageClassName"] or None), f"{where}: class")
        d = flags.get("dir") or ""
        under = [p for p, m in mounts.items() if m["name"] == claim["metadata"]["name"]]
        self.expect(len(under) == 1 and d.startswith(under[0].rstrip("/") + "/") and not mounts[under[0]].get("readOnly"),
                    f"{where}: --dir={d} is not on the claim's volume {under}")
        self.resources(where, c, k["resources"])

    def selector(self, where, workload):
        sel = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        self.expect(all(labels.get(k) == x for k, x in sel.items()), f"{where}: selector does not match its pods")
        self.expect("app.kubernetes.io/component" in sel, f"{where}: selector lacks the component")

    # -- services, budgets, secrets, certificates ---------------------------------------------------
    def pods_of(self, selector):
        """Names of the workloads whose pods a selector picks."""
        out = []
        for d in self.docs:
            if d["kind"] in ("Deployment", "StatefulSet"):
                t = d["spec"]["template"]
            elif d["kind"] == "LeaderWorkerSet":
                t = d["spec"]["leaderWorkerTemplate"]["workerTemplate"]
            else:
                continue
            labels = t["metadata"].get("labels") or {}
            if selector and all(labels.get(k) == x for k, x in selector.items()):
                out.append((d["kind"], d["metadata"]["name"], t))
        return out

    def services(self):
        v = self.v
        want = {COORD: (COORD, v["coordinator"]["service"]["port"], v["ports"]["public"], False, None),
                COORD_INTERNAL: (COORD, v["ports"]["internal"], v["ports"]["internal"], True, None),
                WORKER: (WORKER, v["ports"]["worker"], v["ports"]["worker"], True, "None")}
        if v["kvstore"]["enabled"]:
            want[KVSTORE] = (KVSTORE, v["ports"]["kvstore"], v["ports"]["kvstore"], False, "None")
        health = v["ports"]["health"]
        for name, (workload, port, target, not_ready, cluster_ip) in want.items():
            svc, where = self.find("Service", name), f"Service {name}"
            if not svc:
                continue
            spec = svc["spec"]
            pods = self.pods_of(spec.get("selector"))
            if not self.expect([p[1] for p in pods] == [workload], f"{where} selects {[p[1] for p in pods]}"):
                continue
            cports = {p["name"]: p["containerPort"] for p in pods[0][2]["spec"]["containers"][0]["ports"]}
            sp = spec.get("ports") or []
            extra = []
            if name == COORD and v["http"]["enabled"]:
                extra = [p for p in sp if p.get("name") == "http"]
                self.expect(len(extra) == 1 and extra[0]["port"] == v["coordinator"]["service"]["httpPort"]
                            and cports.get(extra[0].get("targetPort")) == v["ports"]["http"],
                            f"{where}: the HTTP API's port {extra}")
                sp = [p for p in sp if p.get("name") != "http"]
            self.expect(len(sp) == 1 and sp[0]["port"] == port, f"{where}: ports {sp}")
            for p in extra:
                self.expect(cports.get(p.get("targetPort")) != health, f"{where}: exposes the health port")
            for p in sp:
                t = p.get("targetPort", p["port"])
                resolved = cports.get(t) if isinstance(t, str) else t
                self.expect(resolved == target, f"{where}: targetPort {t} reaches {resolved}, not {target}")
                self.expect(resolved != health, f"{where}: exposes the health port")
            self.expect(bool(spec.get("publishNotReadyAddresses")) == not_ready,
                        f"{where}: publishNotReadyAddresses should be {not_ready}")
            self.expect(spec.get("clusterIP") == cluster_ip, f"{where}: clusterIP {spec.get('clusterIP')}")
        svc = self.find("Service", COORD)
        if svc:
            s = v["coordinator"]["service"]
            self.expect(svc["spec"]["type"] == s["type"], "public Service type")
            if s["type"] == "LoadBalancer" and s["loadBalancerSourceRanges"]:
                self.expect(svc["spec"].get("loadBalancerSourceRanges") == s["loadBalancerSourceRanges"],
                            "loadBalancerSourceRanges")

    def pdb(self):
        p = self.v["coordinator"]["pdb"]
        pdb = self.find("PodDisruptionBudget", COORD)
        if not p["enabled"] or not pdb:
            return
        pods = self.pods_of(pdb["spec"]["selector"]["matchLabels"])
        self.expect([x[1] for x in pods] == [COORD], f"PodDisruptionBudget selects {[x[1] for x in pods]}")
        if p.get("maxUnavailable") is None:
            self.expect(pdb["spec"].get("minAvailable") == p["minAvailable"] and "maxUnavailable" not in pdb["spec"],
                        f"PodDisruptionBudget {pdb['spec']}")
        else:
            self.expect(pdb["spec"].get("maxUnavailable") == p["maxUnavailable"] and "minAvailable" not in pdb["spec"],
                        f"PodDisruptionBudget {pdb['spec']}")

    def secrets(self):
        tokens = self.v["auth"]["tokens"]
        s = self.find("Secret", f"{FULL}-api-tokens")
        if self.auth() and tokens and self.expect(s, "API tokens Secret missing"):
            lines = s.get("stringData", {}).get("tokens", "").splitlines()
            self.expect(lines == [f'{t["name"]}:{t["token"]}' for t in tokens], f"API tokens Secret holds {lines}")

    def certificates(self):
        if not self.cert_manager():
            return
        certs = {d["spec"]["secretName"]: d for d in self.docs if d["kind"] == "Certificate"}
        issuers = {d["metadata"]["name"] for d in self.docs if d["kind"] == "Issuer"}
        cm = self.v["tls"]["certManager"]
        wanted = []
        if self.cluster_tls():
            comps = ["coordinator", "worker"] + (["kvstore"] if self.v["kvstore"]["enabled"] else [])
            wanted += [(self.cluster_secret(c), self.dialed.get(c), {"server auth", "client auth"}, cm["issuerRef"])
                       for c in comps]
        if self.public_tls():
            issuer = cm["publicIssuerRef"] if cm["publicIssuerRef"]["name"] else cm["issuerRef"]
            wanted.append((self.public_secret(), COORD, {"server auth"}, issuer))
        for secret, host, usages, issuer in wanted:
            c = certs.get(secret)
            if not self.expect(c, f"no Certificate writes the mounted Secret {secret}"):
                continue
            names = c["spec"].get("dnsNames", [])
            self.expect(host and any(grpc_name_matches(n, host) for n in names),
                        f"Certificate {secret}: {host}, which clients dial, is not matched by {names}")
            self.expect(usages <= set(c["spec"].get("usages", [])), f"Certificate {secret}: usages")
            ref = c["spec"]["issuerRef"]
            if issuer["name"]:
                self.expect(ref == issuer, f"Certificate {secret}: issuer {ref}, not {issuer}")
            else:
                self.expect(ref["kind"] == "Issuer" and ref["name"] in issuers, f"Certificate {secret}: issuer {ref}")
        for d in self.docs:
            if d["kind"] == "Certificate" and d["spec"].get("isCA"):
                self.expect(d["spec"]["issuerRef"]["name"] in issuers, "CA certificate without its self-signed issuer")


def grpc_name_matches(san, host):
    """gRPC's rule (does_entry_match_name in its TLS layer): an exact name, or "*.REST" where
    the host is one label, a dot and REST, and REST holds a dot that is not its last character."""
    san, host = san.lower().rstrip("."), host.lower().rstrip(".")
    if san == host:
        return True
    if not san.startswith("*.") or len(san) < 3 or "." not in host:
        return False
    rest = host.split(".", 1)[1]
    return "." in rest[:-1] and rest == san[2:]


def check(docs, values, app_version):
    return Checker(docs, values, app_version).run()


__all__ = ["check", "FULL", "COORD", "COORD_INTERNAL", "WORKER", "KVSTORE", "NAMESPACE"]
