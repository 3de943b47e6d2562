"""app.playground over HTTP: the page at `/`, its files, Swagger UI at `/docs`, all from this
process with no other host named, and none of it behind the API key.

The browser test (tests/integration/test_playground_browser.py) runs the page itself.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from app.api import create_api
from app.settings import Settings

KEY = "k" * 24
# XML namespace names are identifiers that no browser fetches.
NAMESPACES = ("http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink")
CDN_HOSTS = (
    "cdn.jsdelivr.net",
    "unpkg.com",
    "cdnjs.cloudflare.com",
    "fonts.googleapis.com",
    "fonts.gstatic.com",
    "fastapi.tiangolo.com",
)  # the bundle also names validator.swagger.io, its default that /docs turns off
PAGE_TEST_IDS = (
    "api-key", "top-k", "compression-method", "compression-rate", "answer-style",
    "retrieval-query", "max-tokens", "question", "ask", "stop", "new-conversation",
    "conversation", "error", "status", "figures", "sources", "figure-cached-tokens",
    "figure-cached-segments", "figure-ttft-ms", "figure-tpot-ms", "figure-context-tokens-before",
    "figure-context-tokens-after", "figure-prompt-tokens", "figure-retrieve-ms",
    "figure-compress-ms", "figure-rewrite-ms", "figure-attribute-ms", "figure-total-ms",
)  # fmt: skip


class _References(HTMLParser):
    """The src and href of every element, and each element's attributes by data-testid."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.by_test_id: dict[str, dict[str, str | None]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        self.urls += [value for key, value in attrs if key in ("src", "href") and value]
        if named.get("data-testid"):
            self.by_test_id[str(named["data-testid"])] = named


def references(html: str) -> _References:
    parser = _References()
    parser.feed(html)
    return parser


def urls_in(text: str) -> set[str]:
    return {url for url in re.findall(r"https?://[^\s\"'`)<>\\]*", text) if url not in NAMESPACES}


def local_path(page: str, reference: str) -> str:
    """The path `reference` on `page` resolves to; fails on another origin."""
    url = urlsplit(urljoin(f"http://testserver{page}", reference))
    assert (url.scheme, url.netloc) == ("http", "testserver"), reference
    return url.path


@pytest.fixture
def secured(client_for) -> TestClient:
    return client_for(settings=Settings(environment="production", api_keys=(KEY,)))


def test_the_page_is_served_at_the_root_with_its_files(client):
    response = client.get("/")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = references(response.text)
    assert sorted(local_path("/", url) for url in page.urls) == [
        "/docs", "/static/favicon.svg", "/static/playground.css", "/static/playground.js",
    ]  # fmt: skip
    for url in page.urls:
        asset = client.get(local_path("/", url))
        assert asset.status_code == 200, url
    assert client.get("/static/playground.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/playground.css").headers["content-type"].startswith("text/css")


def test_the_page_has_the_elements_the_browser_test_drives(client):
    page = references(client.get("/").text)

    assert set(PAGE_TEST_IDS) <= set(page.by_test_id)
    error = page.by_test_id["error"]
    assert error.get("role") == "alert"
    assert "hidden" in error
    assert page.by_test_id["api-key"].get("type") == "password"


def test_the_page_and_its_files_name_no_other_host(client):
    texts = {"/": client.get("/").text}
    for name in ("playground.js", "playground.css", "favicon.svg"):
        texts[name] = client.get(f"/static/{name}").text

    assert {name: urls_in(text) for name, text in texts.items()} == {name: set() for name in texts}


def test_the_script_inserts_server_text_as_text_only(client):
    script = client.get("/static/playground.js").text

    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script


def test_the_page_allows_scripts_and_requests_to_its_own_origin_only(client):
    policy = client.get("/").headers["content-security-policy"]

    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src", "img-src"):
        assert directives[name] == "'self'"


def test_docs_serve_swagger_ui_from_local_files(client):
    response = client.get("/docs")

    assert response.status_code == 200
    assert "SwaggerUIBundle" in response.text
    assert urls_in(response.text) == set()
    docs = references(response.text)
    assert docs.urls  # the bundle, its stylesheet, the favicon
    for url in docs.urls:
        assert url.startswith("/docs/assets/"), url
        assert client.get(url).status_code == 200, url
    assert "url: '/openapi.json'" in response.text
    assert client.get("/openapi.json").status_code == 200
    # Swagger UI's default validator badge is an image from another host.
    assert '"validatorUrl": null' in response.text


def test_swagger_files_name_no_cdn(client):
    docs = references(client.get("/docs").text)

    for url in docs.urls:
        text = client.get(url).content.decode("utf-8", errors="replace")
        assert [host for host in CDN_HOSTS if host in text] == [], url


def test_the_page_and_docs_need_no_key_while_v1_still_does(secured):
    for path in ("/", "/static/playground.js", "/docs", "/docs/assets/swagger-ui.css"):
        assert secured.get(path).status_code == 200, path
    assert secured.get("/openapi.json").status_code == 200

    assert secured.get("/v1/models").status_code == 401
    assert secured.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_the_page_loads_while_the_service_starts():
    client = TestClient(create_api())

    assert client.get("/").status_code == 200
    assert client.get("/docs").status_code == 200
    assert client.get("/v1/models").status_code == 503


def test_the_page_and_docs_stay_out_of_the_api_description(client):
    paths = client.get("/openapi.json").json()["paths"]

    assert "/" not in paths
    assert "/docs" not in paths


def test_a_missing_file_is_a_404_in_the_api_error_shape(client):
    response = client.get("/static/nothing-here.js")

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_docs_urls_carry_the_route_prefix():
    client = TestClient(create_api(), root_path="/rag")

    docs = client.get("/rag/docs")

    assert "url: '/rag/openapi.json'" in docs.text
    for url in references(docs.text).urls:
        assert url.startswith("/rag/docs/assets/"), url
        assert client.get(url).status_code == 200, url


def test_the_openapi_document_declares_the_bearer_key_on_v1_routes(client):
    spec = client.get("/openapi.json").json()

    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path in ("/v1/models", "/v1/rag/query", "/v1/chat/completions"):
        [operation] = spec["paths"][path].values()
        assert operation["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]
