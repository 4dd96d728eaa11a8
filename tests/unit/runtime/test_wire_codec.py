"""The JSON batch codec's exactness rule: flat records proven by types, the rest by a round trip.

What is checked: a batch of flat records is encoded without decoding it
again (the cheap rule), and everything the round trip refused is still
refused, with the same message, when it sits in an otherwise flat record
(enums, UUIDs, tuples, non-finite floats, subclasses, nested misfits).
"""

from __future__ import annotations

import enum
import uuid
from collections import OrderedDict
from typing import Any

import orjson
import pytest

from aiostream_ckpt.errors import ChannelRecordError
from aiostream_ckpt.runtime import wire
from aiostream_ckpt.runtime.wire import JsonBatchCodec, exact_by_types


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


class Tag(str):
    pass


FLAT: list[list[Any]] = [
    [{"app_id": "a", "ts": 1, "ok": True, "none": None}, {"app_id": "b", "ts": -(2**63)}],
    [{"x": 1.5, "y": -0.0}, {"x": 2.0}],
    ["a", 1, True, None],
    [{}],
    [],
]

REFUSED: list[tuple[list[Any], str]] = [
    (
        [{"app_id": "a"}, {"app_id": Color.RED}],
        r"record 1 of the batch: record\['app_id'\] is a Color",
    ),
    ([{"id": uuid.UUID(int=7)}], r"record\['id'\] is a UUID"),
    ([{"k": ("a", 1)}], r"record\['k'\] is a tuple"),
    ([{"x": float("nan")}], "float that is not finite"),
    ([{"x": 1.0, "n": None}, {"x": float("inf")}], "float that is not finite"),
    ([{"x": [1, (2, 3)]}], r"record\['x'\]\[1\] is a tuple"),
    ([("a", 1)], "record is a tuple"),
    ([Color.RED], "record is a Color"),
]


@pytest.mark.parametrize("batch", FLAT)
def test_flat_records_are_proven_by_their_types(
    batch: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = orjson.dumps(batch)
    assert exact_by_types(batch, data)

    def no_round_trip(_: bytes) -> Any:
        raise AssertionError("a flat batch was decoded again")

    codec = JsonBatchCodec()
    monkeypatch.setattr(wire.orjson, "loads", no_round_trip)
    assert codec.encode(batch) == data
    monkeypatch.undo()
    assert codec.decode(data) == batch


@pytest.mark.parametrize(("batch", "message"), REFUSED)
def test_what_would_not_come_back_equal_is_still_refused(batch: list[Any], message: str) -> None:
    with pytest.raises(ChannelRecordError, match=message):
        JsonBatchCodec().encode(batch)


def test_what_types_cannot_prove_takes_the_round_trip() -> None:
    codec = JsonBatchCodec()
    nested = [{"a": [1, {"b": None}], "c": {"d": 1.5}}]
    assert not exact_by_types(nested, orjson.dumps(nested))
    assert codec.decode(codec.encode(nested)) == nested
    # equal after the round trip, as before: a str subclass, an int enum, a dict subclass
    for batch in ([{"k": Tag("v")}], [{"k": Level.HIGH}], [OrderedDict(a=1)]):
        assert not exact_by_types(batch, orjson.dumps(batch))
        assert codec.decode(codec.encode(batch)) == batch
    # a float beside a null is not proven by the bytes: decoded and compared, and passes
    floats = [{"x": 1.0, "n": None}]
    assert not exact_by_types(floats, orjson.dumps(floats))
    assert codec.decode(codec.encode(floats)) == floats


def test_trusted_records_skip_the_check() -> None:
    """A channel the graph trusts (records straight from an exact source) is not checked:
    what the check would refuse is encoded as is, so trust must only be given by the graph."""
    codec = JsonBatchCodec()
    assert codec.decode(codec.encode([{"k": (1, 2)}], trusted=True)) == [{"k": [1, 2]}]
    with pytest.raises(ChannelRecordError):  # orjson itself still refuses what it cannot write
        codec.encode([{"k": {1, 2}}], trusted=True)
