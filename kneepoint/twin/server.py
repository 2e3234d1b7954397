"""Real HTTP servers for twin replicas (OpenAI API, /metrics, /health) and GPU nodes."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from kneepoint.twin import openai_api
from kneepoint.twin.dcgm import GpuNode
from kneepoint.twin.replica import Replica
from kneepoint.twin.simulated_engine import Rejected

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    server: TwinServer

    def log_message(self, *args: object) -> None:  # quiet: the twin serves many requests
        pass

    def do_GET(self) -> None:
        target = self.server.target
        path = self.path.split("?")[0]
        if path == "/metrics":
            body = target.metrics() if isinstance(target, Replica) else target.render()
            self._send(200, body, METRICS_TYPE)
        elif path == "/health" and isinstance(target, Replica):
            self._send(200, b"", "text/plain")
        elif path == "/v1/models" and isinstance(target, Replica):
            self._json(200, openai_api.models(target))
        elif path == "/is_sleeping" and isinstance(target, Replica) and self._sleep_mode(target):
            self._json(200, {"is_sleeping": target.sleeping})
        else:
            self._not_found(path)

    def _sleep_mode(self, target: Replica | GpuNode) -> bool:
        # vLLM's sleep endpoints (served in its dev mode); SGLang has none of them.
        return isinstance(target, Replica) and target.engine_name == "vllm"

    def do_POST(self) -> None:
        target = self.server.target
        path, _, query = self.path.partition("?")
        if path == "/sleep" and self._sleep_mode(target):
            assert isinstance(target, Replica)
            level = parse_qs(query).get("level", ["1"])[0]
            if level not in ("1", "2"):
                self._json(400, openai_api.error_body("the twin sleeps at level 1 or 2"))
                return
            target.sleep(int(level))
            self._json(200, {"status": "sleeping", "level": int(level)})
            return
        if path == "/wake_up" and self._sleep_mode(target):
            assert isinstance(target, Replica)
            target.wake_up()
            self._json(200, {"status": "awake", "tags": None})
            return
        if not isinstance(target, Replica) or path not in (
            "/v1/completions",
            "/v1/chat/completions",
        ):
            self._not_found(path)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            call = openai_api.parse_call(
                body,
                path.endswith("chat/completions"),
                target.served_name,
                target.engine.config.max_model_len,
                target.engine_name,
            )
        except openai_api.BadRequest as error:
            reply = openai_api.error_body(str(error), 400, target.engine_name, error.kind)
            self._json(400, reply)
            return
        try:
            if not call.stream:
                self._json(200, openai_api.respond(target, call))
                return
            events = openai_api.stream(target, call)
            first = next(events)  # submits the request: a queue limit refuses it here
        except Rejected as refused:
            # vLLM's GracefulHTTPError: the status's phrase as the error type.
            refusal = {
                "error": {
                    "message": str(refused),
                    "type": "Service Unavailable",
                    "param": None,
                    "code": 503,
                }
            }
            self._json(503, refusal)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            for event in itertools.chain((first,), events):
                self.wfile.write(event)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; the engine finishes the request regardless

    def _not_found(self, path: str) -> None:
        target = self.server.target
        engine = target.engine_name if isinstance(target, Replica) else "vllm"
        self._json(404, openai_api.error_body(f"{path} not found", 404, engine))

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        target = self.server.target
        # SGLang answers through ORJSONResponse: compact JSON.
        compact = isinstance(target, Replica) and target.engine_name == "sglang"
        text = json.dumps(payload, separators=(",", ":")) if compact else json.dumps(payload)
        self._send(status, text.encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


class TwinServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, target: Replica | GpuNode, host: str, port: int) -> None:
        self.target = target
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://{host}:{port}"

    def start(self) -> TwinServer:
        threading.Thread(target=self.serve_forever, name=f"http-{self.url}", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
