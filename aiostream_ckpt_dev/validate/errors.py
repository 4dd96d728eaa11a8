"""Errors of the validation jobs.

A failed check is not an error (it is a result); these are for validations that
could not run at all, so the CLI can tell "wrong output" from "wrong setup".
"""

from __future__ import annotations

from aiostream_ckpt.errors import AiostreamError, ConfigError


class ValidationError(AiostreamError):
    """A validation could not run (Spark failed, Kafka unreachable, unreadable input)."""


class ValidationConfigError(ValidationError, ConfigError):
    """The validation is set up wrong: no Java, no Maven, a bad path or option."""
