"""The playground and /docs in a real browser (headless Chromium, Debian's build) against the
real application: streaming, a follow-up with its history, a refused key, Swagger UI offline.

Playwright drives /usr/bin/chromium (`make browser` installs it) and downloads nothing. One
browser per module, one fresh context and page per test. Answers take up to ~30 s on a
2-core CPU, so the waits are generous.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Request, expect, sync_playwright

from prepare.methods import method_names

CHROMIUM = Path("/usr/bin/chromium")
# Off everything a fresh profile would fetch from the internet on its own.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ANSWER_TIMEOUT_MS = 180_000
PAGE_TIMEOUT_MS = 30_000
QUESTION = "What is continuous batching?"
MAX_TOKENS = 32
FOLLOW_UP = "How does it differ from static batching?"

pytestmark = [
    pytest.mark.integration,
    # Outside CI a machine without the browser skips; in CI the browser fixture fails instead.
    pytest.mark.skipif(
        not CHROMIUM.exists() and not os.environ.get("CI"),
        reason=f"{CHROMIUM} is missing: `make browser` installs Debian's chromium package",
    ),
]

# Notes, in the page, whether the answer had text while the figures were not yet final.
WATCH_STREAMING = """
window.__answerBeforeDone = false;
document.addEventListener("DOMContentLoaded", () => {
  const check = () => {
    const answer = document.querySelector('[data-testid="answer"]');
    const figures = document.querySelector('[data-testid="figures"]');
    if (answer && answer.textContent.length > 0 && figures.dataset.state !== "done") {
      window.__answerBeforeDone = true;
    }
  };
  new MutationObserver(check).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true,
  });
});
"""


@dataclass
class Tab:
    """A page and what it did: console errors, uncaught exceptions, every request's URL."""

    page: Page
    origin: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        return [
            url
            for url in self.requests
            if urlsplit(url).scheme not in ("data", "blob") and _origin(url) != self.origin
        ]


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium package")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def tab(browser, service) -> Iterator[Tab]:
    """A fresh context (empty sessionStorage) and page on the service's origin."""
    context = browser.new_context(
        base_url=service.base_url, viewport={"width": 1400, "height": 900}
    )
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    tab = Tab(page, _origin(service.base_url))
    page.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    context.on("request", lambda request: tab.requests.append(request.url))
    yield tab
    context.close()


def ask(page: Page, question: str, key: str) -> None:
    page.get_by_test_id("api-key").fill(key)
    # Answers as short as a check needs; the field stays set for a follow-up.
    page.get_by_test_id("max-tokens").fill(str(MAX_TOKENS))
    page.get_by_test_id("question").fill(question)
    page.get_by_test_id("ask").click()


def is_query(request: Request) -> bool:
    return request.method == "POST" and urlsplit(request.url).path == "/v1/rag/query"


def test_the_page_loads_clean_and_stays_on_its_origin(tab):
    tab.page.goto("/", wait_until="networkidle")

    expect(tab.page.get_by_test_id("question")).to_be_visible()
    expect(tab.page.get_by_test_id("ask")).to_be_enabled()
    expect(tab.page.get_by_role("alert")).to_be_hidden()
    assert tab.errors == []
    assert tab.foreign_requests() == []
    assert any(url.endswith("/static/playground.js") for url in tab.requests)
    # The compression menu is the service's registry, read from its OpenAPI document.
    menu = tab.page.get_by_test_id("compression-method").locator("option")
    assert menu.evaluate_all("options => options.map(o => o.value)") == ["", *method_names()]


def test_a_question_streams_an_answer_with_sources_and_figures(tab, service):
    page = tab.page
    page.add_init_script(WATCH_STREAMING)
    page.goto("/")

    page.get_by_test_id("compression-method").select_option("sentences")
    with page.expect_request(is_query) as sent:
        ask(page, QUESTION, service.api_key)
    answer = page.get_by_test_id("answer")
    expect(answer).not_to_be_empty(timeout=ANSWER_TIMEOUT_MS)
    expect(page.get_by_test_id("figures")).to_have_attribute(
        "data-state", "done", timeout=ANSWER_TIMEOUT_MS
    )

    body = sent.value.post_data_json
    assert body["question"] == QUESTION
    assert body["history"] == []
    assert body["compression"]["method"] == "sentences"
    assert body["stream"] is True and body["include_context"] is True
    assert sent.value.headers["authorization"] == f"Bearer {service.api_key}"
    assert page.evaluate("window.__answerBeforeDone") is True, "the answer did not stream"
    assert answer.text_content().strip()
    expect(page.get_by_test_id("turn-assistant")).to_have_attribute("data-state", "done")
    titles = page.get_by_test_id("source-title").all_text_contents()
    scores = page.get_by_test_id("source-score").all_text_contents()
    assert titles and all(title.strip() for title in titles)
    assert len(scores) == len(titles)
    assert all(re.fullmatch(r"-?\d+\.\d{3}", score) for score in scores), scores
    assert page.get_by_test_id("source-passage").first.text_content().strip()
    assert re.fullmatch(r"\d+", page.get_by_test_id("figure-cached-tokens").text_content())
    assert re.fullmatch(r"\d+", page.get_by_test_id("figure-prompt-tokens").text_content())
    segments = page.get_by_test_id("figure-cached-segments").text_content()
    segment = r"(system|history|passages|question) \d+"
    assert re.fullmatch(rf"none|{segment}( · {segment})*", segments), segments
    for name in ("ttft", "total", "retrieve"):
        figure = page.get_by_test_id(f"figure-{name}-ms").text_content()
        assert re.fullmatch(r"\d+(\.\d+)? m?s", figure), (name, figure)
    expect(page.get_by_role("alert")).to_be_hidden()
    assert tab.errors == []
    assert tab.foreign_requests() == []


def test_a_follow_up_sends_the_first_turn_as_history(tab, service):
    page = tab.page
    page.goto("/")
    ask(page, QUESTION, service.api_key)
    first = page.get_by_test_id("turn-assistant").nth(0)
    expect(first).to_have_attribute("data-state", "done", timeout=ANSWER_TIMEOUT_MS)
    first_answer = first.get_by_test_id("answer").text_content()

    page.get_by_test_id("question").fill(FOLLOW_UP)
    with page.expect_request(is_query) as sent:
        page.get_by_test_id("question").press("Enter")
    second = page.get_by_test_id("turn-assistant").nth(1)
    expect(second).to_have_attribute("data-state", "done", timeout=ANSWER_TIMEOUT_MS)

    body = sent.value.post_data_json
    assert body["question"] == FOLLOW_UP
    assert body["max_tokens"] == MAX_TOKENS
    assert body["history"] == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first_answer},
    ]
    expect(page.get_by_test_id("turn-user")).to_have_count(2)
    expect(page.get_by_test_id("turn-user").nth(0)).to_contain_text(QUESTION)
    expect(page.get_by_test_id("turn-user").nth(1)).to_contain_text(FOLLOW_UP)
    assert second.get_by_test_id("answer").text_content().strip()
    expect(first).to_be_visible()
    expect(page.get_by_role("alert")).to_be_hidden()
    if shot := os.environ.get("PLAYGROUND_SCREENSHOT"):  # the README's picture, on request
        page.screenshot(path=shot)

    page.get_by_test_id("new-conversation").click()
    expect(page.get_by_test_id("turn-user")).to_have_count(0)


def test_a_wrong_key_shows_an_error_and_no_answer(tab):
    page = tab.page
    page.goto("/")

    with page.expect_response(lambda response: is_query(response.request)) as answered:
        ask(page, QUESTION, "not-the-key-0123456789")

    assert answered.value.status == 401
    alert = page.get_by_role("alert")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("401")
    expect(alert).to_contain_text("invalid_api_key")
    expect(alert).to_contain_text("API key")
    expect(page.get_by_test_id("answer")).to_have_count(0)
    # The question is kept for a retry with the right key.
    expect(page.get_by_test_id("question")).to_have_value(QUESTION)


def test_docs_render_swagger_ui_offline(tab):
    page = tab.page
    page.goto("/docs")

    expect(page.locator(".swagger-ui .info")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("RAG serve")
    expect(page.locator(".opblock-summary-path", has_text="/v1/rag/query")).to_be_visible()
    assert tab.foreign_requests() == []
