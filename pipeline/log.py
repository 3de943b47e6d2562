"""Loggers under Ray Serve's logger, so replica logs carry the request id Serve attaches."""

from __future__ import annotations

import logging

SERVE_LOGGER = "ray.serve"


def get_logger(name: str) -> logging.Logger:
    """A child of Serve's logger; use lazy `%s` formatting on it."""
    return logging.getLogger(f"{SERVE_LOGGER}.{name}")
