"""A record whose user function raised outside an operator's record loop: dead letter or failure.

A key selector in the shuffle, ``on_timer``, a window firing, a source's
timestamp assigner, a sink's serializer: their errors are caught where the
code runs, and :func:`dead_letter_or_raise` applies the
job's ``errors.on_process_error``. Apart from ``runtime.failures`` (which
reads operators' frames) so that operators and gates can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from aiostream_ckpt.connectors.base import RecordErrorFn
from aiostream_ckpt.errors import AiostreamError, UserFunctionError
from aiostream_ckpt.user_errors import short_repr, user_frame, user_traceback


def is_record_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the user function's: our own errors and out-of-memory are never."""
    return isinstance(exc, Exception) and not isinstance(exc, AiostreamError | MemoryError)


def unhashable_key_hint(selector: Callable[[Any], Any] | None, record: Any, exc: Exception) -> str:
    """Say that ``key_by``'s selector returned an unhashable key, when that is why ``exc`` arose.

    ``TypeError: unhashable type: 'list'`` from the engine's key lookups names
    neither the key nor the function that made it; a new user's first key is
    often a list. Computed only for a failure, never per record.
    """
    if not (isinstance(exc, TypeError) and str(exc).startswith("unhashable type")):
        return ""
    if selector is None or record is None:
        return " (if the key selector of key_by returns a list, dict or set: keys must be hashable)"
    try:
        key = selector(record)
    except Exception:  # only a hint: the error itself is reported as it is
        return ""
    try:
        hash(key)
    except TypeError:
        return (
            f" (the key selector of key_by returned {short_repr(key)}, a "
            f"{type(key).__name__}: keys must be hashable, e.g. a tuple instead of a list)"
        )
    return ""  # the key hashes: the user function hashed something else


def raise_record_failure(
    function: str,
    uid: str,
    what: str,
    record: Any,
    exc: Exception,
    key_selector: Callable[[Any], Any] | None = None,
) -> NoReturn:
    """Fail the job: ``function`` of operator ``uid`` raised ``exc`` on ``record`` (a ``what``).

    For user code that runs outside an operator's record loop (a key selector
    in the shuffle, ``on_timer``, a window function), whose frames
    :func:`user_function_error` cannot read. Our own errors pass as they are.
    """
    if not is_record_error(exc):
        raise exc
    at = user_frame(exc)
    where = f" at {at}" if at else ""
    hint = unhashable_key_hint(key_selector, record, exc) if key_selector else ""
    raise UserFunctionError(
        f"{function} of operator {uid!r} failed on {what} {short_repr(record)}{where}: "
        f"{type(exc).__name__}: {exc}{hint}",
        detail=user_traceback(exc),
    ) from exc


def dead_letter_or_raise(
    handler: Any,
    function: str,
    uid: str,
    what: str,
    record: Any,
    exc: Exception,
    key_selector: Callable[[Any], Any] | None = None,
) -> None:
    """Dead-letter ``record`` through ``handler`` (a ``ProcessErrorHandler``), or fail the job.

    ``handler`` is ``None`` under ``errors.on_process_error=fail``; our own
    errors are never dead-lettered. ``key_selector``: the failing function
    routed records by key (an unhashable key is then named).
    """
    if handler is None or not is_record_error(exc):
        raise_record_failure(function, uid, what, record, exc, key_selector)
    handler.dead_letter(uid, record, exc, function)


def record_error_policy(handler: Any, uid: str) -> RecordErrorFn:
    """Make the ``record_failed`` of a ``RecordFunctions`` component of ``uid``.

    A source's timestamp assigner, a sink's serializer: ``handler`` as in
    :func:`dead_letter_or_raise`.
    """

    def failed(function: str, record: Any, exc: Exception) -> None:
        dead_letter_or_raise(handler, function, uid, "record", record, exc)

    return failed
