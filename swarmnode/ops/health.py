"""A local liveness endpoint: GET /health answers 200 while the node makes progress.

Docker's HEALTHCHECK runs `swarmnode health`, which asks this endpoint, so "healthy" means
the node itself answered and its round loop moved recently, not just that the process exists.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from swarmnode.settings.network import LOCAL_HOST

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
DOCKER_PORT = 8470  # the port the images serve /health on, and where `swarmnode health` asks by default
ASK_TIMEOUT_S = 5.0


class HealthServer:
    """Serves `state()` as JSON on /health (200 when state()['alive'], else 503) and, when
    given, `metrics()` on /metrics for Prometheus."""

    def __init__(
        self, host: str, port: int, state: Callable[[], dict[str, Any]],
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.rstrip("/")
                if path == "/metrics" and metrics is not None:
                    page = metrics()
                    self.send_response(200)
                    self.send_header("Content-Type", PROMETHEUS_TEXT)
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                if path != "/health":
                    self.send_error(404)
                    return
                body = state()
                data = json.dumps(body).encode()
                self.send_response(200 if body.get("alive") else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet: the healthcheck polls often
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.timeout = 5
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ask(host: str, port: int, timeout_s: float) -> tuple[bool, str]:
    """(healthy, what the node said) for the endpoint at host:port."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout_s) as response:
            return True, response.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return False, err.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return False, f"no answer from {host}:{port} ({err})"


def main(argv: list[str] | None = None) -> int:
    """`python -m swarmnode.ops.health`: the healthcheck without importing torch (Docker's is
    short on time); the same answer as `swarmnode health`."""
    parser = argparse.ArgumentParser(prog="python -m swarmnode.ops.health", description=main.__doc__)
    parser.add_argument("--port", type=int, default=DOCKER_PORT)
    parser.add_argument("--host", default=LOCAL_HOST)
    parser.add_argument("--timeout", type=float, default=ASK_TIMEOUT_S)
    args = parser.parse_args(argv)
    healthy, said = ask(args.host, args.port, args.timeout)
    print(said)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
