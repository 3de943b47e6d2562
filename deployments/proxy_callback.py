"""What Serve's HTTP proxy loads through RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH: the
middlewares of app.proxy_guard (the key check before the body, admission past the service's
capacity, Serve's failures in the API's error shape), with every error they answer counted
in the API's error metric, as the ingress counts the errors it answers (a 401 refused in
the proxy never reaches it)."""

from __future__ import annotations

from starlette.middleware import Middleware

from app import proxy_guard
from deployments.metrics import error_counter


def middlewares() -> list[Middleware]:
    errors = error_counter()

    def count(status: int, code: str) -> None:
        errors.inc(tags={"status": str(status), "code": code})

    return proxy_guard.middlewares(sink=count)
