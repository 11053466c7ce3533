{{/* Chart name, truncated to 63 chars. */}}
{{- define "agentserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name prefix for the chart's own objects. */}}
{{- define "agentserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "agentserve.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "agentserve.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "agentserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "agentserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agentserve.operatorSelector" -}}
app.kubernetes.io/name: {{ include "agentserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "agentserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentserve.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{/* The Ray pods' image; called with (dict "root" $ "gpu" <any model asks for GPUs>):
default tag "<appVersion>-cuda" (docker/Dockerfile.cuda) for GPU models, "<appVersion>"
(docker/Dockerfile, vLLM's CPU build) for CPU-only ones. */}}
{{- define "agentserve.servingImage" -}}
{{- $tag := ternary (printf "%s-cuda" .root.Chart.AppVersion) .root.Chart.AppVersion .gpu }}
{{- printf "%s:%s" .root.Values.servingImage.repository (default $tag .root.Values.servingImage.tag) }}
{{- end }}

{{- define "agentserve.apiKeySecret" -}}
{{- .Values.apiKeys.existingSecret | default (default (printf "%s-api-keys" .Release.Name) .Values.apiKeys.secretName) }}
{{- end }}

{{/* The first AgentServe's spec: agentServe.spec, with `model`, a default tenant, the key
Secret and the serving image filled in where the spec leaves them out. */}}
{{- define "agentserve.firstSpec" -}}
{{- $spec := deepCopy (.Values.agentServe.spec | default dict) }}
{{- if not $spec.models }}
{{- $_ := set $spec "models" (list (include "agentserve.model" . | fromYaml)) }}
{{- end }}
{{- if not $spec.tenants }}
{{- $_ := set $spec "tenants" (list (dict "name" .Values.apiKeys.tenant "sla" dict)) }}
{{- end }}
{{- $kube := deepCopy ($spec.kubernetes | default dict) }}
{{- if not $kube.api_key_secret }}
{{- $_ := set $kube "api_key_secret" (include "agentserve.apiKeySecret" .) }}
{{- end }}
{{- if not $kube.image }}
{{- $gpus := 0 }}
{{- range $spec.models }}
{{- $gpus = add $gpus (dig "replicas" "num_gpus" 0 .) }}
{{- end }}
{{- $_ := set $kube "image" (include "agentserve.servingImage" (dict "root" . "gpu" (gt (int $gpus) 0))) }}
{{- $_ := set $kube "image_pull_policy" .Values.servingImage.pullPolicy }}
{{- end }}
{{- $claim := include "agentserve.hubCacheClaim" . }}
{{- if and $claim (not $kube.hub_cache) }}
{{- $_ := set $kube "hub_cache" (dict "claim_name" $claim "mount_path" .Values.hubCache.mountPath) }}
{{- end }}
{{- if and .Values.hfToken.secretName (not $kube.hf_token_secret) }}
{{- $_ := set $kube "hf_token_secret" .Values.hfToken.secretName }}
{{- $_ := set $kube "hf_token_key" .Values.hfToken.key }}
{{- end }}
{{- $_ := set $spec "kubernetes" $kube }}
{{- toYaml $spec }}
{{- end }}

{{/* `model` with the chart's device default: a model whose replicas leave num_gpus unset
gets modelDefaults.numGpus GPUs (1: the chart serves on GPU nodes), except the bundled CPU
demo (source `bundled`), which stays on CPU. */}}
{{- define "agentserve.model" -}}
{{- $model := deepCopy (.Values.model | default dict) }}
{{- $replicas := deepCopy ($model.replicas | default dict) }}
{{- if and (not (hasKey $replicas "num_gpus")) (ne (toString $model.source) "bundled") }}
{{- $_ := set $replicas "num_gpus" (int .Values.modelDefaults.numGpus) }}
{{- $_ := set $model "replicas" $replicas }}
{{- end }}
{{- toYaml $model }}
{{- end }}

{{/* Refuse an external Service type (LoadBalancer, NodePort) for the OpenAI endpoint: it
is plain HTTP, API keys and prompts in clear. Use ingress (TLS), or acknowledge with
service.allowPlaintext. */}}
{{- define "agentserve.checkExposure" -}}
{{- $type := dig "kubernetes" "service_type" "ClusterIP" (.Values.agentServe.spec | default dict) }}
{{- if and (has $type (list "LoadBalancer" "NodePort")) (not .Values.service.allowPlaintext) }}
{{- fail (printf "agentServe.spec.kubernetes.service_type %s exposes the OpenAI endpoint in plain HTTP (API keys and prompts in clear): keep ClusterIP and set ingress.enabled with ingress.tls (or ingress.certManager), or acknowledge with service.allowPlaintext=true" $type) }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.tls.secretName) (not .Values.ingress.certManager.clusterIssuer) (not .Values.ingress.certManager.issuer) (not .Values.service.allowPlaintext) }}
{{- fail "ingress.enabled without TLS: set ingress.tls.secretName (a kubernetes.io/tls Secret) or ingress.certManager.clusterIssuer / issuer, or acknowledge plain HTTP with service.allowPlaintext=true" }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches, as JSON: operator.watchNamespaces plus the release
namespace when the chart creates its AgentServe there (else nobody would reconcile it);
[] = all namespaces. */}}
{{- define "agentserve.watchNamespaces" -}}
{{- $ns := .Values.operator.watchNamespaces | default list }}
{{- if and $ns (include "agentserve.firstEnabled" .) (not (has .Release.Namespace $ns)) }}
{{- $ns = append $ns .Release.Namespace }}
{{- end }}
{{- toJson $ns }}
{{- end }}

{{/* Whether the chart creates the first AgentServe. */}}
{{- define "agentserve.firstEnabled" -}}
{{- if and .Values.agentServe.enabled (or .Values.model.source (.Values.agentServe.spec | default dict).models) }}true{{ end }}
{{- end }}

{{/* The operator's rules on namespaced objects (a ClusterRole's or a Role's). */}}
{{- define "agentserve.operatorRules" }}
  - apiGroups: [agentserve.dev]
    resources: [agentserves]
    verbs: [get, list, watch, patch]
  - apiGroups: [agentserve.dev]
    resources: [agentserves/status]
    verbs: [get, patch]
  # children's owner references set blockOwnerDeletion: the OwnerReferencesPermissionEnforcement
  # admission plugin (OpenShift) refuses them without update on the owner's finalizers
  - apiGroups: [agentserve.dev]
    resources: [agentserves/finalizers]
    verbs: [update]
  - apiGroups: [ray.io]
    resources: [rayservices]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [""]
    resources: [configmaps, services]
    verbs: [get, create, patch, delete]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, create, patch, delete]
  # the model replica pods' PodDisruptionBudget (kubernetes.worker_max_unavailable)
  - apiGroups: [policy]
    resources: [poddisruptionbudgets]
    verbs: [get, create, patch, delete]
  # get: key Secrets and the labels of referenced ones; create: each AgentServe's key salt
  # (never update, patch or delete: the salt is owned by its AgentServe)
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, create]
  # the labels of referenced claims (model_volume, hub_cache)
  - apiGroups: [""]
    resources: [persistentvolumeclaims]
    verbs: [get]
  - apiGroups: [""]
    resources: [pods]
    verbs: [list]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [create, patch]
  - apiGroups: [monitoring.coreos.com]
    resources: [servicemonitors, podmonitors]
    verbs: [get, create, patch, delete]
{{- end }}

{{/* The Hugging Face cache claim of the first AgentServe: existing, created, or empty. */}}
{{- define "agentserve.hubCacheClaim" -}}
{{- if .Values.hubCache.existingClaim }}
{{- .Values.hubCache.existingClaim }}
{{- else if .Values.hubCache.create }}
{{- printf "%s-hf-cache" (include "agentserve.fullname" .) }}
{{- end }}
{{- end }}
