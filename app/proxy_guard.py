"""What runs inside Ray Serve's HTTP proxy: the API-key check, before the proxy reads a
body byte, and Serve's own failures in the API's error shape (app.proxy_errors).

Serve's proxy reads each request's body from the client as it arrives and queues it for the
replica, whether or not the replica ever asks for it; the ingress's RequestGuard refuses a
request without a valid key before reading its body, but by then the proxy may have held all
of it. This middleware runs in the proxy itself, ahead of that read: a /v1 request without a
valid key gets the ingress's 401 (OpenAI error shape, `Connection: close`) before a byte
of its body is read; what the client still sends is then dropped as it arrives, so that it
can read its 401 (refuse_unheld), and never held. Each connection drained costs the proxy
its buffers (about 0.3 MB measured, docs/security.md), so at most RAG_PROXY_MAX_DRAINING
(app.settings, 32 by default) drain at once; past that a refused connection is closed
unread, and its client may see a reset instead of its 401. Health probes and the playground
stay open, as in the ingress.

It checks the key only. What the key may do (its scope), the rate limit and every other
check stay in the ingress, which checks the key again: with this middleware missing, nothing
is let through that the ingress would refuse; only bodies are read first.

Serve installs it from the environment that starts the proxies (`make run`, the test and
bench harness, and the KubeRay manifest set it; set it yourself for a bare `serve run` or
`ray start`):

    RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=deployments.proxy_callback.middlewares

(deployments.proxy_callback: these middlewares, with the errors they answer counted in the
API's error metric).

Keys come from the same environment as the ingress's (app.settings). The proxy outlives
the application's replicas (a `serve deploy` restarts replicas, not proxies), so it reads
the key file again when the file changes; replicas read it when they start.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.error_metrics import ErrorSink
from app.errors import invalid_api_key
from app.guard import request_header, request_id_in, send_refusal
from app.proxy_admission import ProxyAdmission
from app.proxy_drain import refuse_unheld
from app.proxy_errors import ProxyErrorShape
from app.settings import Settings, load_settings

logger = logging.getLogger(__name__)

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "deployments.proxy_callback.middlewares"  # these, with the error metric
KEY_FILE_CHECK_S = 1.0  # how often the key file's modification time is looked at


def middlewares(sink: ErrorSink = lambda status, code: None) -> list[Middleware]:
    """The middlewares Serve's proxy wraps itself in. Serve wraps its app in them in list
    order, so the last is outermost: the key check first (nothing unauthenticated reaches
    the rest, nor counts against the capacity), then admission past the service's capacity
    (app.proxy_admission), then, nearest Serve's app, its own failures in the API's error
    shape (app.proxy_errors). `sink` counts each error they answer
    (deployments.proxy_callback gives the Ray metric)."""
    return [
        Middleware(ProxyErrorShape, sink=sink),
        Middleware(ProxyAdmission, sink=sink),
        Middleware(ProxyKeyCheck, sink=sink),
    ]


class ProxyKeyCheck:
    """Refuse a /v1 request whose Authorization header carries no configured key, unread."""

    def __init__(
        self,
        app: ASGIApp,
        load: Callable[[], Settings] = load_settings,
        sink: ErrorSink = lambda status, code: None,
    ) -> None:
        self.app = app
        self._sink = sink
        self._keys = _KeySource(load)
        self._draining = 0  # refused connections being drained now (one event loop)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            settings = self._keys.current()
            if (
                settings.auth_required
                and settings.key_of(request_header(scope, b"authorization")) is None
            ):
                request_id = request_id_in(scope)
                refusal = invalid_api_key()
                self._sink(refusal.status, refusal.metric_code)
                if self._draining >= settings.proxy_max_draining:
                    await send_refusal(refusal, request_id, scope, receive, send)
                    return
                self._draining += 1
                try:
                    await refuse_unheld(refusal, request_id, scope, receive, send)
                finally:
                    self._draining -= 1
                return
        await self.app(scope, receive, send)


class _KeySource:
    """The settings, loaded again when the key file's modification time moves (looked at no
    more than once every KEY_FILE_CHECK_S). A key file that no longer loads keeps the keys
    it had, and says so: the proxy does not fall open."""

    def __init__(self, load: Callable[[], Settings]) -> None:
        self._load = load
        self._settings = load()
        self._key_file = self._settings.key_file
        self._stamp = self._file_stamp()
        self._checked_at = time.monotonic()

    def current(self) -> Settings:
        now = time.monotonic()
        if self._key_file and now - self._checked_at >= KEY_FILE_CHECK_S:
            self._checked_at = now
            stamp = self._file_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._settings = self._load()
                except Exception as exc:  # a half-written file: keep the keys we have
                    logger.error("key file not reloaded, keeping the previous keys: %s", exc)
        return self._settings

    def _file_stamp(self) -> int | None:
        try:
            return os.stat(self._key_file).st_mtime_ns if self._key_file else None
        except OSError:
            return None
