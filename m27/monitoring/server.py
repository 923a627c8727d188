"""The exporter's HTTP server: `/metrics` (and `/`) from a registry, 404 for anything else.

prometheus_client's ``start_http_server`` answers every path with the metrics and listens
with the socketserver default backlog of 5: 200 scrapes arriving together (a dashboard
refresh across a lab) then wait on TCP retransmits, p99 about a minute. This server is
the same WSGI app behind a thread-per-request server with a real listen backlog.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

__all__ = ["BACKLOG", "PATHS", "serve"]

#: Connections the kernel queues before the server accepts them (capped by somaxconn).
BACKLOG = 1024
#: The paths that answer with metrics.
PATHS = ("/", "/metrics")

_NOT_FOUND = b"not found: m27 exporter serves /metrics\n"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up shutdown
    request_queue_size = BACKLOG
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _only_metrics(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") in PATHS:
            return app(environ, start_response)
        start_response(
            "404 Not Found",
            [("Content-Type", "text/plain"), ("Content-Length", str(len(_NOT_FOUND)))],
        )
        return [_NOT_FOUND]

    return routed


def serve(registry: CollectorRegistry, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` on host:port from a daemon thread; `server.shutdown()` stops it."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Bound(_Server):
        address_family = family

    server = make_server(
        str(sockaddr[0]),
        port,
        _only_metrics(make_wsgi_app(registry)),
        server_class=Bound,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=server.serve_forever, name="m27-exporter", daemon=True)
    thread.start()
    return server, thread
