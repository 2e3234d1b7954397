"""A local stand-in of the Kubernetes API's pod listing, for discovery tests (no real API
server can run here: Debian has no kube-apiserver package, and no prebuilt kube-apiserver
binary is available from the package registries here).

It answers `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods` as the API server
does: a PodList (kind, apiVersion, metadata.resourceVersion and `continue`, items), filtered
by the `labelSelector` (equality, inequality, existence and set requirements), paged by
`limit` and `continue`, and a 401 Status without the right bearer token. Its pods are shaped
as the API serves them (metadata.name/namespace/labels, spec.nodeName,
spec.containers[].ports[].name/containerPort, status.phase/podIP/podIPs)."""

from __future__ import annotations

import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_SET = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")


def pod(
    name: str,
    namespace: str,
    labels: dict[str, str],
    port: int,
    *,
    node: str = "gpu-node-1",
    ip: str | None = "127.0.0.1",
    phase: str = "Running",
    port_name: str = "metrics",
) -> dict[str, Any]:
    """One pod as `kubectl get pod -o json` shows it (the fields discovery reads, and some
    it does not)."""
    status: dict[str, Any] = {"phase": phase, "hostIP": "10.0.0.1", "qosClass": "Burstable"}
    if ip is not None:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": "1",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/default-container": "main"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "default",
            "containers": [
                {"name": "sidecar", "image": "busybox", "ports": []},
                {
                    "name": "main",
                    "image": "vllm/vllm-openai:v0.8.5",
                    "ports": [
                        {"name": "http", "containerPort": 1, "protocol": "TCP"},
                        {"name": port_name, "containerPort": port, "protocol": "TCP"},
                    ],
                },
            ],
        },
        "status": status,
    }


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Does the label selector select these labels (as the API server decides)?"""
    requirements, depth, part = [], 0, ""
    for char in selector:  # split on commas outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            requirements.append(part)
            part = ""
        else:
            part += char
    requirements.append(part)
    for requirement in (r.strip() for r in requirements):
        found = _SET.match(requirement)
        if found:
            key, op, values = found.groups()
            inside = labels.get(key) in {v.strip() for v in values.split(",")}
            if inside != (op == "in"):
                return False
        elif "!=" in requirement:
            key, _, value = requirement.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in requirement:
            key, _, value = requirement.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif requirement.startswith("!"):
            if requirement[1:] in labels:
                return False
        elif requirement not in labels:
            return False
    return True


class KubernetesApi:
    """The stand-in, on loopback: `pods` may be changed while it runs; `requests` records
    each request's path, query and Authorization header."""

    def __init__(self, token: str, tls: tuple[Path, Path] | None = None) -> None:
        self.token = token
        self.pods: list[dict[str, Any]] = []
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.handle(self)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.scheme = "http" if tls is None else "https"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> KubernetesApi:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(request.path)
        query = parse_qs(parts.query)
        authorization = request.headers.get("Authorization")
        self.requests.append((parts.path, query, authorization))
        if authorization != f"Bearer {self.token}":
            return self.answer(request, 401, status(401, "Unauthorized", "Unauthorized"))
        found = re.fullmatch(r"/api/v1(?:/namespaces/([a-z0-9-]+))?/pods", parts.path)
        if found is None:
            return self.answer(request, 404, status(404, "NotFound", "the server could not find"))
        namespace = found.group(1)
        selector = query.get("labelSelector", [""])[0]
        items = [
            p
            for p in self.pods
            if (namespace is None or p["metadata"]["namespace"] == namespace)
            and selects(selector, p["metadata"]["labels"])
        ]
        start = int(query.get("continue", ["0"])[0])
        limit = int(query.get("limit", ["0"])[0]) or len(items)
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": "4711"}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}
        self.answer(request, 200, body)

    @staticmethod
    def answer(request: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        request.send_response(code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status, as the API server answers a refused request."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def kubeconfig(path: Path, server: str, token: str, **cluster: Any) -> Path:
    """A kubeconfig with one context whose user signs in with a bearer token."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "local", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "kneepoint", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "test",
                        "context": {"cluster": "local", "user": "kneepoint", "namespace": "x"},
                    }
                ],
            }
        )
    )
    return path
