"""Tracebacks of user code, trimmed to the user's frames.

An exception in an app (its import, ``build(env)``, a function run on a
record) is reported with the frames of the app's own files: the engine's
frames (this package) and the import machinery say nothing to the user and
would bury the line that failed. Only failures are formatted: nothing here
runs per record.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parent)
#: the import machinery: ``import_module``'s own frame is a file, not ``<frozen ...>``
_IMPORTLIB = str(Path(importlib.__file__).resolve().parent)
_MAX_RECORD_CHARS = 300


def _is_users(filename: str) -> bool:
    if filename.startswith(("<frozen ", "<string>")):
        return False
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith((_PACKAGE, _IMPORTLIB))


def short_repr(record: Any) -> str:
    """``repr`` of a record (or a returned value), cut to a log line's worth."""
    text = repr(record)
    return text if len(text) <= _MAX_RECORD_CHARS else text[:_MAX_RECORD_CHARS] + "..."


def function_name(fn: Any) -> str:
    """How an error names a user function: its qualified name, else its ``repr``."""
    return getattr(fn, "__qualname__", None) or repr(fn)


def user_traceback(exc: BaseException) -> str:
    """``Traceback`` text of ``exc`` with only the user's frames ('' when there are none).

    The exception line itself is not included: callers put the cause in their
    one-line message and this text above it. A ``SyntaxError`` in the app's
    code ends with the line the parser stopped at.
    """
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    lines = traceback.format_list(frames)
    if isinstance(exc, SyntaxError) and exc.filename and _is_users(exc.filename):
        lines += traceback.format_exception_only(exc)[:-1]  # less the "SyntaxError: ..." line
    if not lines:
        return ""
    return "Traceback (the app's frames, most recent call last):\n" + "".join(lines).rstrip("\n")


def user_frame(exc: BaseException) -> str | None:
    """``file:line in function`` of the innermost user frame of ``exc``, if any."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    if not frames:
        return None
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"
