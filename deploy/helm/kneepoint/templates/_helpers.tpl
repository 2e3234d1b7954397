{{/* Names and labels. */}}
{{- define "kneepoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kneepoint.fullname" -}}
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

{{- define "kneepoint.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kneepoint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "kneepoint.selector" (list . "collector") */}}
{{- define "kneepoint.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "kneepoint.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "kneepoint.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kneepoint.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kneepoint.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kneepoint.secretName" -}}
{{- default (include "kneepoint.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* "true" when the database is PostgreSQL, else "". */}}
{{- define "kneepoint.postgresql" -}}
{{- if or .Values.database.postgresql .Values.database.url -}}true{{- end -}}
{{- end -}}

{{/* The address the app listens on: 0.0.0.0 only with sign-in that a Service may expose. */}}
{{- define "kneepoint.appHost" -}}
{{- $auth := .Values.config.auth -}}
{{- if not $auth -}}
127.0.0.1
{{- else if and (eq (toString $auth.mode) "proxy") (include "kneepoint.proxyOnLoopback" .) -}}
127.0.0.1
{{- else -}}
0.0.0.0
{{- end -}}
{{- end -}}

{{/* "true" when auth.mode proxy trusts loopback addresses only (the proxy is a sidecar). */}}
{{- define "kneepoint.proxyOnLoopback" -}}
{{- $trusted := list -}}
{{- with .Values.config.auth.proxy -}}{{- $trusted = .trusted | default list -}}{{- end -}}
{{- $loopback := true -}}
{{- range $trusted -}}
{{- if not (or (hasPrefix "127." (toString .)) (hasPrefix "::1" (toString .))) -}}{{- $loopback = false -}}{{- end -}}
{{- end -}}
{{- if and $trusted $loopback -}}true{{- end -}}
{{- end -}}

{{/* "true" when the app has a Service: it listens beyond loopback, or the sign-in proxy
trusted on loopback serves it from a sidecar. Without `auth:`, never. */}}
{{- define "kneepoint.appService" -}}
{{- if and .Values.app.enabled .Values.config.auth -}}
{{- if or (eq (include "kneepoint.appHost" .) "0.0.0.0") .Values.app.extraContainers -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the discovery rules list, plus rbac.namespaces, as a JSON list. */}}
{{- define "kneepoint.discoveryNamespaces" -}}
{{- $namespaces := list -}}
{{- with .Values.config.discovery -}}
{{- with .kubernetes -}}
{{- range $rule := list .replicas .gpu_nodes -}}
{{- if $rule -}}
{{- range ($rule.namespaces | default list) -}}{{- $namespaces = append $namespaces . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.rbac.namespaces -}}{{- $namespaces = append $namespaces . -}}{{- end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}

{{/* kneepoint.yaml: config plus the database the chart chose. */}}
{{- define "kneepoint.configFile" -}}
{{- $database := "sqlite:////var/lib/kneepoint/kneepoint.db" -}}
{{- if include "kneepoint.postgresql" . -}}{{- $database = "${KNEEPOINT_DATABASE_URL}" -}}{{- end -}}
{{- $config := merge (dict "database" $database) (deepCopy .Values.config) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* A value that must be a ${VAR} reference, never the secret itself. */}}
{{- define "kneepoint.secretRef" -}}
{{- $value := index . 1 -}}
{{- if and $value (not (regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}$" (toString $value))) -}}
{{- fail (printf "config.%s is written into the ConfigMap: give it as ${VAR} and put the value in secrets.values (or secrets.existingSecret) under VAR" (index . 0)) -}}
{{- end -}}
{{- end -}}

{{/* Every check that makes the render fail with one sentence. */}}
{{- define "kneepoint.validate" -}}
{{- $v := .Values -}}
{{- $postgresql := include "kneepoint.postgresql" . -}}
{{- if and (gt (int $v.collector.replicas) 1) (not $postgresql) -}}
{{- fail (printf "collector.replicas is %d, but several collectors share their work only on PostgreSQL: set database.url to a PostgreSQL URL (or database.postgresql: true with the URL in secrets.existingSecret as KNEEPOINT_DATABASE_URL), or keep collector.replicas at 1" (int $v.collector.replicas)) -}}
{{- end -}}
{{- if lt (int $v.collector.replicas) 1 -}}
{{- fail "collector.replicas must be at least 1" -}}
{{- end -}}
{{- if and $v.database.url (not (hasPrefix "postgresql" $v.database.url)) -}}
{{- fail "database.url must be a PostgreSQL URL (postgresql://… or postgresql+psycopg://…); leave it empty for SQLite on the persistence volume" -}}
{{- end -}}
{{- if and $v.database.url $v.secrets.existingSecret -}}
{{- fail "database.url is set together with secrets.existingSecret: put the URL into that Secret as KNEEPOINT_DATABASE_URL and set database.postgresql: true instead" -}}
{{- end -}}
{{- if and $v.database.postgresql (not $v.database.url) (not $v.secrets.existingSecret) -}}
{{- fail "database.postgresql is true but no URL is given: set database.url, or secrets.existingSecret holding KNEEPOINT_DATABASE_URL" -}}
{{- end -}}
{{- if and (not $postgresql) (not $v.persistence.enabled) $v.app.enabled -}}
{{- fail "persistence.enabled is false on SQLite: the collector's and the app's pods would each have an empty database of their own; enable persistence or use PostgreSQL (database.url)" -}}
{{- end -}}
{{- if hasKey $v.config "database" -}}
{{- fail "config.database is set by the chart: give database.url (kept in the Secret) instead" -}}
{{- end -}}
{{- if hasKey $v.secrets.values "KNEEPOINT_DATABASE_URL" -}}
{{- fail "secrets.values.KNEEPOINT_DATABASE_URL is set by the chart from database.url: set that instead" -}}
{{- end -}}
{{- range $i, $channel := ($v.config.channels | default list) -}}
{{- range $key := list "url" "secret" "token" "routing_key" -}}
{{- include "kneepoint.secretRef" (list (printf "channels[%d].%s" $i $key) (get $channel $key)) -}}
{{- end -}}
{{- range $name, $value := ($channel.headers | default dict) -}}
{{- include "kneepoint.secretRef" (list (printf "channels[%d].headers.%s" $i $name) $value) -}}
{{- end -}}
{{- end -}}
{{- range $i, $target := ($v.config.targets | default list) -}}
{{- range $name, $value := ($target.headers | default dict) -}}
{{- include "kneepoint.secretRef" (list (printf "targets[%d].headers.%s" $i $name) $value) -}}
{{- end -}}
{{- end -}}
{{- with $v.config.prometheus -}}
{{- range $name, $value := (.headers | default dict) -}}
{{- include "kneepoint.secretRef" (list (printf "prometheus.headers.%s" $name) $value) -}}
{{- end -}}
{{- end -}}
{{- with $v.config.heartbeat -}}
{{- include "kneepoint.secretRef" (list "heartbeat.url" .url) -}}
{{- end -}}
{{- with $v.config.auth -}}
{{- with .oidc -}}
{{- include "kneepoint.secretRef" (list "auth.oidc.client_secret" .client_secret) -}}
{{- include "kneepoint.secretRef" (list "auth.oidc.cookie_secret" .cookie_secret) -}}
{{- if and (gt (int $v.app.replicas) 1) (not .cookie_secret) -}}
{{- fail (printf "app.replicas is %d with auth.mode oidc but no auth.oidc.cookie_secret: each app pod would sign its cookies with a random secret of its own, and people would be signed out whenever they reach another; set cookie_secret: ${KNEEPOINT_COOKIE_SECRET} and put it in secrets.values" (int $v.app.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and (eq (toString .mode) "none") $v.app.enabled (not $v.app.allowNoSignIn) -}}
{{- fail "config.auth.mode is none: everyone who can reach the app's Service would use kneepoint without signing in; set auth.mode oidc or proxy, or app.allowNoSignIn: true to allow it" -}}
{{- end -}}
{{- if and (eq (toString .mode) "proxy") (include "kneepoint.proxyOnLoopback" $) (not $v.app.extraContainers) $v.app.enabled -}}
{{- fail "config.auth.mode is proxy trusting only loopback, so the proxy must run beside the app: add it to app.extraContainers and point app.service.targetPort at its port" -}}
{{- end -}}
{{- end -}}
{{- if not $v.secrets.existingSecret -}}
{{- $given := keys ($v.secrets.values | default dict) -}}
{{- range ($v.extraEnv | default list) -}}{{- $given = append $given .name -}}{{- end -}}
{{- if $postgresql -}}{{- $given = append $given "KNEEPOINT_DATABASE_URL" -}}{{- end -}}
{{- range (include "kneepoint.referencedVariables" $ | fromJsonArray) -}}
{{- if not (has . $given) -}}
{{- fail (printf "kneepoint.yaml uses ${%s}, which nothing sets: add %s to secrets.values (or extraEnv when it is not secret), or give a default as ${%s:-value}" . . .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $v.config.discovery -}}
{{- with .kubernetes -}}
{{- range $key := list "replicas" "gpu_nodes" -}}
{{- $rule := get $.Values.config.discovery.kubernetes $key -}}
{{- if and $rule (not $rule.namespaces) (not $.Values.rbac.clusterWide) $.Values.rbac.create -}}
{{- fail (printf "config.discovery.kubernetes.%s lists no namespaces, so it reads pods in every namespace: set rbac.clusterWide: true, or list its namespaces" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The environment every kneepoint container gets. */}}
{{- define "kneepoint.env" -}}
- name: KNEEPOINT_CONFIG
  value: /etc/kneepoint/kneepoint.yaml
- name: HOME
  value: /var/lib/kneepoint
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kneepoint.envFrom" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.values .Values.database.url -}}
- secretRef:
    name: {{ include "kneepoint.secretName" . }}
{{- end -}}
{{- end -}}

{{/* The ${VAR} names kneepoint.yaml uses without a default, as a JSON list. */}}
{{- define "kneepoint.referencedVariables" -}}
{{- $names := list -}}
{{- range (regexFindAll "\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}" (include "kneepoint.configFile" .) -1) -}}
{{- $names = append $names (trimSuffix "}" (trimPrefix "${" .)) -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* The volumes every kneepoint pod has: its config, /tmp, and /var/lib/kneepoint (the
SQLite database's claim, or an emptyDir on PostgreSQL where only reports land there). */}}
{{- define "kneepoint.volumes" -}}
- name: config
  configMap:
    name: {{ include "kneepoint.fullname" . }}
- name: tmp
  emptyDir: {}
- name: data
{{- if and (not (include "kneepoint.postgresql" .)) .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-data" (include "kneepoint.fullname" .)) .Values.persistence.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "kneepoint.volumeMounts" -}}
- name: config
  mountPath: /etc/kneepoint
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /var/lib/kneepoint
{{- end -}}

{{/* `kneepoint migrate` as a container (the hook Job's, or the collector's init container). */}}
{{- define "kneepoint.migrateContainer" -}}
- name: migrate
  image: {{ include "kneepoint.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [kneepoint, migrate]
  env:
    {{- include "kneepoint.env" . | nindent 4 }}
  {{- with (include "kneepoint.envFrom" .) }}
  envFrom:
    {{- . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml .Values.migrate.resources | nindent 4 }}
  volumeMounts:
    {{- include "kneepoint.volumeMounts" . | nindent 4 }}
{{- end -}}

{{/* "true" when the collector's init container migrates (SQLite, or no hook). */}}
{{- define "kneepoint.migrateInit" -}}
{{- if or (not .Values.migrate.hook) (not (include "kneepoint.postgresql" .)) -}}true{{- end -}}
{{- end -}}
