"""The public port's answer while the engines warm up: 503 with Retry-After.

`baton up` binds the public port before it deploys the app, with
SO_REUSEPORT like the decode replicas, and answers every request with an
OpenAI-style 503 and `Retry-After`, so a client that comes early learns to
wait instead of getting a refused connection. Once every pool can serve,
`baton up` closes it and prints that Baton is ready.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = json.dumps({"error": {"message": "Baton is starting: the engines are warming up",
                             "type": "server_error", "param": None, "code": "starting"}}).encode()


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(min(length, 16 * 2**20))
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "5")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


class _ReusePortServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class WarmupServer:
    """Answers 503 on host:port from a thread until `stop()`."""

    def __init__(self, host: str, port: int):
        _ReusePortServer.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.server = _ReusePortServer((host, port), _Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="baton-warmup", daemon=True)

    def start(self) -> "WarmupServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stops answering and closes the socket; idempotent."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
