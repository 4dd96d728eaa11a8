"""A job graph split over two workers: each builds its share; keyed edges cross on the socket.

Both shares are built here, in one loop, connected by a socket pair, as two
worker processes would build them from the same spec.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.checkpoint.barriers import CheckpointBarrier
from aiostream_ckpt.connectors.base import ConnectorContext
from aiostream_ckpt.connectors.generator import GeneratorSource
from aiostream_ckpt.jobspec.config import JobConfig
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.graph import build_chain_specs, plan_chains
from aiostream_ckpt.runtime.network.placement import ProcessShare, worker_tasks
from aiostream_ckpt.runtime.network.remote import ChannelConnection, RemoteChannelWriter
from aiostream_ckpt.runtime.partitioners import KeyGroupGate
from aiostream_ckpt.runtime.wire import batch_codec


def build_share(
    share: ProcessShare | None,
    tmp_path: Path,
    *,
    reinterpret: bool = False,
    mapped: bool = False,
) -> tuple[list[ChainSpec], list[tuple[str, int]]]:
    config = JobConfig(parallelism=2, chaining=False)
    env = StreamEnvironment("split", config=config)
    events = env.from_source(GeneratorSource(100, keys=10, splits=2), uid="gen")
    if mapped:  # user code between the source and the keyed edge
        events = events.map(lambda e: e, uid="pre")
    keyed = events.reinterpret_as_keyed if reinterpret else events.key_by
    keyed(lambda e: e["app_id"]).map(lambda e: e, uid="keyed").print()
    spec = env.spec()
    chains = plan_chains(spec.transformations, spec.config)

    def ctx(uid: str, sub: int, p: int, dead_letter: Any) -> ConnectorContext:
        return ConnectorContext(
            job_name="split", operator_uid=uid, subtask_index=sub, parallelism=p
        )

    specs = build_chain_specs(
        chains,
        config=spec.config,
        job_name="split",
        attempt=0,
        backend_factory=None,  # type: ignore[arg-type]  # no keyed state in this job
        local_dir=tmp_path,
        dead_letter_factory=None,
        connector_context=ctx,
        monotonic=lambda: 0.0,
        share=share,
    )
    return specs, [(c.head.uid, c.parallelism) for c in chains]


@pytest.fixture
async def shares(tmp_path: Path) -> AsyncIterator[tuple[list[ChainSpec], list[ChainSpec]]]:
    s0, s1 = socket.socketpair()
    c0 = ChannelConnection("w0->w1", batch_codec())
    c1 = ChannelConnection("w1->w0", batch_codec())
    specs0, _ = build_share(ProcessShare(0, 2, {1: c0}), tmp_path)
    specs1, _ = build_share(ProcessShare(1, 2, {0: c1}), tmp_path)
    await c0.start(s0)
    await c1.start(s1)
    yield specs0, specs1
    await c0.close()
    await c1.close()


def by_id(specs: list[ChainSpec]) -> dict[str, ChainSpec]:
    return {s.task_id: s for s in specs}


async def test_each_worker_builds_its_share_of_the_tasks(
    tmp_path: Path, shares: tuple[list[ChainSpec], list[ChainSpec]]
) -> None:
    all_specs, chains = build_share(None, tmp_path)
    for worker, specs in enumerate(shares):
        assert [s.task_id for s in specs] == sorted(
            worker_tasks(chains, worker, 2), key=[s.task_id for s in all_specs].index
        )
    assert sorted(s.task_id for s in shares[0] + shares[1]) == sorted(s.task_id for s in all_specs)


async def test_a_keyed_edge_crosses_to_the_other_worker_in_band(
    shares: tuple[list[ChainSpec], list[ChainSpec]],
) -> None:
    w0, w1 = (by_id(s) for s in shares)
    keyed_gates = [t for t in w0 if t.startswith("keyed")], [t for t in w1 if t.startswith("keyed")]
    assert keyed_gates == (["keyed-0"], ["keyed-1"])
    out = w0["gen-0"].outputs[0]
    assert isinstance(out, KeyGroupGate)
    # to keyed-0 in this process, to keyed-1 over the connection
    assert not isinstance(out.writers[0], RemoteChannelWriter)
    assert isinstance(out.writers[1], RemoteChannelWriter)
    records = [{"app_id": f"app-{i}", "n": i} for i in range(40)]
    await out.emit(records)
    await out.broadcast_control(CheckpointBarrier(1, 0.0))
    local_gate, remote_gate = w0["keyed-0"].input_gate, w1["keyed-1"].input_gate
    assert local_gate is not None and remote_gate is not None
    local = [local_gate.queue.get_nowait() for _ in range(2)]
    remote = [await remote_gate.queue.get() for _ in range(2)]
    # channel index 0 at both: upstream subtask 0 feeds index 0 of every downstream gate
    assert [c for c, _ in local] == [0, 0] and [c for c, _ in remote] == [0, 0]
    assert local[1][1] == remote[1][1] == CheckpointBarrier(1, 0.0)
    got = local[0][1] + remote[0][1]
    assert sorted(got, key=lambda r: r["n"]) == records
    assert all(out.route(r["app_id"]) == 1 for r in remote[0][1])
    assert all(out.route(r["app_id"]) == 0 for r in local[0][1])


@pytest.mark.parametrize("reinterpret", [False, True])
async def test_a_keyed_edge_crosses_workers_unless_the_input_is_key_grouped(
    tmp_path: Path, reinterpret: bool
) -> None:
    """reinterpret_as_keyed: subtask i feeds subtask i, which runs in the same worker."""
    share = ProcessShare(0, 2, {1: ChannelConnection("w0->w1", batch_codec())})
    specs, _ = build_share(share, tmp_path, reinterpret=reinterpret)
    writers = [w for s in specs for gate in s.outputs for w in gate.writers]
    crossing = [w for w in writers if isinstance(w, RemoteChannelWriter)]
    assert writers
    assert len(crossing) == (0 if reinterpret else 1)


@pytest.mark.parametrize("mapped", [False, True])
async def test_records_straight_from_an_exact_source_cross_unchecked(
    tmp_path: Path, mapped: bool
) -> None:
    """The generator's records reach the keyed edge untouched: the JSON check is skipped;
    after a map (user code that may build tuples, NaN ...) every batch is checked."""
    share = ProcessShare(0, 2, {1: ChannelConnection("w0->w1", batch_codec())})
    specs, _ = build_share(share, tmp_path, mapped=mapped)
    crossing = [
        w
        for s in specs
        for gate in s.outputs
        for w in gate.writers
        if isinstance(w, RemoteChannelWriter) and isinstance(gate, KeyGroupGate)
    ]
    assert len(crossing) == 1
    assert crossing[0].trusted is (not mapped)
