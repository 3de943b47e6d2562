"""The playground page at `/` and Swagger UI at `/docs`, every file served by this process.

No page references another host: the machines this runs on often reach none, and the
page shows retrieved text, so its Content-Security-Policy allows scripts, styles and
requests to this origin only. Swagger UI's files come from the `fastapi-offline` package
(MIT, the swagger-ui-dist bundle and stylesheet). None of these routes needs an API key:
the guard checks /v1 only, and the page sends the key the user types with each query.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
SWAGGER_DIR = Path(fastapi_offline.__file__).parent / "static"
STATIC_URL = "/static"
SWAGGER_ASSETS_URL = "/docs/assets"

# Retrieved passages are untrusted text: even if one slipped into the DOM as markup,
# it could neither run a script nor send anything to another host.
PAGE_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def install_playground(api: FastAPI) -> None:
    """Add `GET /` (the playground), `/static/*` (its files), `GET /docs` and
    `/docs/assets/*` (Swagger UI, served locally) to `api`."""
    api.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    api.mount(SWAGGER_ASSETS_URL, StaticFiles(directory=SWAGGER_DIR), name="docs-assets")

    async def playground() -> FileResponse:
        return FileResponse(
            STATIC_DIR / "index.html",
            media_type="text/html",
            headers={
                "Content-Security-Policy": PAGE_SECURITY_POLICY,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-cache",
            },
        )

    async def swagger_ui(request: Request) -> HTMLResponse:
        # Behind a route prefix Serve sets root_path; the page's URLs must carry it.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{api.openapi_url}",
            title=f"{api.title} - API docs",
            swagger_js_url=f"{root}{SWAGGER_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{SWAGGER_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{SWAGGER_ASSETS_URL}/favicon.png",
            # The default validator badge is an image from validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    api.add_api_route("/", playground, methods=["GET"], include_in_schema=False)
    api.add_api_route("/docs", swagger_ui, methods=["GET"], include_in_schema=False)
