"""`swarmnode status --serve`: the swarm in a browser, served by a status client.

A reader thread reads the swarm every `every_s` seconds (the same rows `swarmnode status`
prints, with what it checked) into a bounded SwarmHistory; an HTTP server answers GET with
the page (swarmnode/ops/page/: HTML, a script, a stylesheet and uPlot, vendored under its MIT
licence: nothing from a CDN) and GET /api/swarm with the history as JSON. Beside a node's run
dir the page also draws that node's own curves (swarmnode.ops.node_curves).

Read-only and safe by construction: only GET is served; the page builds every string a peer
controls into the document as text (textContent, never HTML), and the Content-Security-Policy
lets no script run but the page's own file, so a model name that is an HTML payload shows as
text and runs nothing even if a bug rendered it as markup. It listens on 127.0.0.1 unless
told otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from swarmnode.ops.node_curves import NodeCurves
from swarmnode.ops.swarm_history import SwarmHistory
from swarmnode.protocol.records import PeerRow
from swarmnode.settings.network import LOCAL_HOST

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
READ_EVERY_S = 2.0  # the swarm is read this often; the page asks for it as often (page.js)
REQUEST_TIMEOUT_S = 10.0  # a connection idle this long is closed
MAX_CONNECTIONS = 32  # requests served at once; more are closed unanswered
STATIC = {  # what the page serves: name -> content type; nothing else is read from disk
    "index.html": "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class AddressError(ValueError):
    """A --serve address that cannot be listened on."""


@dataclass(frozen=True)
class PageAddress:
    host: str
    port: int

    @property
    def local(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/"


def parse_address(text: str) -> PageAddress:
    """`PORT`, `HOST:PORT`, `[IPv6]:PORT` or `HOST` (port DEFAULT_PORT); the host defaults to
    127.0.0.1. Port 0 picks a free one (printed when serving)."""
    text = text.strip()
    if text.count(":") > 1 and not text.startswith("["):  # a bare IPv6 address
        host, port_text = text, str(DEFAULT_PORT)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:  # one part: a port if it is a number, else a host
            host, port_text = (LOCAL_HOST, text) if text.isdigit() else (text, str(DEFAULT_PORT))
    host = host.strip("[]") or LOCAL_HOST
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AddressError(f"--serve {text!r}: give PORT, HOST:PORT or HOST (a port from 0 to 65535)")
    return PageAddress(host, int(port_text))


class SwarmPage:
    """The page's state: the history, the local node's curves, and the lock between the
    reader thread and the server's threads."""

    def __init__(self, curves: NodeCurves | None = None, history: SwarmHistory | None = None) -> None:
        self.history = history or SwarmHistory()
        self.curves = curves
        self.error: str | None = None  # the last read's failure, shown on the page
        self.node: dict[str, Any] | None = None  # the local node's curves at the last read
        self._lock = threading.Lock()

    def observe(self, rows: list[PeerRow], now: float | None = None) -> None:
        """One read of the swarm, and the node's curves read again if its file changed (here,
        in the reader thread, not in the server's)."""
        node = self.curves.to_json() if self.curves else None
        with self._lock:
            self.history.observe(rows, time.time() if now is None else now)
            self.node = node
            self.error = None

    def answered(self) -> set[str]:
        with self._lock:
            return self.history.answered()

    def failed(self, message: str) -> None:
        with self._lock:
            self.error = message

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"time": time.time(), "error": self.error, "me": self.curves.peer_id if self.curves else None,
                    "node": self.node, **self.history.to_json()}


RowReader = Callable[[set[str]], list[PeerRow]]  # one read of the swarm, asking these peers first


def read_forever(page: SwarmPage, read_rows: RowReader, every_s: float, stop: threading.Event) -> None:
    """The reader thread: one read every `every_s` seconds until `stop`, asking first the peers
    that answered the last one (a crowd of silent identities cannot take every question); a
    failed read is shown on the page and tried again, never fatal."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            page.observe(read_rows(page.answered()))
        except Exception as err:  # the swarm stopped answering for a while: say so, keep trying
            log.warning("reading the swarm failed: %s", err)
            page.failed(f"reading the swarm failed: {err}")
        stop.wait(max(0.0, every_s - (time.monotonic() - started)))


LOCAL_NAMES = {"127.0.0.1", "localhost", "[::1]"}  # what a browser on this machine sends as Host


def host_name(header: str | None) -> str:
    """The host of a Host header, without its port: `[::1]:8765` -> `[::1]`."""
    header = (header or "").strip().lower()
    return header.split("]", 1)[0] + "]" if header.startswith("[") else header.rsplit(":", 1)[0]


def _handler(page: SwarmPage, address: PageAddress) -> type[BaseHTTPRequestHandler]:
    files = resources.files("swarmnode.ops") / "page"

    class Handler(BaseHTTPRequestHandler):
        server_version = "swarmnode-status"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S  # an idle connection is closed, its thread freed

        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            path = self.path.split("?", 1)[0]
            if address.local and host_name(self.headers.get("Host")) not in LOCAL_NAMES:  # DNS rebinding: a web site named as this machine
                self._send(403, "text/plain; charset=utf-8", b"this page answers to 127.0.0.1 and localhost only\n")
            elif path == "/api/swarm":
                try:
                    body = json.dumps(page.to_json(), allow_nan=False).encode()
                except ValueError as err:  # a value JSON cannot carry: said, not a dropped connection
                    log.warning("the page's state could not be sent: %s", err)
                    self._send(500, "text/plain; charset=utf-8", f"the page's state: {err}\n".encode())
                    return
                self._send(200, "application/json", body)
            elif path == "/" or path.removeprefix("/static/") in STATIC:
                name = "index.html" if path == "/" else path.removeprefix("/static/")
                self._send(200, STATIC[name], (files / name).read_bytes())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(405, "text/plain; charset=utf-8", b"")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            log.debug("page: " + format, *args)

    return Handler


class _PageServer(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS requests at once (more are closed unanswered), IPv6 where the
    host is an IPv6 address, and a client that hangs up is logged, not traced."""

    daemon_threads = True

    def __init__(self, address: PageAddress, handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((address.host, address.port), handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("page: a request from %s failed", client_address, exc_info=True)


def serve(page: SwarmPage, address: PageAddress) -> ThreadingHTTPServer:
    """An HTTP server for `page` at `address`, not yet serving (call serve_forever); raises
    AddressError when the address cannot be listened on."""
    try:
        return _PageServer(address, _handler(page, address))
    except OSError as err:
        raise AddressError(f"cannot listen on {address.host}:{address.port}: {err.strerror or err}") from None


def run_page(page: SwarmPage, server: ThreadingHTTPServer, address: PageAddress, read_rows: RowReader,
             announce: Callable[[str], None], every_s: float = READ_EVERY_S) -> None:
    """Serve the page on `server` (made by `serve` before the swarm was joined, so a port in use
    fails at once) until Ctrl-C: the reader thread fills it, `announce` is told the URL (and
    warned when the page is reachable from other machines). The server is closed on the way out."""
    stop = threading.Event()
    reader = threading.Thread(target=read_forever, args=(page, read_rows, every_s, stop), name="swarm-reader",
                              daemon=True)
    reader.start()
    announce(f"the swarm page: {address.url(server.server_address[1])} (Ctrl-C stops it)")
    if not address.local:
        announce(f"warning: listening on {address.host}, so anyone who can reach this machine can read the page")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        stop.set()
        server.server_close()
        reader.join(timeout=every_s + 1)
