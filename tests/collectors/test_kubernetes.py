"""Discovery through the Kubernetes API, its own logic: the config's errors, which pods
become targets and how they are named, the kubeconfig and in-cluster readers, and the
requests against a local stand-in of the API (tests/collectors/kubernetes_api.py: no real
API server can run here). The whole path against twin replicas: test_kubernetes_fleet.py."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
from pathlib import Path

import pytest

from collectors import kubernetes
from collectors.discovery import current
from collectors.kubernetes import (
    KubeconfigError,
    KubernetesApiError,
    container_port,
    discover,
    from_kubeconfig,
    targets_from,
)
from kneepoint.config import ConfigError, KubernetesDiscovery, parse_config
from tests.collectors.kubernetes_api import KubernetesApi, kubeconfig, pod, selects

TOKEN = "kp-test-token-6f1c2b9a8e"  # a made-up bearer token, looked for in every message


def rules(text: str) -> KubernetesDiscovery:
    config = parse_config("discovery:\n  kubernetes:\n" + text)
    assert config.discovery is not None and config.discovery.kubernetes is not None
    return config.discovery.kubernetes


REPLICAS = """    replicas: {namespaces: [inference], selector: "app=vllm", port: metrics,
               engine: vllm, name: "{namespace}.{pod}"}
    gpu_nodes: {selector: "app=nvidia-dcgm-exporter", port: 9400, name: "dcgm-{node}"}
"""


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("discovery: {kubernetes: {}}", "discovery.kubernetes: needs replicas or gpu_nodes"),
        (
            "discovery: {kubernetes: {replicas: {selector: 'app=vllm', port: 8000}}}",
            "discovery.kubernetes.replicas.name: is required",
        ),
        (
            "discovery: {kubernetes: {replicas: {port: 8000, name: '{pod}'}}}",
            "discovery.kubernetes.replicas.selector: is required",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: 'app=v llm', port: 1, name: '{pod}'}}}",
            "discovery.kubernetes.replicas.selector: is not a label selector",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: 'a=b,', port: 1, name: '{pod}'}}}",
            "discovery.kubernetes.replicas.selector: is not a label selector",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: a, port: 70000, name: '{pod}'}}}",
            "discovery.kubernetes.replicas.port: must be a port number (1 to 65535)",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: a, port: 'Metrics!', name: '{pod}'}}}",
            "discovery.kubernetes.replicas.port: must be a port number or a container port's",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: a, port: 1, "
            "name: '{namespace}/{pod}'}}}",
            "discovery.kubernetes.replicas.name: holds '/'",
        ),
        (
            "discovery: {kubernetes: {replicas: {selector: a, port: 1, name: '{pod}', "
            "engine: dcgm}}}",
            "discovery.kubernetes.replicas.engine:",
        ),
        (
            "discovery: {kubernetes: {gpu_nodes: {selector: a, port: 1, name: '{node}', "
            "engine: vllm}}}",
            "discovery.kubernetes.gpu_nodes.engine: is not a known key",
        ),
        (
            "discovery: {kubernetes: {context: prod, gpu_nodes: {selector: a, port: 1, "
            "name: '{node}'}}}",
            "discovery.kubernetes: context is a kubeconfig's: give kubeconfig too",
        ),
        (
            "discovery: {kubernetes: {replicas: {namespaces: [Inference], selector: a, "
            "port: 1, name: '{pod}'}}}",
            "discovery.kubernetes.replicas.namespaces[0]:",
        ),
        (
            "prometheus: {url: 'http://p:9090'}\ndiscovery: {kubernetes: {replicas: "
            "{selector: a, port: 1, name: '{pod}', engine: sglang}}}",
            "discovery.kubernetes.replicas.engine sglang cannot be read through prometheus:",
        ),
    ],
)
def test_config_errors_are_one_sentence_naming_the_key(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert error in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_kubernetes_only_config_needs_no_prometheus() -> None:
    found = rules(REPLICAS)
    assert found.kubeconfig is None, "omitted: the pod's service account"
    assert found.replicas is not None and found.replicas.port == "metrics"
    assert found.gpu_nodes is not None and found.gpu_nodes.port == 9400
    assert (found.replicas.path, found.replicas.scheme) == ("/metrics", "http")


@pytest.mark.parametrize(
    ("selector", "labels", "chosen"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app==vllm,tier!=canary", {"app": "vllm", "tier": "canary"}, False),
        ("app in (vllm, sglang)", {"app": "sglang"}, True),
        ("app notin (vllm),!canary", {"app": "tgi"}, True),
        ("gpu", {"app": "x"}, False),
    ],
)
def test_the_stand_in_selects_as_the_api_server_does(
    selector: str, labels: dict[str, str], chosen: bool
) -> None:
    # The config accepts what the stand-in (and the API server) understands.
    rules(f"    replicas: {{selector: '{selector}', port: 1, name: '{{pod}}'}}\n")
    assert selects(selector, labels) is chosen


def test_running_pods_with_an_ip_become_targets_named_by_their_labels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = rules(REPLICAS)
    assert found.replicas is not None
    labels = {"app": "vllm", "model": "qwen"}
    pods = [
        pod("qwen-0", "inference", labels, 8000),
        pod("qwen-1", "inference", labels, 8001, ip="fd00::7"),
        pod("pending-0", "inference", labels, 8002, ip=None, phase="Pending"),
        pod("done-0", "inference", labels, 8003, phase="Succeeded"),
        pod("other-0", "inference", labels, 8004, port_name="web"),  # no `metrics` port
    ]
    with caplog.at_level(logging.WARNING):
        targets = targets_from(found.replicas, "vllm", pods)
    assert [(t.name, t.kind, t.url.reveal()) for t in targets] == [
        ("inference.qwen-0", "vllm", "http://127.0.0.1:8000/metrics"),
        ("inference.qwen-1", "vllm", "http://[fd00::7]:8001/metrics"),
    ]
    assert (targets[0].pod, targets[0].namespace, targets[0].instance) == (
        "qwen-0",
        "inference",
        "127.0.0.1:8000",
    )
    assert "pod inference/other-0 has no container port 'metrics'" in caplog.text
    # The template takes the pod's labels and its node; one it lacks leaves the pod out.
    named = rules(
        "    replicas: {selector: app, port: 9000, scheme: https, path: /m, "
        "name: '{model}-{node}-{pod}'}\n"
    )
    assert named.replicas is not None
    target = targets_from(named.replicas, "auto", pods[:1])[0]
    assert (target.name, target.url.reveal()) == (
        "qwen-gpu-node-1-qwen-0",
        "https://127.0.0.1:9000/m",
    )
    unnamed = rules("    replicas: {selector: app, port: 1, name: '{zone}.{pod}'}\n")
    assert unnamed.replicas is not None
    with caplog.at_level(logging.WARNING):
        assert targets_from(unnamed.replicas, "vllm", pods[:1]) == []
    assert "pod inference/qwen-0 has no 'zone' for its name" in caplog.text


def test_a_port_name_is_looked_up_among_every_containers_ports() -> None:
    entry = pod("a-0", "x", {}, 8123)
    assert container_port(entry, "metrics") == 8123
    assert container_port(entry, "http") == 1
    assert container_port(entry, "grpc") is None
    assert container_port(entry, 9400) == 9400


def test_a_kubeconfig_that_cannot_be_used_is_one_sentence(tmp_path: Path) -> None:
    def refused(path: Path, *args: str) -> str:
        with pytest.raises(KubeconfigError) as caught:
            from_kubeconfig(path, *args)
        assert "\n" not in str(caught.value)
        assert TOKEN not in str(caught.value)
        return str(caught.value)

    missing = tmp_path / "none.yaml"
    assert f"kubeconfig {missing}: cannot be read (No such file or directory)" in refused(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("clusters: [")
    assert "is not valid YAML" in refused(broken)
    good = kubeconfig(tmp_path / "kube.yaml", "https://10.0.0.1:6443", TOKEN)
    assert "has no context named 'prod'" in refused(good, "prod")
    text = good.read_text()
    plugin = tmp_path / "plugin.yaml"
    plugin.write_text(text.replace(f"token: {TOKEN}", "exec: {command: aws}"))
    assert "signs in through a plugin (exec or auth-provider)" in refused(plugin)
    no_server = tmp_path / "noserver.yaml"
    no_server.write_text(text.replace("server: https://10.0.0.1:6443", "server: ''"))
    assert "cluster 'local' has no https:// or http:// server" in refused(no_server)
    bad_ca = kubeconfig(
        tmp_path / "ca.yaml", "https://h:1", TOKEN, **{"certificate-authority": "x.pem"}
    )
    assert "its certificates cannot be loaded" in refused(bad_ca)
    # `kneepoint collect` says it at start and exits 2, naming the key.
    from typer.testing import CliRunner

    from kneepoint.cli import app

    config = tmp_path / "kneepoint.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'k.db'}\n"
        f"discovery: {{kubernetes: {{kubeconfig: '{plugin}', "
        "replicas: {selector: app=vllm, port: 8000, name: '{pod}'}}}\n"
    )
    result = CliRunner().invoke(app, ["collect", "--once", "--config", str(config)])
    assert result.exit_code == 2
    assert "discovery.kubernetes.kubeconfig" in result.output
    assert "signs in through a plugin" in result.output


def test_pods_are_listed_with_the_token_by_selector_and_namespace_page_by_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes, "PAGE", 2)  # three pods: two pages
    with KubernetesApi(TOKEN) as api:
        vllm = {"app": "vllm"}
        api.pods = [
            pod("a-0", "inference", vllm, 8001),
            pod("b-0", "inference", vllm, 8002),
            pod("c-0", "inference", vllm, 8003),
            pod("d-0", "batch", vllm, 8004),  # another namespace
            pod("e-0", "inference", {"app": "web"}, 8005),  # another app
            pod("dcgm-x", "gpu-operator", {"app": "nvidia-dcgm-exporter"}, 9400, node="n1"),
        ]
        path = kubeconfig(tmp_path / "kube.yaml", api.url, TOKEN)
        found = rules(f"    kubeconfig: '{path}'\n" + REPLICAS)
        targets = discover(found)
    assert [t.name for t in targets] == [
        "inference.a-0",
        "inference.b-0",
        "inference.c-0",
        "dcgm-n1",
    ]
    assert {t.kind for t in targets[:3]} == {"vllm"} and targets[3].kind == "dcgm"
    paths = [(p, q.get("labelSelector"), q.get("continue")) for p, q, _ in api.requests]
    assert paths == [
        ("/api/v1/namespaces/inference/pods", ["app=vllm"], None),
        ("/api/v1/namespaces/inference/pods", ["app=vllm"], ["2"]),
        ("/api/v1/pods", ["app=nvidia-dcgm-exporter"], None),
    ]
    assert {auth for _, _, auth in api.requests} == {f"Bearer {TOKEN}"}, "the token is sent"


def test_a_refused_token_and_an_outage_are_said_without_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with KubernetesApi("another-token") as api:
        path = kubeconfig(tmp_path / "kube.yaml", api.url, TOKEN)
        found = rules(f"    kubeconfig: '{path}'\n" + REPLICAS)
        with pytest.raises(KubernetesApiError) as refused:
            discover(found)
    assert "HTTP 401: Unauthorized; is its token valid?" in str(refused.value)
    with pytest.raises(KubernetesApiError) as gone:
        discover(found)  # the API no longer answers
    assert f"the Kubernetes API at {api.url} cannot be read (ConnectError" in str(gone.value)
    # Through discovery.current: one warning per outage, and the token in none of it.
    config = parse_config(f"discovery:\n  kubernetes:\n    kubeconfig: '{path}'\n" + REPLICAS)
    with caplog.at_level(logging.WARNING):
        assert current(config, 0.0).targets == []
        assert current(config, 0.0).targets == []
    lines = [r.getMessage() for r in caplog.records if "discovery" in r.getMessage()]
    assert len(lines) == 1 and "no targets found yet" in lines[0]
    for text in (str(refused.value), str(gone.value), caplog.text):
        assert TOKEN not in text


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as a cluster's CA-signed serving cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_in_cluster_the_service_account_token_and_ca_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(cert.read_bytes())
    monkeypatch.setattr(kubernetes, "SERVICE_ACCOUNT", account)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    found = rules(REPLICAS)
    with pytest.raises(KubeconfigError, match="this is not a pod in a cluster"):
        discover(found)
    with KubernetesApi(TOKEN, tls=(cert, key)) as api:
        api.pods = [pod("a-0", "inference", {"app": "vllm"}, 8001)]
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        with pytest.raises(KubeconfigError, match="has no service account token"):
            discover(found)
        (account / "token").write_text("an-old-token\n")
        with pytest.raises(KubernetesApiError, match="HTTP 401"):
            discover(found)
        (account / "token").write_text(TOKEN + "\n")  # rotated: read again each time
        assert [t.name for t in discover(found)] == ["inference.a-0"]
        (account / "ca.crt").write_text("not a certificate\n")
        with pytest.raises(KubeconfigError, match=r"serviceaccount/ca.crt cannot be loaded"):
            discover(found)
        # The API's certificate is checked against the service account's CA.
        other = tmp_path / "other"
        other.mkdir()
        (account / "ca.crt").write_bytes(self_signed(other)[0].read_bytes())
        with pytest.raises(KubernetesApiError, match=r"CERTIFICATE_VERIFY_FAILED|SSL"):
            discover(found)
        # And a kubeconfig's inline CA (certificate-authority-data) serves too.
        data = base64.b64encode(cert.read_bytes()).decode()
        path = kubeconfig(
            tmp_path / "kube.yaml", api.url, TOKEN, **{"certificate-authority-data": data}
        )
        assert [t.name for t in discover(rules(f"    kubeconfig: '{path}'\n" + REPLICAS))] == [
            "inference.a-0"
        ]
