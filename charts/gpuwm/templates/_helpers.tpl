{{/* Names and labels shared by every object. */}}

{{- define "gpuwm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuwm.controllerName" -}}
{{- printf "%s-controller" (include "gpuwm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwm.agentName" -}}
{{- printf "%s-agent" (include "gpuwm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuwm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuwm
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "controller"). */}}
{{- define "gpuwm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwm.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuwm.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpuwm.controllerServiceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "gpuwm.controllerName" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpuwm.agentServiceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "gpuwm.agentName" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The port of a HOST:PORT value. */}}
{{- define "gpuwm.port" -}}
{{- splitList ":" . | last | int -}}
{{- end -}}

{{- define "gpuwm.controllerReplicas" -}}
{{- if .Values.standalone -}}1{{- else -}}{{ .Values.controller.replicas }}{{- end -}}
{{- end -}}

{{/*
gpuwm's settings (gpuwm.config.Settings), by Helm value name. Each becomes GPUWM_<SNAKE_CASE>
in both containers; a test fails when a Settings field is missing here or in values.yaml.
*/}}
{{- define "gpuwm.settingNames" -}}
logFormat logLevel interval idleThresholdPercent projectLabel lateEventWindow listen nodeName podResourcesSocket kubeletUrl procRoot kubeletTokenFile kubeletInsecureTls resourceNames workloadKinds snapshotBufferSamples nvmlBufferReadSeconds namespace statusInterval snapshotMerge retention agents store stateSaveInterval stateSecret idleConditionAfter underutilizedPercent statusWritesPerSecond statusCountersRefresh timeSlicedReplicas devicePluginConfig standalone liveness peeringName peeringPriority auth apiListen apiTls apiTlsCertFile apiTlsKeyFile apiTlsSecret apiTlsDnsNames apiTokenAudience apiMaxPointsPerResponse apiMaxConcurrentQueries apiMaxConcurrentQueriesPerUser apiQueryQueueSeconds apiAuthCacheEntries apiAuthReviewsPerClientPerSecond apiTokenReviewsPerSecond apiTrustedProxies runaiCompatibleMetrics clusterId runaiUserLabel storeRollups storeLatestRowsPerInterval idlePolicies pricing
{{- end -}}

{{/* One settings value as an env string: lists comma-joined, objects as JSON, whole numbers without exponent. */}}
{{- define "gpuwm.settingString" -}}
{{- $value := . -}}
{{- if kindIs "map" $value -}}
{{- toJson $value -}}
{{- else if kindIs "slice" $value -}}
{{- join "," $value -}}
{{- else if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) -}}
{{- if eq (float64 $value) (floor $value) -}}{{- int64 $value -}}{{- else -}}{{- $value -}}{{- end -}}
{{- else -}}
{{- $value | toString -}}
{{- end -}}
{{- end -}}

{{/*
env entries for gpuwm's settings; call with (dict "root" $ "overrides" (dict "procRoot" "/host/proc")).
nodeName is read from NODE_NAME (its settings alias) and defaults to the pod's node.
*/}}
{{- define "gpuwm.settingsEnv" -}}
{{- $root := .root -}}
{{- $overrides := .overrides | default dict -}}
{{- range $name := splitList " " (include "gpuwm.settingNames" $root) }}
{{- $value := index $root.Values $name -}}
{{- if hasKey $overrides $name }}{{ $value = index $overrides $name }}{{ end -}}
{{- if eq $name "nodeName" }}
- name: NODE_NAME
{{- if $value }}
  value: {{ $value | quote }}
{{- else }}
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- else if eq $name "agents" }}
- name: GPUWM_AGENTS
  value: {{ default (printf "pods:%s/app.kubernetes.io/component=agent" $root.Release.Namespace) $value | quote }}
{{- else if and (not (kindIs "invalid" $value)) (ne (toString $value) "") }}
- name: {{ printf "GPUWM_%s" ($name | snakecase | upper) }}
  value: {{ include "gpuwm.settingString" $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuwm.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpuwm.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The Secret holding the API's HTTPS certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "gpuwm.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "gpuwm.controllerName" .)) .Values.controller.tls.secretName -}}
{{- end -}}

{{/* Whether the controller mounts that Secret: HTTPS on, a Secret source, no certificate file of the user's own. */}}
{{- define "gpuwm.mountsTlsSecret" -}}
{{- if and .Values.apiTls (not .Values.apiTlsCertFile) (ne .Values.controller.tls.source "selfSigned") -}}true{{- end -}}
{{- end -}}

{{/* Whether the controller keeps its own certificate in a Secret: HTTPS on, source selfSigned, no certificate file. */}}
{{- define "gpuwm.keepsTlsSecret" -}}
{{- if and .Values.apiTls (not .Values.apiTlsCertFile) (eq .Values.controller.tls.source "selfSigned") -}}true{{- end -}}
{{- end -}}

{{/* The Secret the controller keeps its certificate in (apiTlsSecret, else <release>-controller-tls). */}}
{{- define "gpuwm.keptTlsSecretName" -}}
{{- default (include "gpuwm.tlsSecretName" .) .Values.apiTlsSecret -}}
{{- end -}}

{{/* The Secret whose ca.crt verifies the API: the kept one (selfSigned) or the mounted one; empty with neither. */}}
{{- define "gpuwm.caSecretName" -}}
{{- if include "gpuwm.keepsTlsSecret" . -}}{{ include "gpuwm.keptTlsSecretName" . }}
{{- else if include "gpuwm.mountsTlsSecret" . -}}{{ include "gpuwm.tlsSecretName" . }}
{{- end -}}
{{- end -}}

{{/* The Secret where the leading controller keeps its engine state (stateSecret, else <release>-controller-state). */}}
{{- define "gpuwm.stateSecretName" -}}
{{- default (printf "%s-state" (include "gpuwm.controllerName" .)) .Values.stateSecret -}}
{{- end -}}

{{/* The DNS names of the API's Service, for its certificate. */}}
{{- define "gpuwm.serviceDnsNames" -}}
{{- $service := include "gpuwm.controllerName" . -}}
{{- list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) | toJson -}}
{{- end -}}
