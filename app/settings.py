"""Machine-local settings and secrets, read from the environment here and nowhere else.

RAG_ENV       development (default) or production. Production refuses to start without keys.
RAG_API_KEYS  comma-separated API keys; when set, every /v1 request needs
              `Authorization: Bearer <key>`. Health probes stay open. These keys are
              admin keys: every collection.
RAG_API_KEYS_FILE
              a YAML list of `{key, scopes}`: keys limited to the collections their scopes
              name (app.keys); used beside RAG_API_KEYS or alone. Give an absolute path:
              Serve's proxy reads it too (app.proxy_guard), from its own directory.
RAG_PROXY_MAX_DRAINING
              how many refused uploads Serve's proxy drains at once so that their clients
              read their 401 (app.proxy_guard; default 32, 0 for none); past it a refused
              connection is closed unread. Bounds what unauthenticated clients make the
              proxy hold.
RAG_GENERATOR_API_KEY
              the key the generator sends to an external OpenAI-compatible server
              (generator.engine: openai), when that server asks for one.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from app.keys import ADMIN, Grant, KeyFileError, load_key_file


class UnsafeSettingsError(RuntimeError):
    """A production deployment was started with a setting that is only safe in development."""


@dataclass(frozen=True)
class Settings:
    environment: Literal["development", "production"]
    api_keys: tuple[str, ...]
    generator_api_key: str | None = None
    # What each key may do; a key missing here (RAG_API_KEYS) is an admin key.
    grants: Mapping[str, Grant] = field(default_factory=dict)
    # Where the scoped keys were read from (RAG_API_KEYS_FILE), for a reader that reloads it.
    key_file: Path | None = None
    # Refused uploads Serve's proxy drains at once (app.proxy_guard).
    proxy_max_draining: int = 32

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys)

    def grant(self, key: str) -> Grant:
        return self.grants.get(key, ADMIN)

    def key_of(self, authorization: str | None) -> str | None:
        """The configured key an `Authorization: Bearer <key>` header carries, or None.
        Every key is compared, so the time taken does not say which one came close."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        matches = [k for k in self.api_keys if hmac.compare_digest(token.encode(), k.encode())]
        return matches[0] if scheme.lower() == "bearer" and matches else None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; raise UnsafeSettingsError on unsafe production setups."""
    environ = os.environ if environ is None else environ
    environment = environ.get("RAG_ENV", "development").strip().lower()
    if environment not in ("development", "production"):
        raise UnsafeSettingsError(f"RAG_ENV must be development or production, not {environment!r}")
    keys = tuple(key.strip() for key in environ.get("RAG_API_KEYS", "").split(",") if key.strip())
    grants: dict[str, Grant] = {}
    if key_file := environ.get("RAG_API_KEYS_FILE", "").strip():
        try:
            grants = load_key_file(Path(key_file))
        except KeyFileError as exc:
            raise UnsafeSettingsError(f"RAG_API_KEYS_FILE: {exc}") from None
        if overlap := set(grants) & set(keys):
            raise UnsafeSettingsError(
                f"{len(overlap)} key(s) both in RAG_API_KEYS (admin) and RAG_API_KEYS_FILE"
            )
        keys = (*keys, *grants)
    if environment == "production" and not keys:
        raise UnsafeSettingsError("RAG_ENV=production requires RAG_API_KEYS")
    if any(len(key) < 16 for key in keys) and environment == "production":
        raise UnsafeSettingsError("API keys must be at least 16 characters in production")
    generator_key = environ.get("RAG_GENERATOR_API_KEY", "").strip() or None
    draining = environ.get("RAG_PROXY_MAX_DRAINING", "32").strip()
    if not draining.isdigit():
        raise UnsafeSettingsError(f"RAG_PROXY_MAX_DRAINING must be a count, not {draining!r}")
    return Settings(
        environment=environment,  # type: ignore[arg-type]
        api_keys=keys,
        generator_api_key=generator_key,
        grants=grants,
        key_file=Path(key_file) if key_file else None,
        proxy_max_draining=int(draining),
    )
