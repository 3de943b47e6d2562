"""app.upload_budget: bytes of uploads in flight, per caller and in all, reserved before a
body byte is read and released when the request ends."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from app.errors import upload_budget_exceeded
from app.upload_budget import UploadBudget, UploadBudgetGate, caller_of

# --- the budget ------------------------------------------------------------------------------


def test_a_reservation_needs_room_in_the_callers_budget_and_in_all():
    budget = UploadBudget(per_caller_bytes=100, total_bytes=150)

    assert budget.reserve("a", 60)
    assert not budget.reserve("a", 41)  # a would hold 101
    assert budget.reserve("b", 90)
    assert not budget.reserve("c", 1)  # 150 in all
    assert (budget.held("a"), budget.held("b"), budget.total_held) == (60, 90, 150)

    budget.release("a", 60)
    assert budget.reserve("c", 60)
    assert (budget.held("a"), budget.total_held) == (0, 150)


def test_releasing_more_than_held_is_a_bug_and_budgets_must_be_positive():
    budget = UploadBudget(100, 100)
    budget.reserve("a", 10)

    with pytest.raises(ValueError, match="does not hold"):
        budget.release("a", 11)
    with pytest.raises(ValueError, match="at least one byte"):
        UploadBudget(0, 100)


def test_the_caller_is_the_guards_else_the_client_address():
    assert caller_of({"state": {"caller": "key-1"}, "client": ("10.0.0.1", 5)}) == "key-1"
    assert caller_of({"client": ("10.0.0.1", 5)}) == "address:10.0.0.1"
    assert caller_of({}) == "address:unknown"


# --- the gate --------------------------------------------------------------------------------


class HeldUploads:
    """An app that reads the whole body, then answers only once `release` is set, so that
    its requests stay in flight while others arrive."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.bodies: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        self.bodies.append(size)
        await self.release.wait()
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def gate(app: HeldUploads, budget: UploadBudget, largest: int = 1000) -> UploadBudgetGate:
    return UploadBudgetGate(
        app,
        budget,
        is_upload=lambda scope: scope["path"] == "/upload",
        largest_upload_bytes=largest,
        refusal=upload_budget_exceeded(2),
    )


def client(app: UploadBudgetGate) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def _until(condition) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


def test_an_upload_past_the_budget_is_refused_unread_while_others_hold_it():
    async def scenario() -> None:
        app, budget = HeldUploads(), UploadBudget(per_caller_bytes=1000, total_bytes=1000)
        async with client(gate(app, budget)) as http:
            first = asyncio.create_task(http.post("/upload", content=b"x" * 700))
            await _until(lambda: app.bodies)
            assert budget.total_held == 700

            refused = await http.post("/upload", content=b"y" * 400)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "2"
            assert refused.headers["connection"] == "close"
            assert json.loads(refused.content)["error"]["code"] == "upload_budget_exceeded"
            assert app.bodies == [700]  # the refused body never reached the app

            app.release.set()
            assert (await first).status_code == 202
            assert budget.total_held == 0
            assert (await http.post("/upload", content=b"y" * 400)).status_code == 202

    asyncio.run(scenario())


def test_a_chunked_upload_holds_the_largest_size_and_other_paths_pass_free():
    async def chunks():
        yield b"z" * 10

    async def scenario() -> None:
        app, budget = HeldUploads(), UploadBudget(per_caller_bytes=1500, total_bytes=1500)
        app.release.set()
        held: list[int] = []
        original = budget.reserve

        def spy(caller: str, nbytes: int) -> bool:
            held.append(nbytes)
            return original(caller, nbytes)

        budget.reserve = spy  # type: ignore[method-assign]
        async with client(gate(app, budget, largest=1000)) as http:
            assert (await http.post("/upload", content=chunks())).status_code == 202
            assert (await http.post("/other", content=b"a" * 5000)).status_code == 202
        # The chunked body reserved the largest upload; /other reserved nothing.
        assert held == [1000]
        assert budget.total_held == 0

    asyncio.run(scenario())


def test_a_failing_upload_still_releases_its_bytes():
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("the writer is gone")

    budget = UploadBudget(1000, 1000)
    app = UploadBudgetGate(
        failing,
        budget,
        is_upload=lambda scope: True,
        largest_upload_bytes=1000,
        refusal=upload_budget_exceeded(1),
    )
    scope = {"type": "http", "path": "/upload", "headers": [(b"content-length", b"10")]}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message) -> None:
        pass

    with pytest.raises(RuntimeError):
        asyncio.run(app(scope, receive, send))
    assert budget.total_held == 0
