"""Window operators refuse a stream key that would read back as another type at its record.

The tumbling windows' buffer reaches keyed state only at the pre-barrier flush,
so an undeclared enum key (or a plain ``"dark"`` where ``key_type=Shade`` is
declared) passed every record and failed the first checkpoint whose barrier
found its window open, or never if the window fired first; after a restore
the key would have come back as another type. The general path and sessions
read state at a key's first record, which checks the key there.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.jobspec.graph import WindowKind, WindowSpec
from aiostream_ckpt.jobspec.window_functions import CountAggregate, ProcessWindowFunction
from aiostream_ckpt.jobspec.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from aiostream_ckpt.runtime.operators import RecordFailed
from aiostream_ckpt.state.codecs import StateTypeError
from tests.unit.time.support import open_window_operator, window_backend


class Shade(StrEnum):
    DARK = "dark"


class Sizes(ProcessWindowFunction[Any, Any, Any]):
    def process(self, key: Any, context: Any, elements: Any, out: Any) -> None:
        out.collect((key, len(elements)))


FUNCTIONS: dict[WindowKind, Any] = {
    WindowKind.AGGREGATE: CountAggregate(),
    WindowKind.REDUCE: lambda a, b: b,
    WindowKind.PROCESS: Sizes(),
}
ASSIGNERS = {
    "tumbling": TumblingEventTimeWindows.of(500),
    "sliding": SlidingEventTimeWindows.of(500, 250),
    "session": EventTimeSessionWindows.with_gap(300),
}
#: (declared key_type, whether the selector returns the enum, why it is refused)
KEYS = {
    "enum-untyped": (None, True, r"key of type Shade"),
    "enum-for-str": (str, True, r"key_type=str.*Shade \(a str subclass\)"),
    "str-for-enum": (Shade, False, r"key_type=Shade.*'dark' of type str"),
}


@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("lateness", [0, 700])
@pytest.mark.parametrize("kind", list(WindowKind))
@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_a_window_refuses_a_key_that_would_change_type_at_its_record(
    tmp_path: Path, assigner: str, kind: WindowKind, lateness: int, keys: str
) -> None:
    """Fails on the code before for tumbling windows without allowed lateness (every
    kind and key: nothing raised until the flush); the others passed already."""
    key_type, enum, why = KEYS[keys]
    spec = WindowSpec(
        assigner=ASSIGNERS[assigner],
        kind=kind,
        timestamp_assigner=lambda e: e["ts"],
        function=FUNCTIONS[kind],
        allowed_lateness=lateness,
        late_tag=None,
    )
    backend = window_backend(tmp_path, "w", key_type=key_type)
    # the record says which key it gets: the wrong one (as declared) or the right one
    op = open_window_operator(spec, lambda e: Shade(e["k"]) if e["enum"] else e["k"], backend)
    op.side_output = []
    with pytest.raises(RecordFailed) as err:
        op.process_batch([{"k": "dark", "enum": enum, "ts": 1}])
    assert "operator 'w'" in str(err.value)
    assert isinstance(err.value.__cause__, StateTypeError)
    assert err.value.index == 0
    assert re.search(why, str(err.value.__cause__)), err.value.__cause__
    # the right key still goes, and the flush a barrier makes finds nothing refused
    assert op.process_batch([{"k": "dark", "enum": not enum, "ts": 2}]) == []
    op.prepare_snapshot_pre_barrier(1)
    assert len(op.process_watermark(10_000)) == (2 if assigner == "sliding" else 1)  # windows
    backend.close()


def test_the_tumbling_refusal_names_the_window_and_says_what_the_key_would_become(
    tmp_path: Path,
) -> None:
    spec = WindowSpec(
        assigner=ASSIGNERS["tumbling"],
        kind=WindowKind.AGGREGATE,
        timestamp_assigner=lambda e: e["ts"],
        function=CountAggregate(),
        allowed_lateness=0,
        late_tag=None,
    )
    backend = window_backend(tmp_path, "w")
    op = open_window_operator(spec, lambda e: Shade(e["k"]), backend)
    ok = {"k": "dark", "ts": 1}
    with pytest.raises(RecordFailed) as err:
        op.process_batch([ok])
    assert str(err.value.__cause__).startswith(
        "window 'w': key_by gave a key of type Shade (<Shade.DARK: 'dark'>): keyed state "
        "stores keys as JSON, so after a restore it would come back as 'dark' (str)"
    )
    backend.close()
