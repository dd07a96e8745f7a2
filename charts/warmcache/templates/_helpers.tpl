{{/* Labels every object of the chart carries. */}}
{{- define "warmcache.labels" -}}
app.kubernetes.io/name: warmcache
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "webhook"). */}}
{{- define "warmcache.selectorLabels" -}}
app.kubernetes.io/name: warmcache
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "warmcache.componentLabels" -}}
{{ include "warmcache.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "warmcache.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end }}

{{/* The Service names are fixed: the webhook configurations are generated from code with them. */}}
{{- define "warmcache.webhookService" -}}warmcache-webhook{{- end }}
{{- define "warmcache.kvcacheWebhookService" -}}kvcache-operator-webhook{{- end }}
{{- define "warmcache.tlsSecret" -}}warmcache-webhook-tls{{- end }}

{{/* Pod Security "restricted": the pod level. */}}
{{- define "warmcache.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Pod Security "restricted": the container level. */}}
{{- define "warmcache.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Environment every component gets: its namespace and name, logging, OpenTelemetry. */}}
{{- define "warmcache.env" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: WARMCACHE_LOG_FORMAT
  value: {{ .root.Values.log.format | quote }}
- name: RUST_LOG
  value: {{ .root.Values.log.level | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .component | quote }}
{{- with .root.Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $.root.Values.otel.protocol | quote }}
{{- end }}
{{- range $name, $value := .root.Values.otel.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* The admin port probes of every component. */}}
{{- define "warmcache.probes" -}}
livenessProbe:
  httpGet: {path: /livez, port: admin}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: admin}
  periodSeconds: 5
  failureThreshold: 2
{{- end }}

{{/*
The ServiceAccount, roles and bindings of one component: (dict "root" $ "component" "webhook").
The roles are generated from the component's code (files/rbac/<component>.*.yaml, `cargo xtask
gen`); this sets their namespaces and binds them to the component's ServiceAccount. An optional
"annotations" dict is put on every object (the uninstall hook's Helm hook annotations).
*/}}
{{- define "warmcache.rbac" -}}
{{- $root := .root -}}
{{- $component := .component -}}
{{- $annotations := .annotations -}}
{{- $name := printf "warmcache-%s" $component -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "warmcache.componentLabels" . | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: true
{{- range $suffix := list "clusterrole" "role" "control-role" }}
{{- $file := printf "files/rbac/%s.%s.yaml" $component $suffix }}
{{- $content := $root.Files.Get $file }}
{{- if $content }}
{{- $role := fromYaml $content }}
{{- $namespace := "" }}
{{- if eq $suffix "role" }}{{ $namespace = $root.Release.Namespace }}{{ end }}
{{- if eq $suffix "control-role" }}{{ $namespace = $root.Values.controlNamespace.name }}{{ end }}
{{- if $namespace }}{{ $_ := set $role.metadata "namespace" $namespace }}{{ end }}
{{- $_ := set $role.metadata "labels" (merge (fromYaml (include "warmcache.componentLabels" (dict "root" $root "component" $component))) $role.metadata.labels) }}
{{- with $annotations }}{{ $_ := set $role.metadata "annotations" . }}{{ end }}
---
{{ toYaml $role }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ if $namespace }}RoleBinding{{ else }}ClusterRoleBinding{{ end }}
metadata:
  name: {{ $role.metadata.name }}
  {{- with $namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "warmcache.componentLabels" (dict "root" $root "component" $component) | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ $role.kind }}
  name: {{ $role.metadata.name }}
subjects:
  - kind: ServiceAccount
    name: {{ $name }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- end }}

{{/* The reaper's rule flags, shared by its Deployment (`reaper run`) and the `reaper sweep` NOTES
shows, so an on-demand sweep applies the rules the Deployment does. */}}
{{- define "warmcache.reaperRuleArgs" -}}
{{- $v := .Values.reaper -}}
- --control-namespace={{ .Values.controlNamespace.name }}
- --idle-period={{ $v.idlePeriod }}
- --retention={{ $v.retention }}
- --abandon-after={{ $v.abandonAfter }}
- --orphan-claim-after={{ $v.orphanClaimAfter }}
- --retiring-grace={{ $v.retiringGrace }}
{{- end }}

{{/* The runtime's client-side rate limit flags from a component's kubeApi values. */}}
{{- define "warmcache.kubeApiArgs" -}}
- --kube-api-qps={{ .qps }}
- --kube-api-burst={{ .burst }}
{{- end }}
