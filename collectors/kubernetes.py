"""Discovery through the Kubernetes API, for direct scraping where there is no Prometheus:
the running pods a rule selects (namespaces, label selector) become targets at
`scheme://podIP:port/path`, replicas (their engine's kind) and GPU nodes (dcgm-exporter),
named by a template over the pod's labels and its `namespace`, `pod` and `node`. A replica
carries its pod and namespace, so dcgm-exporter's `pod`/`namespace` labels join its GPUs.

The API is read with httpx (already kneepoint's HTTP client) and a small kubeconfig reader,
not the official `kubernetes` package: measured here, that package is 126 MB installed and
brings ten more (aiohttp, requests-oauthlib, websocket-client, …) for the one request
discovery makes, `GET /api/v1/[namespaces/{ns}/]pods?labelSelector=…`, paged with `limit`
and `continue`. The reader takes what a service account or a CI kubeconfig uses: a context's
cluster (`server`, `certificate-authority[-data]`, `insecure-skip-tls-verify`,
`tls-server-name`) and user (`token`, `tokenFile`, `client-certificate[-data]` with
`client-key[-data]`, `username`/`password`); an `exec` or `auth-provider` user (a cloud
CLI's plugin) is refused with a sentence saying so. Without `kubeconfig:` the pod's own
service account is used (KUBERNETES_SERVICE_HOST/PORT, its token, re-read each time as
Kubernetes rotates it, and its ca.crt).

The token is a Secret: it is only ever put in the Authorization header, and an error says
what failed (the API's status and message, or the connection's) without it.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from collectors.target_names import MissingLabel, render, usable_name
from kneepoint.config import ConfigError, KubernetesDiscovery, KubernetesRule, Target
from kneepoint.secrets import Secret, SecretURL

log = logging.getLogger(__name__)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PAGE = 500  # pods per request; more follow with `continue`


class KubeconfigError(ConfigError):
    """The kubeconfig (or the in-cluster service account) cannot be used; one sentence."""


class KubernetesApiError(Exception):
    """The Kubernetes API could not be read; the message says why in one sentence."""


@dataclass(frozen=True)
class Connection:
    """How to reach one API server: its URL, TLS, and credentials."""

    server: str
    verify: ssl.SSLContext | bool
    token: Secret | None = None
    token_file: Path | None = None
    basic: tuple[str, Secret] | None = None
    server_name: str | None = None  # the name its certificate is checked for (tls-server-name)

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file is not None:
            try:
                token = Secret(self.token_file.read_text(encoding="utf-8").strip())
            except OSError as error:
                raise KubeconfigError(
                    f"cannot read the token file {self.token_file}: {error.strerror or error}"
                ) from None
        if token:
            return {"Authorization": f"Bearer {token.reveal()}"}
        return {}

    def auth(self) -> httpx.BasicAuth | None:
        if self.basic is None:
            return None
        return httpx.BasicAuth(self.basic[0], self.basic[1].reveal())


def connection(config: KubernetesDiscovery) -> Connection:
    """The API server and credentials: from the kubeconfig, else the pod's service account."""
    if config.kubeconfig is None:
        return in_cluster()
    return from_kubeconfig(Path(config.kubeconfig).expanduser(), config.context)


def in_cluster() -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError(
            "discovery.kubernetes: no kubeconfig is given and this is not a pod in a cluster "
            "(KUBERNETES_SERVICE_HOST is not set); give discovery.kubernetes.kubeconfig"
        )
    token, ca = SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt"
    if not token.is_file():
        raise KubeconfigError(
            f"discovery.kubernetes: the pod has no service account token at {token} "
            "(is automountServiceAccountToken off?)"
        )
    try:
        context = _tls(ca_file=ca) if ca.is_file() else True
    except (OSError, ssl.SSLError) as error:
        raise KubeconfigError(
            f"discovery.kubernetes: the service account's {ca} cannot be loaded ({_reason(error)})"
        ) from None
    host = f"[{host}]" if ":" in host else host
    return Connection(f"https://{host}:{port}", context, token_file=token)


def from_kubeconfig(path: Path, context_name: str | None = None) -> Connection:
    """The connection of a kubeconfig's context (its current-context by default)."""

    def bad(what: str) -> KubeconfigError:
        return KubeconfigError(f"discovery.kubernetes.kubeconfig {path}: {what}")

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise bad(f"cannot be read ({error.strerror or error})") from None
    except yaml.YAMLError:
        raise bad("is not valid YAML") from None
    if not isinstance(doc, dict):
        raise bad("is not a kubeconfig (a mapping with clusters, users and contexts)")
    name = context_name or doc.get("current-context")
    if not name:
        raise bad("has no current-context; give discovery.kubernetes.context")
    context = _named(doc, "contexts", "context", str(name), bad)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not cluster_name:
        raise bad(f"context {name!r} names no cluster")
    cluster = _named(doc, "clusters", "cluster", str(cluster_name), bad)
    user = _named(doc, "users", "user", str(user_name), bad) if user_name else {}
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise bad(f"cluster {cluster_name!r} has no https:// or http:// server")
    base = path.parent

    def file(key: str, section: dict[str, Any]) -> Path | None:
        value = section.get(key)
        return None if not value else (base / str(value)).expanduser()

    def data(key: str, section: dict[str, Any]) -> bytes | None:
        value = section.get(key)
        if not value:
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            raise bad(f"{key} is not base64") from None

    if user.get("exec") or user.get("auth-provider"):
        raise bad(
            f"user {user_name!r} signs in through a plugin (exec or auth-provider), which "
            "kneepoint does not run; give it a service account's token instead"
        )
    verify: ssl.SSLContext | bool = True
    if server.startswith("https://"):
        if cluster.get("insecure-skip-tls-verify"):
            verify = False
        try:
            verify = _tls(
                ca_file=file("certificate-authority", cluster),
                ca_data=data("certificate-authority-data", cluster),
                cert_file=file("client-certificate", user),
                cert_data=data("client-certificate-data", user),
                key_file=file("client-key", user),
                key_data=data("client-key-data", user),
                verify=verify is not False,
            )
        except (OSError, ssl.SSLError) as error:
            raise bad(f"its certificates cannot be loaded ({_reason(error)})") from None
    token = Secret(str(user["token"])) if user.get("token") else None
    token_file = file("tokenFile", user)
    basic = None
    if user.get("username") and user.get("password"):
        basic = (str(user["username"]), Secret(str(user["password"])))
    server_name = cluster.get("tls-server-name")
    return Connection(
        server, verify, token, token_file, basic, str(server_name) if server_name else None
    )


def _named(doc: dict[str, Any], key: str, field: str, name: str, bad: Any) -> dict[str, Any]:
    for entry in doc.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(field) or {}
            if not isinstance(found, dict):
                raise bad(f"{field} {name!r} is not a mapping")
            return found
    raise bad(f"has no {field} named {name!r}")


def _tls(
    ca_file: Path | None = None,
    ca_data: bytes | None = None,
    cert_file: Path | None = None,
    cert_data: bytes | None = None,
    key_file: Path | None = None,
    key_data: bytes | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    if ca_data is not None:
        context.load_verify_locations(cadata=ca_data.decode("ascii", "replace"))
    if cert_file is not None or cert_data is not None:
        with _as_files(cert_file, cert_data, key_file, key_data) as (cert, key):
            context.load_cert_chain(cert, key)
    return context


@contextlib.contextmanager
def _as_files(
    cert_file: Path | None, cert_data: bytes | None, key_file: Path | None, key_data: bytes | None
) -> Iterator[tuple[str, str | None]]:
    """The client certificate and key as files (ssl loads only files); inline data is
    written to private temporary files, removed once loaded."""
    with tempfile.TemporaryDirectory() as folder:

        def path(given: Path | None, inline: bytes | None, name: str) -> str | None:
            if given is not None:
                return str(given)
            if inline is None:
                return None
            written = Path(folder) / name
            written.touch(mode=0o600)
            written.write_bytes(inline)
            return str(written)

        cert = path(cert_file, cert_data, "cert.pem")
        assert cert is not None
        yield cert, path(key_file, key_data, "key.pem")


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)


def list_pods(
    client: httpx.Client, rule: KubernetesRule, connection: Connection
) -> list[dict[str, Any]]:
    """The pods the rule selects, of every namespace it names (of all, when none)."""
    paths = (
        [f"/api/v1/namespaces/{ns}/pods" for ns in rule.namespaces]
        if rule.namespaces
        else ["/api/v1/pods"]
    )
    pods: list[dict[str, Any]] = []
    for path in paths:
        token = ""
        while True:
            params = {"labelSelector": rule.selector, "limit": str(PAGE)}
            if token:
                params["continue"] = token
            body = _get(client, connection, path, params)
            pods.extend(p for p in body.get("items") or [] if isinstance(p, dict))
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                break
    return pods


def _get(
    client: httpx.Client, connection: Connection, path: str, params: dict[str, str]
) -> dict[str, Any]:
    where = f"{connection.server}{path}"
    try:
        response = client.get(
            where,
            params=params,
            headers=connection.headers(),
            auth=connection.auth(),
            extensions={"sni_hostname": connection.server_name} if connection.server_name else {},
        )
    except httpx.HTTPError as error:
        raise KubernetesApiError(
            f"the Kubernetes API at {connection.server} cannot be read "
            f"({type(error).__name__}: {_reason(error) or 'no answer'})"
        ) from None
    if response.status_code != 200:
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(response.json().get("message") or "")[:200]
        hint = {
            401: "; is its token valid?",
            403: "; does its role allow list on pods?",
        }.get(response.status_code, "")
        raise KubernetesApiError(
            f"the Kubernetes API refused GET {path}: HTTP {response.status_code}"
            f"{': ' + message if message else ''}{hint}"
        )
    try:
        body = response.json()
    except ValueError:
        raise KubernetesApiError(f"the Kubernetes API's answer to GET {path} is not JSON") from None
    if not isinstance(body, dict) or body.get("kind") not in ("PodList", None):
        raise KubernetesApiError(f"the Kubernetes API's answer to GET {path} is not a PodList")
    return body


def pod_labels(pod: dict[str, Any]) -> dict[str, str]:
    """What a name template may use: the pod's labels, then its namespace, name and node."""
    meta = pod.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    for key, value in (
        ("namespace", meta.get("namespace")),
        ("pod", meta.get("name")),
        ("node", (pod.get("spec") or {}).get("nodeName")),
    ):
        if value:
            labels[key] = str(value)
    return labels


def container_port(pod: dict[str, Any], port: int | str) -> int | None:
    """The port number: the rule's own, or the pod's container port of that name."""
    if isinstance(port, int):
        return port
    for container in (pod.get("spec") or {}).get("containers") or []:
        for entry in container.get("ports") or []:
            if entry.get("name") == port and entry.get("containerPort"):
                return int(entry["containerPort"])
    return None


def targets_from(rule: KubernetesRule, kind: str, pods: list[dict[str, Any]]) -> list[Target]:
    """The targets of the running pods with an IP, first of a name wins; a pod whose name or
    port cannot be made is left out, with a warning. In name order, whatever the API's order."""
    found: dict[str, Target] = {}
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip:
            continue
        labels = pod_labels(pod)
        where = f"{labels.get('namespace', '?')}/{labels.get('pod', '?')}"
        try:
            name = render(rule.name, labels)
        except MissingLabel as missing:
            log.warning("discovery: pod %s has no %s for its name; left out", where, missing)
            continue
        if not usable_name(name):
            log.warning("discovery: %r is not a usable target name; left out", name)
            continue
        port = container_port(pod, rule.port)
        if port is None:
            log.warning("discovery: pod %s has no container port %r; left out", where, rule.port)
            continue
        if name in found:
            continue
        host = f"[{ip}]" if ":" in str(ip) else str(ip)
        found[name] = Target(
            name=name,
            kind=kind,  # type: ignore[arg-type]
            url=SecretURL(f"{rule.scheme}://{host}:{port}{rule.path}"),
            instance=f"{host}:{port}",
            pod=labels.get("pod"),
            namespace=labels.get("namespace"),
        )
    return sorted(found.values(), key=lambda target: target.name)


def discover(config: KubernetesDiscovery) -> list[Target]:
    """The replicas and GPU nodes the API's pods give now. Raises KubeconfigError (the
    credentials cannot be used) or KubernetesApiError (the API cannot be read)."""
    link = connection(config)
    found: list[Target] = []
    with httpx.Client(verify=link.verify, timeout=config.timeout) as client:
        if config.replicas is not None:
            pods = list_pods(client, config.replicas, link)
            found.extend(targets_from(config.replicas, config.replicas.engine, pods))
        if config.gpu_nodes is not None:
            pods = list_pods(client, config.gpu_nodes, link)
            found.extend(targets_from(config.gpu_nodes, "dcgm", pods))
    return found
