{{/* Names and labels shared by every template. */}}

{{- define "evokube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name when it contains the chart name, else <release>-<chart>; 50 characters
at most, so that "<fullname>-dashboard" still fits a label value. */}}
{{- define "evokube.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "evokube.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "evokube.operatorName" -}}
{{- printf "%s-operator" (include "evokube.fullname" .) -}}
{{- end -}}

{{- define "evokube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "evokube.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "evokube.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: evokube
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selects the operator's pod; never changes across upgrades (Deployment selectors are immutable). */}}
{{- define "evokube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "evokube.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "evokube.operatorLabels" -}}
{{ include "evokube.labels" . }}
app.kubernetes.io/name: {{ include "evokube.name" . }}-operator
app.kubernetes.io/component: operator
{{- end -}}

{{- define "evokube.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces whose trainer pods the PodMonitor scrapes; empty means all. */}}
{{- define "evokube.trainerNamespaces" -}}
{{- toJson (default .Values.watchNamespaces .Values.podMonitor.namespaces) -}}
{{- end -}}

{{/*
The operator's permissions: the one list of them. templates/rbac.yaml binds
these rules; the operator tests and tests/helm render and apply them; docs/helm.md
tables them and tests/helm proves `kubectl auth can-i` grants nothing more.
*/}}

{{/* Rules every watched namespace needs (a ClusterRole's when watching all). */}}
{{- define "evokube.namespacedRules" -}}
# Watch experiments (Kopf writes nothing to them: event handlers only); the TTL deletes;
# a sweep creates its children.
- apiGroups: [evokube.io]
  resources: [erlexperiments]
  verbs: [get, list, watch, create, delete]
- apiGroups: [evokube.io]
  resources: [erlexperiments/status]
  verbs: [get, patch]
# Watch sweeps (event handlers only, as experiments) and write their status.
- apiGroups: [evokube.io]
  resources: [erlsweeps]
  verbs: [get, list, watch]
- apiGroups: [evokube.io]
  resources: [erlsweeps/status]
  verbs: [get, patch]
# Owner references with blockOwnerDeletion need this where that admission plugin runs.
- apiGroups: [evokube.io]
  resources: [erlexperiments/finalizers, erlsweeps/finalizers]
  verbs: [update]
# One Indexed Job per gang attempt; the old attempt's Job is deleted.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
# Multislice gangs: one JobSet per attempt instead (docs/multislice.md).
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, delete]
# One manifest ConfigMap per gang attempt, deleted with the attempt's Job.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch, delete]
# Read-only: which host runs, how each exited.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Read-only: a checkpoint claim must carry the opt-in label evokube.io/checkpoint-claim.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Owned objects: created; when the name is taken, read, and applied only if the experiment owns it.
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create, patch]
# The trainer's Role grants get/patch on erlexperiments/status, which the
# operator holds itself (above), so no escalate or bind verb is needed.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch]
# One NetworkPolicy per experiment (networkPolicy.enabled): only its gang reaches it.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [list, create, patch]
# Read-only: what Kueue says of a queued Job's Workload (the Queued condition's reason).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
{{- end -}}

{{/* Rules that only exist cluster-wide. */}}
{{- define "evokube.clusterRules" -}}
# Kopf finds the ERLExperiment resource by watching CRDs.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
# Read-only: a namespace's annotations list the Secrets and ConfigMaps its experiments may use
# (evokube.io/trainer-secrets, evokube.io/trainer-configmaps); with watchNamespaces, Kopf also
# follows the watched namespaces being created and deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: {{ if .Values.watchNamespaces }}[get, list, watch]{{ else }}[get]{{ end }}
{{- end -}}

{{/* A label map as k=v,k=v, for NOTES.txt. */}}
{{- define "evokube.inlineLabels" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}
{{- $pairs = append $pairs (printf "%s=%v" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* The operator's user name as the API server sees it (admission policies). */}}
{{- define "evokube.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "evokube.serviceAccountName" .) -}}
{{- end -}}

{{/* An admission policy binding's matchResources: the watched namespaces, or all. */}}
{{- define "evokube.policyMatchResources" -}}
{{- if .Values.watchNamespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: {{ toJson .Values.watchNamespaces }}
{{- else }}
matchResources: {}
{{- end }}
{{- end -}}

{{/*
The MutatingAdmissionPolicy version the server serves: admissionregistration.k8s.io/v1
(Kubernetes 1.36+), v1beta1 where a 1.34 or 1.35 server has it turned on, else empty.
Every supported server lists ValidatingAdmissionPolicy (GA in 1.30); where the list
lacks it, no server was asked (`helm template`): then the Kubernetes version
(--kube-version) decides.
*/}}
{{- define "evokube.mutatingPolicyVersion" -}}
{{- $apis := .Capabilities.APIVersions -}}
{{- if $apis.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- if $apis.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1
{{- else if $apis.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1beta1
{{- end -}}
{{- else if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
admissionregistration.k8s.io/v1
{{- end -}}
{{- end -}}

{{/*
Which trainer hosts hold an API token for status.progress and status.result: the
operator's --trainer-token. host-0: a MutatingAdmissionPolicy mounts it into host 0;
every-host (no MutatingAdmissionPolicy served): the Job mounts it everywhere and a
ValidatingAdmissionPolicy lets host 0 alone write; none: admission.trainerToken false.
*/}}
{{- define "evokube.trainerTokenMode" -}}
{{- if not .Values.admission.trainerToken -}}
none
{{- else if include "evokube.mutatingPolicyVersion" . -}}
host-0
{{- else -}}
every-host
{{- end -}}
{{- end -}}
