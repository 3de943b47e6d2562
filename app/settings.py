"""Machine-local settings and secrets, read from the environment here and nowhere else.

RAG_ENV       development (default) or production. Production refuses to start without keys.
RAG_API_KEYS  comma-separated API keys; when set, every /v1 request needs
              `Authorization: Bearer <key>`. Health probes stay open.
RAG_GENERATOR_API_KEY
              the key the generator sends to an external OpenAI-compatible server
              (generator.engine: openai), when that server asks for one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


class UnsafeSettingsError(RuntimeError):
    """A production deployment was started with a setting that is only safe in development."""


@dataclass(frozen=True)
class Settings:
    environment: Literal["development", "production"]
    api_keys: tuple[str, ...]
    generator_api_key: str | None = None

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; raise UnsafeSettingsError on unsafe production setups."""
    environ = os.environ if environ is None else environ
    environment = environ.get("RAG_ENV", "development").strip().lower()
    if environment not in ("development", "production"):
        raise UnsafeSettingsError(f"RAG_ENV must be development or production, not {environment!r}")
    keys = tuple(key.strip() for key in environ.get("RAG_API_KEYS", "").split(",") if key.strip())
    if environment == "production" and not keys:
        raise UnsafeSettingsError("RAG_ENV=production requires RAG_API_KEYS")
    if any(len(key) < 16 for key in keys) and environment == "production":
        raise UnsafeSettingsError("API keys must be at least 16 characters in production")
    generator_key = environ.get("RAG_GENERATOR_API_KEY", "").strip() or None
    return Settings(
        environment=environment,  # type: ignore[arg-type]
        api_keys=keys,
        generator_api_key=generator_key,
    )
