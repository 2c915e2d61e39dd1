{{/*
The worker pod template, shared by the StatefulSet and the LeaderWorkerSet. One pod is one
pipeline stage: one strata-worker process on one GPU.
*/}}
{{- define "strata.workerPodTemplate" -}}
{{- $w := .Values.workers }}
{{- $gpu := eq $w.device "gpu" -}}
metadata:
  labels:
    {{- include "strata.labels" (dict "ctx" $ "component" "worker") | nindent 4 }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $w.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "strata.podCommon" (dict "ctx" $ "values" $w) | nindent 2 }}
  terminationGracePeriodSeconds: {{ include "strata.terminationGrace" (dict "drain" $w.drainTimeoutSeconds "extra" $w.terminationGraceExtraSeconds) }}
  containers:
    - name: worker
      {{- include "strata.containerCommon" . | nindent 6 }}
      command: [strata-worker]
      args:
        - --coordinator={{ include "strata.serviceHost" (dict "ctx" $ "name" (include "strata.coordinatorInternalName" .)) }}:{{ int .Values.ports.internal }}
        - --listen=0.0.0.0:{{ int .Values.ports.worker }}
        - --advertise=$(POD_NAME).{{ include "strata.serviceHost" (dict "ctx" $ "name" (include "strata.workerName" .)) }}:{{ int .Values.ports.worker }}
        - --name=$(POD_NAME)
        - --model-root={{ .Values.model.mountPath }}
        {{- if $gpu }}
        - --device=gpu
        - --gpu=0
        - --gpu-kv-bytes={{ int64 $w.gpuKvBytes }}
        {{- else }}
        - --device=cpu
        {{- end }}
        - --threads={{ int $w.threads }}
        {{- if and .Values.metrics.enabled .Values.metrics.workers }}
        - --metrics-listen=0.0.0.0:{{ int .Values.ports.metrics }}
        {{- end }}
        {{- include "strata.commonArgs" (dict "ctx" $ "drain" $w.drainTimeoutSeconds) | nindent 8 }}
        {{- with $w.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        {{- range $k, $v := $w.nccl }}
        - name: {{ $k }}
          value: {{ $v | quote }}
        {{- end }}
      ports:
        - name: grpc-worker
          containerPort: {{ int .Values.ports.worker }}
          protocol: TCP
        - name: grpc-health
          containerPort: {{ int .Values.ports.health }}
          protocol: TCP
        {{- if and .Values.metrics.enabled .Values.metrics.workers }}
        - name: metrics
          containerPort: {{ int .Values.ports.metrics }}
          protocol: TCP
        {{- end }}
      {{- include "strata.probes" (dict "ctx" $ "service" "strata.v1.Worker") | nindent 6 }}
      resources:
        {{- $res := deepCopy (default dict $w.resources) }}
        {{- if $gpu }}
        {{- $limits := default dict $res.limits }}
        {{- $_ := set $limits $w.gpuResource 1 }}
        {{- $_ := set $res "limits" $limits }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      volumeMounts:
        {{- include "strata.commonMounts" . | nindent 8 }}
        {{- include "strata.modelMount" . | nindent 8 }}
        - name: shm
          mountPath: /dev/shm
  volumes:
    {{- include "strata.commonVolumes" (dict "ctx" $ "component" "worker") | nindent 4 }}
    {{- include "strata.modelVolume" . | nindent 4 }}
    # NCCL and CUDA IPC use shared memory; the runtime's default /dev/shm is 64 MiB.
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shmSize }}
{{- end }}
