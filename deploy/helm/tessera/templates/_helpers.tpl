{{/*
Helpers shared by the templates. The chart sticks to the template subset documented in
README.md, so that `tessera-deploy-check` can render it where Helm is not installed.
*/}}

{{- define "tessera.name" -}}
{{ default .Chart.Name .Values.nameOverride }}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels that select this release's pods (add app.kubernetes.io/component). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessera.coordinator.name" -}}
{{ .Release.Name }}-coordinator
{{- end -}}

{{- define "tessera.agent.name" -}}
{{ .Release.Name }}-agent
{{- end -}}

{{- define "tessera.coordinator.image" -}}
{{ .Values.coordinator.image.repository }}:{{ .Values.coordinator.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.agent.image" -}}
{{ .Values.agent.image.repository }}:{{ .Values.agent.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The username the agents' ServiceAccount tokens review as. */}}
{{- define "tessera.agent.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "tessera.agent.name" . }}
{{- end -}}

{{/* The username the coordinator's ServiceAccount acts as. */}}
{{- define "tessera.coordinator.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "tessera.coordinator.name" . }}
{{- end -}}
