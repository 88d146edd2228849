{{/* Names and labels. */}}
{{- define "engram.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "engram.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: engram.selector (dict "root" $ "component" "apply") */}}
{{- define "engram.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "engram.secretName" -}}
{{- default (printf "%s-secrets" (include "engram.fullname" .)) .Values.secrets.name -}}
{{- end -}}

{{- define "engram.claimName" -}}
{{- default (printf "%s-data" (include "engram.fullname" .)) .Values.persistence.existingClaim -}}
{{- end -}}

{{/* CPUs of a limit ("2", "1500m", 2) as a decimal number of CPUs: ENGRAM_CPU_LIMIT. */}}
{{- define "engram.cpus" -}}
{{- $cpu := toString . -}}
{{- if hasSuffix "m" $cpu -}}
{{- divf (trimSuffix "m" $cpu | float64) 1000 -}}
{{- else -}}
{{- $cpu -}}
{{- end -}}
{{- end -}}

{{/*
The environment of every Engram container: the ConfigMap (no secret in it), the secrets this component
uses by secretKeyRef, then the workload's own non-secret variables.
engram.env (dict "root" $ "component" "apply" "env" .env "resources" .resources)
*/}}
{{- define "engram.env" -}}
{{- $root := .root -}}
envFrom:
  - configMapRef:
      name: {{ include "engram.fullname" $root }}-config
env:
{{- range $key, $spec := $root.Values.secrets.keys }}
{{- if has $.component $spec.components }}
  - name: {{ $key }}
    valueFrom:
      secretKeyRef:
        name: {{ include "engram.secretName" $root }}
        key: {{ $key }}
        optional: {{ $spec.optional }}
{{- end }}
{{- end }}
{{- with .resources }}{{ with .limits }}{{ with .cpu }}
  # Prefork pools size to this many CPUs (the cgroup quota would give the same; explicit is deterministic).
  - name: ENGRAM_CPU_LIMIT
    value: {{ include "engram.cpus" . | quote }}
{{- end }}{{ end }}{{ end }}
{{- range $key, $value := .env }}
{{- if hasKey $root.Values.secrets.keys $key }}
{{- fail (printf "%s is a secret: set it in the Secret (secrets.keys), not in env" $key) }}
{{- end }}
  - name: {{ $key }}
    value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every workload shares. */}}
{{- define "engram.podSpec" -}}
automountServiceAccountToken: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .spec.terminationGracePeriodSeconds }}
{{- with .spec.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {{ include "engram.claimName" .root }}
  - name: tmp
    emptyDir:
      sizeLimit: {{ .root.Values.tmpSizeLimit }}
{{- with .root.Values.redisTls.caSecret }}
  - name: redis-ca
    secret:
      secretName: {{ . }}
      items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- end -}}

{{- define "engram.volumeMounts" -}}
volumeMounts:
  - name: data
    mountPath: {{ .Values.dataDir }}
  - name: tmp
    mountPath: /tmp
{{- if .Values.redisTls.caSecret }}
  - name: redis-ca
    mountPath: /etc/engram/redis-ca
    readOnly: true
{{- end }}
{{- end -}}

{{- define "engram.image" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}

{{/* An exec probe: engram.execProbe (dict "command" "live" "role" "apply" "timing" .Values.probes.liveness "root" $) */}}
{{- define "engram.execProbe" -}}
exec:
  command: [engram, probe, {{ .command }}, --role, {{ .role }}, --max-age, {{ .root.Values.probes.heartbeatMaxAge | quote }}]
{{- toYaml .timing | nindent 0 }}
{{- end -}}

{{/* `engram migrate` before a process that uses Neo4j starts (the processes only check the schema's
version and refuse another one): the first pod migrates, every later start is a no-op of one read. */}}
{{- define "engram.migrateInit" -}}
{{- if and .root.Values.neo4j.uri .root.Values.migrate.initContainer (not .root.Values.migrate.job.enabled) }}
initContainers:
  - name: migrate
    {{- include "engram.image" .root | nindent 4 }}
    command: [engram]
    args: [migrate]
    {{- include "engram.env" (dict "root" .root "component" .component "env" dict "resources" dict) | nindent 4 }}
    {{- include "engram.volumeMounts" .root | nindent 4 }}
    resources:
      {{- toYaml .spec.resources | nindent 6 }}
    securityContext:
      {{- toYaml .root.Values.securityContext | nindent 6 }}
{{- end }}
{{- end }}
