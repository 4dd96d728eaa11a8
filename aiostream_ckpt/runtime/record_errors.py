"""A record whose user function raised outside an operator's record loop: dead letter or failure.

A key selector in the shuffle, ``on_timer``, a window firing, a source's
timestamp assigner, a sink's serializer: their errors are caught where the
code runs, and :func:`dead_letter_or_raise` applies the
job's ``errors.on_process_error``. Apart from ``runtime.failures`` (which
reads operators' frames) so that operators and gates can use it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from aiostream_ckpt.connectors.base import RecordErrorFn
from aiostream_ckpt.errors import AiostreamError, UserFunctionError
from aiostream_ckpt.user_errors import short_repr, user_frame, user_traceback


def is_record_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the user function's: our own errors and out-of-memory are never."""
    return isinstance(exc, Exception) and not isinstance(exc, AiostreamError | MemoryError)


def raise_record_failure(
    function: str, uid: str, what: str, record: Any, exc: Exception
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
    raise UserFunctionError(
        f"{function} of operator {uid!r} failed on {what} {short_repr(record)}{where}: "
        f"{type(exc).__name__}: {exc}",
        detail=user_traceback(exc),
    ) from exc


def dead_letter_or_raise(
    handler: Any, function: str, uid: str, what: str, record: Any, exc: Exception
) -> None:
    """Dead-letter ``record`` through ``handler`` (a ``ProcessErrorHandler``), or fail the job.

    ``handler`` is ``None`` under ``errors.on_process_error=fail``; our own
    errors are never dead-lettered.
    """
    if handler is None or not is_record_error(exc):
        raise_record_failure(function, uid, what, record, exc)
    handler.dead_letter(uid, record, exc, function)


def record_error_policy(handler: Any, uid: str) -> RecordErrorFn:
    """Make the ``record_failed`` of a ``RecordFunctions`` component of ``uid``.

    A source's timestamp assigner, a sink's serializer: ``handler`` as in
    :func:`dead_letter_or_raise`.
    """

    def failed(function: str, record: Any, exc: Exception) -> None:
        dead_letter_or_raise(handler, function, uid, "record", record, exc)

    return failed
