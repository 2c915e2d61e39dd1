{{/*
Names. The full name is cut at 40 characters so that the longest derived name,
"<fullname>-coordinator-internal", stays a valid DNS label (63).
*/}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "strata.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The coordinator's public Service (gated by readiness). */}}
{{- define "strata.coordinatorName" -}}
{{- printf "%s-coordinator" (include "strata.fullname" .) }}
{{- end }}

{{/* The coordinator's internal Service: workers register there before anything is ready. */}}
{{- define "strata.coordinatorInternalName" -}}
{{- printf "%s-coordinator-internal" (include "strata.fullname" .) }}
{{- end }}

{{/* The workers' StatefulSet or LeaderWorkerSet and their headless Service. */}}
{{- define "strata.workerName" -}}
{{- printf "%s-worker" (include "strata.fullname" .) }}
{{- end }}

{{- define "strata.kvstoreName" -}}
{{- printf "%s-kvstore" (include "strata.fullname" .) }}
{{- end }}

{{/*
The fully qualified name of a Service, which the daemons dial. Certificates are checked
against it, and gRPC accepts a wildcard name (*.F-worker.NS.svc.DOMAIN, the workers') only
when a dot follows the wildcard's label: "*.F-worker" would never match.
(dict "ctx" $ "name" "F-worker")
*/}}
{{- define "strata.serviceHost" -}}
{{- printf "%s.%s.svc.%s" .name .ctx.Release.Namespace .ctx.Values.clusterDomain }}
{{- end }}

{{/*
Labels: the Kubernetes recommended labels. Call with (dict "ctx" $ "component" "worker").
*/}}
{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "strata.labels" -}}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/version: {{ include "strata.imageTag" .ctx | quote }}
app.kubernetes.io/part-of: strata
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "strata.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "strata.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "strata.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "strata.imageTag" .) }}
{{- end }}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strata.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Security switches. Each prints "true" or nothing, for use in `if`.
*/}}
{{- define "strata.clusterTls" -}}
{{- if and (not .Values.insecureDevMode) .Values.tls.cluster.enabled }}true{{ end }}
{{- end }}

{{- define "strata.publicTls" -}}
{{- if and (not .Values.insecureDevMode) .Values.tls.public.enabled }}true{{ end }}
{{- end }}

{{- define "strata.auth" -}}
{{- if and (not .Values.insecureDevMode) .Values.auth.enabled }}true{{ end }}
{{- end }}

{{- define "strata.certManager" -}}
{{- if and .Values.tls.certManager.enabled (or (include "strata.clusterTls" .) (include "strata.publicTls" .)) }}true{{ end }}
{{- end }}

{{/* Secret names: the value when set, else the chart's convention. (dict "ctx" $ "component" "worker") */}}
{{- define "strata.clusterTlsSecret" -}}
{{- $given := get .ctx.Values.tls.cluster.existingSecrets .component }}
{{- if and $given (not .ctx.Values.tls.certManager.enabled) }}
{{- $given }}
{{- else }}
{{- printf "%s-%s-cluster-tls" (include "strata.fullname" .ctx) .component }}
{{- end }}
{{- end }}

{{- define "strata.publicTlsSecret" -}}
{{- if and .Values.tls.public.existingSecret (not .Values.tls.certManager.enabled) }}
{{- .Values.tls.public.existingSecret }}
{{- else }}
{{- printf "%s-public-tls" (include "strata.fullname" .) }}
{{- end }}
{{- end }}

{{- define "strata.apiTokensSecret" -}}
{{- if .Values.auth.tokens }}
{{- printf "%s-api-tokens" (include "strata.fullname" .) }}
{{- else }}
{{- default (printf "%s-api-tokens" (include "strata.fullname" .)) .Values.auth.existingSecret }}
{{- end }}
{{- end }}

{{/* Where the Secrets are mounted; the flags name files under these. */}}
{{- define "strata.clusterTlsDir" -}}/etc/strata/cluster-tls{{- end }}
{{- define "strata.publicTlsDir" -}}/etc/strata/public-tls{{- end }}
{{- define "strata.apiTokensDir" -}}/etc/strata/api-tokens{{- end }}

{{/*
Flags every daemon takes: the health port, the drain timeout, and mTLS for the internal RPCs
(or --insecure-cluster when the values ask for plaintext). Call with (dict "ctx" $ "drain" N).
*/}}
{{- define "strata.commonArgs" -}}
- --health-listen=0.0.0.0:{{ int .ctx.Values.ports.health }}
- --drain-timeout-s={{ int .drain }}
{{- if include "strata.clusterTls" .ctx }}
- --cluster-ca={{ include "strata.clusterTlsDir" . }}/ca.crt
- --cluster-cert={{ include "strata.clusterTlsDir" . }}/tls.crt
- --cluster-key={{ include "strata.clusterTlsDir" . }}/tls.key
{{- else }}
- --insecure-cluster
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the drain timeout plus a margin, so that the kubelet never kills
a daemon that is still finishing its work. (dict "drain" N "extra" M)
*/}}
{{- define "strata.terminationGrace" -}}
{{- add (int .drain) (int .extra) }}
{{- end }}

{{/*
Probes: kubelet gRPC probes on the plaintext health port. Liveness and startup ask for the
server ("" service); readiness for the component's own service, which is NOT_SERVING until the
daemon is ready and while it drains. (dict "ctx" $ "service" "strata.v1.Worker")
*/}}
{{- define "strata.probes" -}}
{{- $p := .ctx.Values.probes -}}
startupProbe:
  grpc:
    port: {{ int .ctx.Values.ports.health }}
    service: ""
  periodSeconds: {{ int $p.startup.periodSeconds }}
  failureThreshold: {{ int $p.startup.failureThreshold }}
  timeoutSeconds: {{ int $p.startup.timeoutSeconds }}
readinessProbe:
  grpc:
    port: {{ int .ctx.Values.ports.health }}
    service: {{ .service | quote }}
  periodSeconds: {{ int $p.readiness.periodSeconds }}
  failureThreshold: {{ int $p.readiness.failureThreshold }}
  timeoutSeconds: {{ int $p.readiness.timeoutSeconds }}
livenessProbe:
  grpc:
    port: {{ int .ctx.Values.ports.health }}
    service: ""
  periodSeconds: {{ int $p.liveness.periodSeconds }}
  failureThreshold: {{ int $p.liveness.failureThreshold }}
  timeoutSeconds: {{ int $p.liveness.timeoutSeconds }}
{{- end }}

{{/* The pod-level fields every component shares. (dict "ctx" $ "values" .Values.worker) */}}
{{- define "strata.podCommon" -}}
serviceAccountName: {{ include "strata.serviceAccountName" .ctx }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The container-level fields every component shares. */}}
{{- define "strata.containerCommon" -}}
image: {{ include "strata.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.containerSecurityContext | nindent 2 }}
{{- end }}

{{/* Volumes every component mounts: /tmp (the root file system is read-only) and the cluster certificate. (dict "ctx" $ "component" "worker") */}}
{{- define "strata.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if include "strata.clusterTls" .ctx }}
- name: cluster-tls
  secret:
    secretName: {{ include "strata.clusterTlsSecret" . }}
    defaultMode: 0440
    items:
      - {key: ca.crt, path: ca.crt}
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end }}

{{- define "strata.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "strata.clusterTls" . }}
- name: cluster-tls
  mountPath: {{ include "strata.clusterTlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The model volume: the existing claim, read-only. */}}
{{- define "strata.modelVolume" -}}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
    readOnly: true
{{- end }}

{{- define "strata.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{/* --model: the checkpoint's directory under the mount. */}}
{{- define "strata.modelDir" -}}
{{- if .Values.model.dir }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimAll "/" .Values.model.dir) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* A number as a flag value: integers without an exponent (YAML numbers arrive as float64). */}}
{{- define "strata.number" -}}
{{- if eq (float64 .) (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}
