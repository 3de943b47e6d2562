"""app.settings: environment-only settings, refusing unsafe production setups."""

from __future__ import annotations

import pytest

from app.settings import Settings, UnsafeSettingsError, load_settings

LONG_KEY = "k" * 16


def test_development_is_the_default_and_needs_no_keys():
    settings = load_settings({})

    assert settings == Settings(environment="development", api_keys=())
    assert settings.auth_required is False


def test_keys_are_split_on_commas_and_trimmed():
    settings = load_settings({"RAG_API_KEYS": " a , b,, c ", "RAG_ENV": "development"})

    assert settings.api_keys == ("a", "b", "c")
    assert settings.auth_required is True


def test_production_with_long_keys_is_accepted_and_env_is_normalized():
    settings = load_settings({"RAG_ENV": " Production ", "RAG_API_KEYS": LONG_KEY})

    assert settings == Settings(environment="production", api_keys=(LONG_KEY,))


@pytest.mark.parametrize("keys", ["", " , ", None])
def test_production_without_keys_is_refused(keys):
    environ = {"RAG_ENV": "production"}
    if keys is not None:
        environ["RAG_API_KEYS"] = keys

    with pytest.raises(UnsafeSettingsError, match="requires RAG_API_KEYS"):
        load_settings(environ)


def test_production_with_a_short_key_is_refused():
    with pytest.raises(UnsafeSettingsError, match="at least 16 characters"):
        load_settings({"RAG_ENV": "production", "RAG_API_KEYS": f"{LONG_KEY},short"})


@pytest.mark.parametrize("value", ["staging", "prod", ""])
def test_unknown_environment_is_refused(value):
    with pytest.raises(UnsafeSettingsError, match="RAG_ENV must be development or production"):
        load_settings({"RAG_ENV": value})


def test_reads_the_process_environment_when_none_is_given(monkeypatch):
    monkeypatch.setenv("RAG_ENV", "production")
    monkeypatch.setenv("RAG_API_KEYS", LONG_KEY)

    assert load_settings().api_keys == (LONG_KEY,)


def test_the_generator_api_key_is_read_and_trimmed():
    settings = load_settings({"RAG_GENERATOR_API_KEY": "  sk-external \n"})

    assert settings.generator_api_key == "sk-external"


@pytest.mark.parametrize("value", ["", "   ", None])
def test_an_empty_or_missing_generator_api_key_is_none(value):
    environ = {} if value is None else {"RAG_GENERATOR_API_KEY": value}

    assert load_settings(environ).generator_api_key is None


def test_the_generator_api_key_is_not_a_client_key():
    # The key this service sends to its generation server does not open this service's /v1.
    settings = load_settings({"RAG_GENERATOR_API_KEY": LONG_KEY})

    assert (settings.api_keys, settings.auth_required) == ((), False)
