// Validates rendered Kubernetes objects against the API's schemas, offline: kubernetes-models
// (the Kubernetes OpenAPI schemas compiled to validators) for the built-in kinds and
// @kubernetes-models/cert-manager for Certificate and Issuer. The LeaderWorkerSet has no
// published model: its fields are checked against the leaderworkerset.x-k8s.io/v1 types here,
// and its pod template against the core PodTemplateSpec schema.
//
// The compiled schemas accept fields they do not know; this script also reports those, by
// watching which fields each validator reads: a field of an object that the validator neither
// read nor enumerated (as it does for maps such as labels) is not in the schema — a typo like
// readOnlyRootFileSystem.
//
// Input (stdin): JSON [{"source": "...", "doc": {...}}, ...]. Output: one line per failure,
// then "validated N objects"; exit 1 on any failure. First it checks itself on objects that
// must fail, so that it can never pass everything by accident.

import { validate as deployment } from "kubernetes-models/_schemas/IoK8sApiAppsV1Deployment";
import { validate as statefulSet } from "kubernetes-models/_schemas/IoK8sApiAppsV1StatefulSet";
import { validate as service } from "kubernetes-models/_schemas/IoK8sApiCoreV1Service";
import { validate as serviceAccount } from "kubernetes-models/_schemas/IoK8sApiCoreV1ServiceAccount";
import { validate as secret } from "kubernetes-models/_schemas/IoK8sApiCoreV1Secret";
import { validate as pdb } from "kubernetes-models/_schemas/IoK8sApiPolicyV1PodDisruptionBudget";
import { validate as podTemplateSpec } from "kubernetes-models/_schemas/IoK8sApiCoreV1PodTemplateSpec";
import { validate as pvc } from "kubernetes-models/_schemas/IoK8sApiCoreV1PersistentVolumeClaim";
import { validate as configMap } from "kubernetes-models/_schemas/IoK8sApiCoreV1ConfigMap";
import { validate as objectMeta } from "@kubernetes-models/apimachinery/_schemas/IoK8sApimachineryPkgApisMetaV1ObjectMeta";
// The cert-manager package does not export its schemas; they are imported by file (the version is pinned).
import { validate as certificate } from "./node_modules/@kubernetes-models/cert-manager/_schemas/ComGithubCertManagerCertManagerPkgApisCertmanagerV1Certificate.js";
import { validate as issuer } from "./node_modules/@kubernetes-models/cert-manager/_schemas/ComGithubCertManagerCertManagerPkgApisCertmanagerV1Issuer.js";

// Wraps obj in proxies that record, per object, the keys read and whether its keys were listed.
function watch(obj, path, seen) {
  if (obj === null || typeof obj !== "object") return obj;
  const st = { read: new Set(), listed: false, obj };
  seen.push([path, st]);
  const inner = Array.isArray(obj)
    ? obj.map((v, i) => watch(v, `${path}/${i}`, seen))
    : Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, watch(v, `${path}/${k}`, seen)]));
  return new Proxy(inner, {
    get(t, k, r) { if (typeof k === "string") st.read.add(k); return Reflect.get(t, k, r); },
    has(t, k) { if (typeof k === "string") st.read.add(k); return Reflect.has(t, k); },
    ownKeys(t) { st.listed = true; return Reflect.ownKeys(t); },
  });
}

// Runs a compiled validator strictly: its own errors plus the fields it did not know.
function strict(validator, obj, path) {
  const seen = [];
  const ok = validator(watch(obj, "", seen));
  const out = ok ? [] : validator.errors.map((e) => `${path}${e.instancePath} ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`);
  for (const [p, st] of seen) {
    if (Array.isArray(st.obj) || st.listed) continue;
    for (const k of Object.keys(st.obj)) if (!st.read.has(k)) out.push(`${path}${p}/${k}: unknown field`);
  }
  return out;
}

// leaderworkerset.x-k8s.io/v1 (LeaderWorkerSetSpec and LeaderWorkerTemplate).
function leaderWorkerSet(doc) {
  const out = [];
  const only = (o, keys, where) => {
    if (o === null || typeof o !== "object" || Array.isArray(o)) { out.push(`${where}: not an object`); return false; }
    for (const k of Object.keys(o)) if (!keys.includes(k)) out.push(`${where}/${k}: unknown field`);
    return true;
  };
  const int = (v, where, min) => { if (v !== undefined && (!Number.isInteger(v) || v < min)) out.push(`${where}: ${v} is not an integer >= ${min}`); };
  const oneOf = (v, allowed, where) => { if (v !== undefined && !allowed.includes(v)) out.push(`${where}: ${v} is not one of ${allowed}`); };
  only(doc, ["apiVersion", "kind", "metadata", "spec"], "");
  out.push(...strict(objectMeta, doc.metadata, "/metadata"));
  const s = doc.spec;
  if (!only(s, ["replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"], "/spec")) return out;
  int(s.replicas, "/spec/replicas", 0);
  oneOf(s.startupPolicy, ["LeaderCreated", "LeaderReady"], "/spec/startupPolicy");
  if (s.networkConfig !== undefined && only(s.networkConfig, ["subdomainPolicy"], "/spec/networkConfig")) {
    oneOf(s.networkConfig.subdomainPolicy, ["Shared", "UniquePerReplica"], "/spec/networkConfig/subdomainPolicy");
  }
  if (s.rolloutStrategy !== undefined) only(s.rolloutStrategy, ["type", "rollingUpdateConfiguration"], "/spec/rolloutStrategy");
  const t = s.leaderWorkerTemplate;
  if (!only(t, ["leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy", "volumeClaimTemplates",
    "persistentVolumeClaimRetentionPolicy"], "/spec/leaderWorkerTemplate")) return out;
  int(t.size, "/spec/leaderWorkerTemplate/size", 1);
  oneOf(t.restartPolicy, ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"],
    "/spec/leaderWorkerTemplate/restartPolicy");
  if (t.workerTemplate === undefined) out.push("/spec/leaderWorkerTemplate/workerTemplate: required");
  for (const k of ["workerTemplate", "leaderTemplate"]) {
    if (t[k] !== undefined) out.push(...strict(podTemplateSpec, t[k], `/spec/leaderWorkerTemplate/${k}`));
  }
  (t.volumeClaimTemplates ?? []).forEach((c, i) => out.push(...strict(pvc, c, `/spec/leaderWorkerTemplate/volumeClaimTemplates/${i}`)));
  return out;
}

// monitoring.coreos.com/v1 ServiceMonitor (the Prometheus Operator's): the fields the chart sets.
function serviceMonitor(doc) {
  const out = [];
  const only = (o, keys, where) => {
    if (o === null || typeof o !== "object" || Array.isArray(o)) { out.push(`${where}: not an object`); return false; }
    for (const k of Object.keys(o)) if (!keys.includes(k)) out.push(`${where}/${k}: unknown field`);
    return true;
  };
  only(doc, ["apiVersion", "kind", "metadata", "spec"], "");
  out.push(...strict(objectMeta, doc.metadata, "/metadata"));
  const s = doc.spec;
  if (!only(s, ["selector", "endpoints", "namespaceSelector", "jobLabel"], "/spec")) return out;
  if (only(s.selector, ["matchLabels", "matchExpressions"], "/spec/selector")) {
    for (const [k, v] of Object.entries(s.selector.matchLabels ?? {})) {
      if (typeof v !== "string") out.push(`/spec/selector/matchLabels/${k}: not a string`);
    }
  }
  if (!Array.isArray(s.endpoints) || s.endpoints.length === 0) out.push("/spec/endpoints: required, a list");
  (s.endpoints ?? []).forEach((e, i) => {
    const w = `/spec/endpoints/${i}`;
    if (!only(e, ["port", "path", "scheme", "interval", "scrapeTimeout", "bearerTokenSecret", "tlsConfig"], w)) return;
    if (typeof e.port !== "string") out.push(`${w}/port: a port name is required`);
    if (e.scheme !== undefined && !["http", "https"].includes(e.scheme)) out.push(`${w}/scheme: ${e.scheme}`);
    if (e.interval !== undefined && !/^[0-9]+(ms|s|m|h)$/.test(e.interval)) out.push(`${w}/interval: ${e.interval}`);
  });
  return out;
}

const KINDS = {
  "v1/ConfigMap": (d) => strict(configMap, d, ""),
  "monitoring.coreos.com/v1/ServiceMonitor": serviceMonitor,
  "apps/v1/Deployment": (d) => strict(deployment, d, ""),
  "apps/v1/StatefulSet": (d) => strict(statefulSet, d, ""),
  "v1/Service": (d) => strict(service, d, ""),
  "v1/ServiceAccount": (d) => strict(serviceAccount, d, ""),
  "v1/Secret": (d) => strict(secret, d, ""),
  "policy/v1/PodDisruptionBudget": (d) => strict(pdb, d, ""),
  "cert-manager.io/v1/Certificate": (d) => strict(certificate, d, ""),
  "cert-manager.io/v1/Issuer": (d) => strict(issuer, d, ""),
  "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet": leaderWorkerSet,
};

function validate(doc) {
  const key = `${doc.apiVersion}/${doc.kind}`;
  const check = KINDS[key];
  if (!check) return [`no schema for ${key}`];
  const out = check(doc);
  if (!doc.metadata?.name) out.push("/metadata/name: required");
  return out;
}

// Objects that must fail: a misspelt field, a wrong type, a missing required field, an unknown
// field inside a LeaderWorkerSet's pod template, an unknown kind.
const pod = { metadata: { labels: { a: "b" } }, spec: { containers: [{ name: "c", image: "i" }] } };
const SELF_TEST = [
  { apiVersion: "apps/v1", kind: "Deployment", metadata: { name: "x" },
    spec: { selector: { matchLabels: { a: "b" } }, template: { ...pod, spec: { containers: [{ name: "c", image: "i", securityContext: { readOnlyRootFileSystem: true } }] } } } },
  { apiVersion: "v1", kind: "Service", metadata: { name: "x" }, spec: { ports: [{ port: "http" }] } },
  { apiVersion: "apps/v1", kind: "StatefulSet", metadata: { name: "x" }, spec: { selector: {}, template: { spec: { containers: [{ image: "i" }] } } } },
  { apiVersion: "leaderworkerset.x-k8s.io/v1", kind: "LeaderWorkerSet", metadata: { name: "x" },
    spec: { leaderWorkerTemplate: { size: 2, workerTemplate: { ...pod, spec: { ...pod.spec, hostnetwork: true } } } } },
  { apiVersion: "v1", kind: "Pod", metadata: { name: "x" }, spec: pod.spec },
];

const input = JSON.parse(await new Promise((resolve) => {
  let s = "";
  process.stdin.on("data", (c) => { s += c; }).on("end", () => resolve(s));
}));
let failures = 0;
for (const [i, doc] of SELF_TEST.entries()) {
  if (validate(doc).length === 0) { console.log(`self-test ${i} (${doc.kind}) passed but must fail`); failures++; }
}
for (const { source, doc } of input) {
  for (const e of validate(doc)) { console.log(`${source}: ${doc.kind} ${doc.metadata?.name}: ${e}`); failures++; }
}
console.log(`validated ${input.length} objects, ${SELF_TEST.length} self-test objects; ${failures} failures`);
process.exit(failures ? 1 : 0);
