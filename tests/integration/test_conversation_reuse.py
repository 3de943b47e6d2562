"""Conversation reuse on the real service (prepare.continuation): a follow-up continues the
prompts its conversation sent before, and vLLM serves their blocks from its prefix cache.

A collection of its own holds three passages. The shared service runs two compressor
replicas, each remembering only the turns it prepared: a follow-up is continued only on
the replica that prepared its conversation, which the shipped config's conversation router
(compression.request_router) sends it to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

pytestmark = pytest.mark.integration

COLLECTION = "conversation-reuse"
JOB_TIMEOUT_S = 180
DOCUMENTS = [
    {
        "id": "glass",
        "title": "Glassmaking",
        "text": "Glass is made by melting silica sand with soda ash and lime in a furnace at "
        "about 1,500 degrees Celsius. The soda ash lowers the melting point of the sand, and "
        "the lime makes the finished glass stable in water. Float glass for windows is "
        "poured onto a bath of molten tin, where it spreads into a flat sheet of even "
        "thickness before it is cooled slowly in a long oven called a lehr.",
    },
    {
        "id": "bees",
        "title": "Honey bees",
        "text": "Honey bees tell their nest mates where flowers are with the waggle dance. "
        "The angle of the waggle run against the vertical comb gives the direction of the "
        "food relative to the sun, and the length of the run gives its distance. A colony "
        "of honey bees can hold fifty thousand workers in summer, and the queen lays up to "
        "two thousand eggs a day in the cells of the brood comb.",
    },
    {
        "id": "violin",
        "title": "The violin",
        "text": "The violin has four strings tuned in perfect fifths: G, D, A and E. Its "
        "body is carved from spruce for the top and maple for the back, and the sound post "
        "inside carries the vibration of the bridge to the back plate. Bows are strung with "
        "horsehair, which grips the string through a coat of rosin and makes it vibrate.",
    },
]


@pytest.fixture(scope="module")
def client(shared_service) -> Iterator[httpx.Client]:
    with shared_service.client() as http:
        created = http.post("/v1/collections", json={"name": COLLECTION})
        assert created.status_code == 201, created.text
        added = http.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": DOCUMENTS})
        assert added.status_code == 202, added.text
        job = added.json()
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while job["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
            time.sleep(0.1)
            job = http.get(f"/v1/jobs/{job['id']}").json()
        assert job["status"] == "succeeded", job
        yield http
        http.delete(f"/v1/collections/{COLLECTION}")


def ask(client: httpx.Client, question: str, **options) -> dict:
    response = client.post(
        "/v1/rag/query",
        json={
            "question": question,
            "collection": COLLECTION,
            "top_k": 3,
            "max_tokens": 1,
            "citations": False,
            **options,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_every_follow_up_continues_its_conversation_on_the_replica_that_prepared_it(client):
    # Three conversations of three questions over two compressor replicas: each follow-up
    # is continued only where its earlier turns are remembered. Sent by Serve's default
    # router, all six would find them with odds of about 1 in 64.
    # compression.reuse is on by default: the request does not ask for it.
    no_compression = {"method": "none"}
    openings = [
        ("What is float glass poured onto?", "How is it cooled?", "What is that oven called?"),
        ("How do honey bees find flowers?", "What gives the distance?", "How many eggs a day?"),
        ("How many strings has a violin?", "What wood is its back?", "What are bows strung with?"),
    ]
    for questions in openings:
        history: list[dict[str, str]] = []
        for turn, question in enumerate(questions):
            answer = ask(client, question, history=history, compression=no_compression)
            usage = answer["usage"]
            assert usage["continued_turns"] == turn, (question, usage)
            if turn:
                # The earlier prompts, sources and all, came from the prefix cache.
                assert usage["cached_prompt_tokens_by_segment"]["history"] > 0, usage
            history += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer["answer"] or "(no answer)"},
            ]
