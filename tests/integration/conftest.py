"""The integration modules talk to the session's services (tests/services.py), exactly as
a user does: over HTTP, with an API key. `service` is the shared one; a module that runs
against the external engine as well asks for `external_service` (its generator vLLM's own
OpenAI server, an application of its own)."""

from __future__ import annotations

import pytest
from services import Service


@pytest.fixture(scope="module")
def service(shared_service: Service) -> Service:
    return shared_service
