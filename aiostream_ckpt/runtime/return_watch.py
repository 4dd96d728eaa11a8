"""A process function's returned value, flagged once without a per-record cost."""

from __future__ import annotations

import logging
from typing import Any

from aiostream_ckpt.user_errors import short_repr

#: calls of ``process_element`` watched for a returned value before the check is removed
RETURN_CHECK_CALLS = 1000


class ReturnWatch:
    """Stands in for an operator's function for its first calls to flag a returned value.

    A value returned by ``process_element`` is dropped (output goes through
    ``out.collect``), which is almost always a mistake. The operator looks its
    function's ``process_element`` up once per batch, so this watch answers
    for the first :data:`RETURN_CHECK_CALLS` calls (or until the first value)
    and then puts the real function back on the operator: steady state pays
    nothing, and the user's function object is not touched (an attribute
    shadowing its method would cost its per-record attribute loads).

    A warning, not an error: nothing the function collected is lost, and a
    running job should not stop because a helper's return value passed through
    (``return self.helper(...)``).
    """

    def __init__(self, operator: Any, log: logging.Logger) -> None:
        self._operator = operator
        self._function = operator.function
        self._log = log
        self._calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def process_element(self, value: Any, ctx: Any, out: Any) -> Any:
        result = self._function.process_element(value, ctx, out)
        if self._calls < 0:  # done; the rest of this batch still calls through here
            return result
        self._calls += 1
        if result is not None or self._calls >= RETURN_CHECK_CALLS:
            self._calls = -1
            self._operator.function = self._function  # back to the real function
            if result is not None:
                self._log.warning(
                    "operator %r: %s.process_element returned %s instead of emitting it with "
                    "out.collect(...): returned values are dropped (warned once)",
                    self._operator.uid,
                    type(self._function).__name__,
                    short_repr(result),
                )
        return result
