"""What failed in user code: operator uid, record, source position, the app's traceback.

A user function's exception reaches the task as it was raised. Before the
task closes, :func:`user_function_error` reads the traceback's frames to say
which operator was running which user function on which record: the
operators' loops keep the current record in a local (``rec``), and for
``map``/``filter``, run by the C ``map()``, the record is the user function's
argument. Nothing is recorded per record, so the hot path pays nothing; the
frames are only read when something failed.
"""

from __future__ import annotations

from types import FrameType, TracebackType
from typing import Any

from aiostream_ckpt.errors import AiostreamError, UserFunctionError
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.runtime.record_errors import unhashable_key_hint
from aiostream_ckpt.user_errors import short_repr, user_frame, user_traceback

#: an operator method -> what the user function was doing
_PHASES = {
    "process_batch": "on a record",
    "_run": "on a record",  # the process operators' loop (either input of two-input ones)
    "_run_keyed": "on a record",  # the keyed ones'
    "_add_batch": "on a record",  # windows' loop
    "_add_tumbling": "on a record",  # tumbling windows' loop
    "open": "in open()",
    "close": "in close()",
    "finish": "at the end of input",
    "process_watermark": "firing an event-time timer",
    "process_processing_time": "firing a processing-time timer",
}


def _frames(tb: TracebackType | None) -> list[FrameType]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def _first_argument(frame: FrameType) -> Any:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return frame.f_locals.get(names[0]) if names else None


def user_function_error(
    exc: Exception, *, source_position: dict[str, Any] | None = None, first_uid: str | None = None
) -> UserFunctionError | None:
    """Describe ``exc`` if a user function run by an operator raised it, else ``None``.

    ``source_position``: the task's source read position, shown when the failing
    operator is ``first_uid`` (the first in a chain headed by that source), so
    the record came from the batch read up to there.
    """
    if isinstance(exc, AiostreamError):
        return None
    frames = _frames(exc.__traceback__)
    for i in range(len(frames) - 1, -1, -1):
        op = frames[i].f_locals.get("self")
        if isinstance(op, StreamOperator):
            break
    else:
        return None
    method = frames[i].f_code.co_name
    what = f"operator {op.uid!r} failed {_PHASES.get(method, 'in ' + method)}"
    if _PHASES.get(method) == "on a record":
        record = frames[i].f_locals.get("rec")
        if record is None and i + 1 < len(frames):
            record = _first_argument(frames[i + 1])
        if record is not None:
            what += f" {short_repr(record)}"
        if source_position and op.uid == first_uid:
            where = ", ".join(f"{split} @ {pos}" for split, pos in source_position.items())
            what += f" (in the batch read up to {where})"
    else:
        record = None
    at = user_frame(exc)
    if at is not None:
        what += f" at {at}"
    hint = unhashable_key_hint(getattr(op, "_key_selector", None), record, exc) if op.keyed else ""
    return UserFunctionError(
        f"{what}: {type(exc).__name__}: {exc}{hint}", detail=user_traceback(exc)
    )
