"""Broadcast state: every instance gets the broadcast stream; the state is checkpointed once."""

from __future__ import annotations

from collections import Counter
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from aiostream_ckpt.api import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    ProcessFunction,
    StreamEnvironment,
    ValueStateDescriptor,
)
from aiostream_ckpt.api.functions import RuntimeContext
from aiostream_ckpt.connectors.collection import CollectionSource
from aiostream_ckpt.errors import JobFailedError, JobGraphError, StateError, StateMigrationError
from aiostream_ckpt.jobspec.broadcast import BroadcastSpec
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.two_input.broadcast import (
    BroadcastProcessOperator,
    BroadcastStateError,
    KeyedBroadcastProcessOperator,
)
from aiostream_ckpt.state.codecs import StateTypeError
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.state.lmdb import LmdbStateBackend
from aiostream_ckpt_dev.lookup_service import segment_of
from apps.fraud_rules import FraudCheck, expected_output, write_inputs
from tests.helpers import completed_checkpoint
from tests.unit.time.support import strategy

LIMITS: MapStateDescriptor[str, tuple[int, str]] = MapStateDescriptor(
    "limits", str, tuple[int, str]
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.mark.parametrize("parallelism", [1, 3])
def test_fraud_check_matches_the_rules_in_force(tmp_path: Path, parallelism: int) -> None:
    """Keyed side held until event time passes it: the output is the oracle's at any parallelism."""
    txn_path, rules_path = write_inputs(tmp_path, 3000, accounts=40, seed=parallelism)
    # the segment the app's async lookup adds
    txns = [{**t, "segment": segment_of(t["account"])} for t in _jsonl(txn_path)]
    env = StreamEnvironment("t", config=JobConfig(batch_size=64))
    ts_strategy = strategy()
    a = env.from_source(CollectionSource(txns), uid="txns", watermark_strategy=ts_strategy)
    rules = env.from_source(
        CollectionSource(_jsonl(rules_path)), uid="rules", watermark_strategy=ts_strategy
    )
    checked = (
        a.key_by(lambda t: t["account"])
        .connect(rules.broadcast(MapStateDescriptor("rules", str, list)))
        .process(FraudCheck(), uid="check", parallelism=parallelism)
    )
    got = env.execute_and_collect(checked)
    params = {"transactions": str(txn_path), "rules": str(rules_path)}
    assert sorted(got, key=lambda r: r["seq"]) == sorted(
        expected_output(params), key=lambda r: r["seq"]
    )
    assert any(r["alerts"] for r in got) and any(not r["alerts"] for r in got)


class Seen(BroadcastProcessFunction[int, str, Any]):
    """Emits, per instance, each broadcast record it got and each record with the state's size."""

    def open(self, ctx: RuntimeContext) -> None:
        self.subtask = ctx.subtask_index

    def process_element(self, value: int, ctx: Any, out: Any) -> None:
        out.collect(("rec", value))

    def process_broadcast_element(self, value: str, ctx: Any, out: Any) -> None:
        ctx.get_broadcast_state(LIMITS).put(value, (len(value), value))
        out.collect(("bc", self.subtask, value))


def test_every_instance_gets_every_broadcast_record() -> None:
    env = StreamEnvironment("t", config=JobConfig(batch_size=2))
    words = ["a", "bb", "ccc", "dddd", "eeeee"]
    words_src = CollectionSource(words)
    bc = env.from_source(words_src, uid="words", parallelism=2).broadcast(LIMITS)
    nums = env.from_collection(list(range(20)), uid="nums")
    out = env.execute_and_collect(nums.connect(bc).process(Seen(), uid="seen", parallelism=3))
    assert Counter(o for o in out if o[0] == "bc") == Counter(
        ("bc", sub, w) for sub in range(3) for w in words
    )
    assert sorted(o[1] for o in out if o[0] == "rec") == list(range(20))


class WritesOnKeyedSide(KeyedBroadcastProcessFunction[Any, Any, Any]):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.get_broadcast_state(LIMITS).put("x", (1, "x"))

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        pass


def test_keyed_side_cannot_write_broadcast_state() -> None:
    env = StreamEnvironment("t")
    bc = env.from_collection(["r"], uid="r").broadcast(LIMITS)
    s = env.from_collection([1, 2], uid="n").key_by(lambda x: x).connect(bc)
    with pytest.raises(JobFailedError, match="read-only here"):
        env.execute_and_collect(s.process(WritesOnKeyedSide(), uid="w"))


def test_the_function_must_match_the_stream() -> None:
    env = StreamEnvironment("t")
    bc = env.from_collection(["r"], uid="r").broadcast(LIMITS)
    with pytest.raises(JobGraphError, match="needs a KeyedBroadcastProcessFunction"):
        env.from_collection([1]).key_by(lambda x: x).connect(bc).process(Seen())
    with pytest.raises(JobGraphError, match="needs a BroadcastProcessFunction"):
        env.from_collection([1]).connect(bc).process(WritesOnKeyedSide())
    with pytest.raises(JobGraphError, match="MapStateDescriptors with distinct names"):
        env.from_collection([1]).broadcast(LIMITS, LIMITS)


class Plain(ProcessFunction[Any, Any]):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.get_broadcast_state(LIMITS)


def test_broadcast_state_needs_a_broadcast_function() -> None:
    env = StreamEnvironment("t")
    with pytest.raises(JobFailedError, match="broadcast state needs"):
        env.execute_and_collect(env.from_collection([1]).process(Plain(), uid="p"))


def _operator(subtask: int, parallelism: int, *descriptors: Any) -> BroadcastProcessOperator:
    op = BroadcastProcessOperator("bc", BroadcastSpec(Seen(), descriptors or (LIMITS,)))
    op.open(_ctx(subtask, parallelism))
    return op


def test_checkpointed_once_and_restored_into_every_instance_at_another_parallelism() -> None:
    old = [_operator(i, 2) for i in range(2)]
    for op in old:
        op.process_batch2(["a", "bbb"])
    states = {i: op.snapshot_state() for i, op in enumerate(old)}
    assert states[1] is None  # instance 0's copy is everyone's
    assert states[0] is not None
    ckpt = completed_checkpoint("bc", 2, {0: {"parallelism": 2, "operator": states[0]}})
    for sub in range(3):
        new = BroadcastProcessOperator("bc", BroadcastSpec(Seen(), (LIMITS,)))
        new.restore_state(ckpt, sub, 3)
        new.open(_ctx(sub, 3))
        state = new.broadcast_states.get(LIMITS)
        assert dict(state.items()) == {"a": (1, "a"), "bbb": (3, "bbb")}  # tuples stay tuples


def _ctx(sub: int, p: int) -> RuntimeContext:
    return RuntimeContext(
        operator_uid="bc", subtask_index=sub, parallelism=p, params={}, backend=None
    )


def test_restore_refuses_state_the_app_no_longer_declares() -> None:
    op = _operator(0, 1)
    op.process_batch2(["a"])
    ckpt = completed_checkpoint("bc", 1, {0: {"operator": op.snapshot_state()}})
    other = MapStateDescriptor("other", str, int)
    new = BroadcastProcessOperator("bc", BroadcastSpec(Seen(), (other,)))
    with pytest.raises(BroadcastStateError, match=r"no longer declares"):
        new.restore_state(ckpt, 0, 1)


@pytest.mark.parametrize(
    ("now", "what"),
    [
        (MapStateDescriptor("limits", str, list[int | str]), r"tuple\[int,str\].*list"),
        (MapStateDescriptor("limits", str), "declares no type"),
        (MapStateDescriptor("limits", str, tuple[int, str], serializer="pickle"), "pickle"),
    ],
    ids=["other-type", "untyped", "pickle"],
)
def test_restore_refuses_a_broadcast_state_whose_type_changed(now: Any, what: str) -> None:
    """Stored JSON decodes into what is declared now: (1, "a") came back as [1, "a"] under
    list[int | str] or no type, and pickle read JSON text as a pickle. Refused, as keyed
    state is (fails on the code before: restored, as lists)."""
    op = _operator(0, 1)
    op.process_batch2(["a"])
    ckpt = completed_checkpoint("bc", 1, {0: {"operator": op.snapshot_state()}})
    new = BroadcastProcessOperator("bc", BroadcastSpec(Seen(), (now,)))
    with pytest.raises(StateMigrationError, match=rf"'limits'.*{what}"):
        new.restore_state(ckpt, 0, 1)


Lim = make_dataclass("Lim", [("n", int)])


@pytest.mark.parametrize(
    ("now", "what"),
    [
        (make_dataclass("Lim", [("n", float)]), "field 'n' was written as int, .* declares float"),
        (make_dataclass("Lim", [("n", int), ("at", int)]), "without field 'at'"),
    ],
    ids=["field-type", "required-field"],
)
def test_restore_refuses_a_broadcast_class_whose_fields_changed(now: Any, what: str) -> None:
    """A dataclass that keeps its name but not its fields' types: its stored entries
    read back as another type (Lim(1) as Lim(1.0)), or failed the restore's decode
    naming neither state's types. Fails on the code before (restored; another error)."""
    op = _operator(0, 1, MapStateDescriptor("lims", str, Lim))
    op.broadcast_states.get(MapStateDescriptor("lims", str, Lim)).put("a", Lim(1))
    ckpt = completed_checkpoint("bc", 1, {0: {"operator": op.snapshot_state()}})
    new = BroadcastProcessOperator(
        "bc", BroadcastSpec(Seen(), (MapStateDescriptor("lims", str, now),))
    )
    with pytest.raises(StateMigrationError, match=rf"state 'lims': .*Lim values .*{what}"):
        new.restore_state(ckpt, 0, 1)
    grown = make_dataclass("Lim", [("n", int), ("at", int, field(default=0))])
    new = BroadcastProcessOperator(
        "bc", BroadcastSpec(Seen(), (MapStateDescriptor("lims", str, grown),))
    )
    new.restore_state(ckpt, 0, 1)
    new.open(_ctx(0, 1))
    assert dict(new.broadcast_states.get(MapStateDescriptor("lims", str, grown)).items()) == {
        "a": grown(1, 0)
    }


def test_values_are_checked_at_put() -> None:
    op = _operator(0, 1, MapStateDescriptor("untyped"))
    state = op.broadcast_states.get(MapStateDescriptor("untyped"))
    with pytest.raises(StateTypeError, match="untyped"):
        state.put("k", (1, 2))  # a tuple would come back as a list
    with pytest.raises(StateError):
        state.put(object(), 1)
    with pytest.raises(BroadcastStateError, match="no broadcast state 'limits'"):
        op.broadcast_states.get(LIMITS)


COUNT = ValueStateDescriptor("count", int, default=0)


class CountUntilReset(KeyedBroadcastProcessFunction[Any, Any, Any]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        self.count.update(self.count.value() + 1)
        out.collect((ctx.current_key, self.count.value()))

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        def visit(key: Any, state: Any) -> None:
            out.collect(("had", key, state.value()))
            if key in value:
                state.clear()

        ctx.apply_to_keyed_state(COUNT, visit)


def test_the_broadcast_side_reaches_every_key_through_apply_to_keyed_state(
    tmp_path: Path,
) -> None:
    backend = LmdbStateBackend(
        operator_uid="kb",
        subtask_index=0,
        key_group_range=KeyGroupRange(0, 127),
        max_parallelism=128,
        local_dir=tmp_path,
    )
    op = KeyedBroadcastProcessOperator(
        "kb", BroadcastSpec(CountUntilReset(), (LIMITS,), (lambda v: v, None))
    )
    op.backend = backend
    op.open(
        RuntimeContext(
            operator_uid="kb", subtask_index=0, parallelism=1, params={}, backend=backend
        )
    )
    op.process_batch(["a", "b", "a", "c"])
    out = op.process_batch2([["a", "c"]])  # reset a and c
    assert sorted(out) == [("had", "a", 2), ("had", "b", 1), ("had", "c", 1)]
    assert op.process_batch(["a", "b", "c"]) == [("a", 1), ("b", 2), ("c", 1)]
    backend.close()


def test_restore_takes_a_broadcast_map_whose_types_widened() -> None:
    """int -> int | None, in the map's value type and in a class's field: its
    entries read back as written. Fails on the code before (StateMigrationError)."""
    op = _operator(0, 1, MapStateDescriptor("lims", str, Lim), MapStateDescriptor("caps", str, int))
    op.broadcast_states.get(MapStateDescriptor("lims", str, Lim)).put("a", Lim(1))
    op.broadcast_states.get(MapStateDescriptor("caps", str, int)).put("a", 2)
    ckpt = completed_checkpoint("bc", 1, {0: {"operator": op.snapshot_state()}})
    wide = make_dataclass("Lim", [("n", int | None)])
    lims, caps = MapStateDescriptor("lims", str, wide), MapStateDescriptor("caps", str, int | None)
    new = BroadcastProcessOperator("bc", BroadcastSpec(Seen(), (lims, caps)))
    new.restore_state(ckpt, 0, 1)
    new.open(_ctx(0, 1))
    assert dict(new.broadcast_states.get(lims).items()) == {"a": wide(1)}
    assert dict(new.broadcast_states.get(caps).items()) == {"a": 2}
