"""What the generator stage needs from an engine."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from pipeline.messages import GenerationEvent, GenerationRequest


class TokenEngine(Protocol):
    def stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """TokenEvents, then one FinishEvent; or an ErrorEvent when the request is refused."""
        ...

    async def check_health(self) -> None:
        """Raise when the engine can no longer serve (its replica should be replaced)."""
        ...
