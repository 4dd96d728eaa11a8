"""From the logical graph to the tasks that run: chains, channels, gates.

Operators are *chained* into one task (as Flink does) when they are connected
forward at equal parallelism and the upstream has no other consumer; a keyed
edge between two operators of parallelism 1 is forward too. Each downstream
task instance gets one input gate; each upstream instance one output gate per
outgoing edge, holding a writer per channel it feeds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiostream_ckpt.barrier.aligned import AlignedBarrierHandler
from aiostream_ckpt.barrier.alternating import AlternatingBarrierHandler
from aiostream_ckpt.barrier.handler import BarrierHandler
from aiostream_ckpt.barrier.tracker import CheckpointBarrierTracker
from aiostream_ckpt.barrier.unaligned import UnalignedBarrierHandler
from aiostream_ckpt.connectors.base import ConnectorContext, DeadLetterFn
from aiostream_ckpt.connectors.files import DeadLetterWriter
from aiostream_ckpt.errors import JobGraphError
from aiostream_ckpt.jobspec.async_functions import AsyncSpec
from aiostream_ckpt.jobspec.broadcast import BroadcastSpec
from aiostream_ckpt.jobspec.co_functions import CoSpec, KeyedCoProcessFunction
from aiostream_ckpt.jobspec.config import (
    CheckpointingMode,
    JobConfig,
    MalformedPolicy,
    ProcessErrorPolicy,
)
from aiostream_ckpt.jobspec.functions import KeyedProcessFunction, OutputTag, ProcessFunction
from aiostream_ckpt.jobspec.graph import (
    Partitioning,
    Transformation,
    TransformKind,
    WindowSpec,
)
from aiostream_ckpt.keygroups import Shard
from aiostream_ckpt.runtime.async_io.async_keyed import make_async_operator
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.channel_state import ChannelStateCodec
from aiostream_ckpt.runtime.channels import ChannelSender, InputGate
from aiostream_ckpt.runtime.elements import SecondInput
from aiostream_ckpt.runtime.key_group_check import KeyGroupCheck
from aiostream_ckpt.runtime.network.placement import ProcessShare, task_id
from aiostream_ckpt.runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    ProcessOperator,
    ReduceOperator,
    StreamOperator,
)
from aiostream_ckpt.runtime.partitioners import (
    BroadcastGate,
    ForwardGate,
    KeyGroupGate,
    OutputGate,
    RebalanceGate,
)
from aiostream_ckpt.runtime.side_outputs import SideOutputGate
from aiostream_ckpt.runtime.timed_process import make_keyed_process_operator
from aiostream_ckpt.runtime.two_input.broadcast import (
    BroadcastProcessOperator,
    KeyedBroadcastProcessOperator,
)
from aiostream_ckpt.runtime.two_input.co_process import (
    CoProcessOperator,
    KeyedCoProcessOperator,
    SecondInputWriter,
)
from aiostream_ckpt.runtime.windowing.session_windows import SessionWindowOperator
from aiostream_ckpt.runtime.windowing.window_operator import WindowOperator
from aiostream_ckpt.state.backend import KeyedStateBackendFactory
from aiostream_ckpt.state.keygroups import KeyGroupRange
from aiostream_ckpt.time.watermarks import SourceWatermarks

KeySelector = Callable[[Any], Any]


@dataclass
class Edge:
    source: Transformation
    target: Transformation
    partitioning: Partitioning
    key_selector: Callable[[Any], Any] | None
    #: Set on side-output edges: the tag whose records travel here.
    tag: OutputTag[Any] | None = None
    #: Which input of the target this edge feeds (1: the second of a two-input operator).
    side: int = 0


@dataclass
class Chain:
    nodes: list[Transformation]
    inputs: list[Edge] = field(default_factory=list)
    outputs: list[Edge] = field(default_factory=list)

    @property
    def head(self) -> Transformation:
        return self.nodes[0]

    @property
    def parallelism(self) -> int:
        return self.head.parallelism


_WIRING = (TransformKind.UNION, TransformKind.SIDE_OUTPUT)
#: Edges where instance i feeds instance i only (one channel, chainable).
_ONE_TO_ONE = (Partitioning.FORWARD, Partitioning.FORWARD_KEYED)


def _resolve_inputs(node: Transformation) -> list[tuple[Transformation, OutputTag[Any] | None]]:
    """Return ``(input, side-output tag or None)`` with unions and side outputs expanded.

    Both are wiring, not tasks: a side output is an edge tagged with its ``OutputTag``.
    """
    return [pair for inp in node.inputs for pair in _resolve(inp)]


def _resolve(inp: Transformation) -> list[tuple[Transformation, OutputTag[Any] | None]]:
    if inp.kind is TransformKind.UNION:
        return _resolve_inputs(inp)
    if inp.kind is TransformKind.SIDE_OUTPUT:
        tag = inp.payload(OutputTag)
        return [(src, tag) for src, _ in _resolve_inputs(inp)]
    return [(inp, None)]


_BROADCAST = (TransformKind.BROADCAST_PROCESS, TransformKind.KEYED_BROADCAST_PROCESS)
_TWO_INPUTS = (TransformKind.CO_PROCESS, TransformKind.KEYED_CO_PROCESS, *_BROADCAST)


def _input_keys(t: Transformation) -> tuple[KeySelector | None, KeySelector | None] | None:
    """Return a two-input operator's key selector per input (None: not keyed)."""
    spec = t.payload(BroadcastSpec) if t.kind in _BROADCAST else t.payload(CoSpec)
    return spec.key_selectors


def plan_chains(transformations: Sequence[Transformation], config: JobConfig) -> list[Chain]:
    """Group the logical graph into chains, in topological order."""
    nodes = [t for t in transformations if t.kind not in _WIRING]
    if not any(t.kind is TransformKind.SINK for t in nodes):
        raise JobGraphError("the job has no sink: add sink_to(...) (or print()) to a stream")
    edges: list[Edge] = []
    for t in nodes:
        two = t.kind in _TWO_INPUTS
        for side, direct in enumerate(t.inputs):
            # a two-input operator's inputs are keyed each by its own selector
            keys = _input_keys(t) if two else None
            ks = keys[side] if keys is not None else t.key_selector
            for inp, tag in _resolve(direct):
                how = t.partitioning
                if side == 1 and t.kind in _BROADCAST:
                    how = Partitioning.BROADCAST  # every instance gets the whole stream
                elif how is Partitioning.FORWARD and inp.parallelism != t.parallelism:
                    how = Partitioning.REBALANCE
                elif how is Partitioning.FORWARD_KEYED and t.kind is TransformKind.ASYNC_MAP:
                    raise JobGraphError(
                        f"map_async {t.uid!r} after reinterpret_as_keyed is not supported "
                        "(it heads its own task): use key_by(...).map_async(...)"
                    )
                elif how is Partitioning.FORWARD_KEYED and inp.parallelism != t.parallelism:
                    raise JobGraphError(
                        f"{t.kind.value} {t.uid!r} reads {inp.uid!r} through "
                        f"reinterpret_as_keyed, so it needs that input's parallelism "
                        f"({inp.parallelism}), not {t.parallelism}: each instance reads "
                        "the key groups of the input instance beside it"
                    )
                edges.append(Edge(inp, t, how, ks, tag, side if two else 0))
    consumers: dict[int, list[Edge]] = {t.id: [] for t in nodes}
    producers: dict[int, list[Edge]] = {t.id: [] for t in nodes}
    for e in edges:
        consumers[e.source.id].append(e)
        producers[e.target.id].append(e)

    def chainable(e: Edge) -> bool:
        if not config.chaining or e.source.kind is TransformKind.SINK or e.tag is not None:
            return False
        if e.target.kind is TransformKind.ASYNC_MAP:
            return False  # it heads its own task: see runtime.async_io.async_task
        if len(producers[e.target.id]) != 1 or len(consumers[e.source.id]) != 1:
            return False
        if e.source.parallelism != e.target.parallelism:
            return False
        return e.partitioning in _ONE_TO_ONE or (
            e.partitioning is Partitioning.HASH and e.target.parallelism == 1
        )

    chain_of: dict[int, Chain] = {}
    chains: list[Chain] = []
    for t in nodes:
        ins = producers[t.id]
        if t.kind is TransformKind.SOURCE and ins:
            raise JobGraphError(f"source {t.uid!r} cannot have inputs")
        if t.kind is not TransformKind.SOURCE and not ins:
            raise JobGraphError(f"operator {t.uid!r} has no input")
        if len(ins) == 1 and chainable(ins[0]):
            chain = chain_of[ins[0].source.id]
            chain.nodes.append(t)
        else:
            chain = Chain([t])
            chains.append(chain)
            chain.inputs.extend(ins)
        chain_of[t.id] = chain
    for e in edges:
        src_chain, dst_chain = chain_of[e.source.id], chain_of[e.target.id]
        if src_chain is not dst_chain:
            src_chain.outputs.append(e)
    return chains


def _make_operator(t: Transformation) -> StreamOperator:
    kind = t.kind
    if kind is TransformKind.MAP:
        return MapOperator(t.uid, t.function())
    if kind is TransformKind.FILTER:
        return FilterOperator(t.uid, t.function())
    if kind is TransformKind.CO_PROCESS:
        return CoProcessOperator(t.uid, copy.deepcopy(t.payload(CoSpec).function))
    if kind is TransformKind.KEYED_CO_PROCESS:
        co = t.payload(CoSpec)
        keyed_fn, keys = co.function, co.key_selectors
        if not isinstance(keyed_fn, KeyedCoProcessFunction) or keys is None:
            raise JobGraphError(f"{kind.value} {t.uid!r} needs a KeyedCoProcessFunction and keys")
        return KeyedCoProcessOperator(t.uid, copy.deepcopy(keyed_fn), keys)
    if kind is TransformKind.BROADCAST_PROCESS:
        bc = t.payload(BroadcastSpec)
        return BroadcastProcessOperator(t.uid, replace(bc, function=copy.deepcopy(bc.function)))
    if kind is TransformKind.KEYED_BROADCAST_PROCESS:
        bc = t.payload(BroadcastSpec)
        spec = replace(bc, function=copy.deepcopy(bc.function))
        return KeyedBroadcastProcessOperator(t.uid, spec)
    if kind is TransformKind.ASYNC_MAP:
        # one function object per instance, as for process functions: its open()
        # keeps per-instance things (a session, its states)
        calls = t.payload(AsyncSpec)
        calls = replace(calls, function=copy.deepcopy(calls.function))
        return make_async_operator(t.uid, calls, t.key_selector)
    if kind is TransformKind.FLAT_MAP:
        return FlatMapOperator(t.uid, t.function())
    if kind is TransformKind.PROCESS:
        return ProcessOperator(t.uid, copy.deepcopy(t.payload(ProcessFunction)))
    if kind is TransformKind.KEYED_PROCESS:
        assert t.key_selector is not None
        fn = copy.deepcopy(t.payload(KeyedProcessFunction))
        return make_keyed_process_operator(t.uid, fn, t.key_selector)
    if kind is TransformKind.WINDOW:
        assert t.key_selector is not None
        window = copy.deepcopy(t.payload(WindowSpec))
        cls = SessionWindowOperator if window.assigner.merging else WindowOperator
        return cls(t.uid, window, t.key_selector)
    if kind is TransformKind.REDUCE:
        assert t.key_selector is not None
        return ReduceOperator(t.uid, t.function(), t.key_selector, t.state_type)
    raise JobGraphError(f"no operator for {kind.value}")


def _barrier_handler(
    config: JobConfig, channels: int, monotonic: Callable[[], float]
) -> BarrierHandler:
    if config.checkpoint.mode is CheckpointingMode.AT_LEAST_ONCE:
        return CheckpointBarrierTracker(channels, monotonic)
    aligned = AlignedBarrierHandler(
        channels, monotonic, config.checkpoint.alignment_max_buffered_batches
    )
    if not config.checkpoint.unaligned:
        return aligned
    encode = ChannelStateCodec(allow_pickle=config.state.allow_pickle).encode
    unaligned = UnalignedBarrierHandler(channels, monotonic, encode)
    timeout = config.checkpoint.aligned_timeout
    return AlternatingBarrierHandler(channels, monotonic, aligned, unaligned, timeout)


def _channels_per_edge(e: Edge, upstream_p: int) -> int:
    return 1 if e.partitioning in _ONE_TO_ONE else upstream_p


def build_chain_specs(
    chains: list[Chain],
    *,
    config: JobConfig,
    job_name: str,
    attempt: int,
    backend_factory: KeyedStateBackendFactory,
    local_dir: Path,
    dead_letter_factory: Callable[[str, int], DeadLetterWriter] | None,
    connector_context: Callable[[str, int, int, DeadLetterFn | None], ConnectorContext],
    monotonic: Callable[[], float],
    share: ProcessShare | None = None,
) -> list[ChainSpec]:
    """Instantiate every chain ``parallelism`` times and wire the channels.

    With a ``share``, only the subtasks of that worker process: a channel
    from or to a subtask of another worker goes over the connection to that
    worker, its id counted in the same order in every process.
    """
    specs: dict[tuple[int, int], ChainSpec] = {}
    errors = config.errors
    writers: dict[tuple[int, int, int], list[ChannelSender]] = {}
    here = share.here if share is not None else _everywhere
    shard = config.shard
    for ci, chain in enumerate(chains):
        p = chain.parallelism
        # identity (state, splits, files, transactional ids, checkpoints) is the job's
        # subtask across all shards; ``sub`` is the local one, for wiring and placement
        gp = shard.parallelism(p)
        for sub in range(p):
            if not here(sub):
                continue
            g = shard.subtask(sub, p)
            spec = ChainSpec(
                task_id=task_id(chain.head.uid, sub), subtask=g, parallelism=gp, operators=[]
            )
            for t in chain.nodes:
                if t.kind is TransformKind.SOURCE:
                    spec.head_uid = t.uid
                    if dead_letter_factory is not None:
                        spec.dead_letter = dead_letter_factory(t.uid, g)
                        spec.dead_letter_uid = t.uid
                    dl = spec.dead_letter.add if spec.dead_letter is not None else None
                    if errors.on_malformed is MalformedPolicy.FAIL:
                        dl = None
                    ctx = connector_context(t.uid, g, gp, dl)
                    spec.reader = t.source().create_reader(ctx)
                    spec.reader_wakeup = ctx.wakeup
                    if t.watermark_strategy is not None:
                        spec.source_watermarks = SourceWatermarks(
                            t.watermark_strategy, spec.reader, monotonic, config.batch_size
                        )
                elif t.kind is TransformKind.SINK:
                    if _checks_key_groups(t, chain, shard):
                        spec.operators.append(_key_group_check(t, spec, config))
                    spec.sink_uid = t.uid
                    spec.writer = t.sink().create_writer(connector_context(t.uid, g, gp, None))
                else:
                    if _checks_key_groups(t, chain, shard):
                        spec.operators.append(_key_group_check(t, spec, config))
                    op = _make_operator(t)
                    if op.keyed:
                        op.backend = backend_factory(
                            operator_uid=t.uid,
                            subtask_index=g,
                            key_group_range=KeyGroupRange.for_operator(
                                g, gp, config.max_parallelism
                            ),
                            max_parallelism=config.max_parallelism,
                            local_dir=local_dir / f"{t.uid}-{sub}-a{attempt}",
                            key_type=t.key_type,
                        )
                    spec.operators.append(op)
            # user code per record: the operators, the key selector of a keyed output,
            # the source's timestamp assigner, the sink's serializer
            runs_user_code = (
                bool(spec.operators)
                or spec.source_watermarks is not None
                or spec.writer is not None
                or any(e.partitioning is Partitioning.HASH for e in chain.outputs)
            )
            if errors.on_process_error is ProcessErrorPolicy.DEAD_LETTER and runs_user_code:
                if spec.dead_letter is None and dead_letter_factory is not None:
                    spec.dead_letter_uid = (spec.operators[0] if spec.operators else t).uid
                    spec.dead_letter = dead_letter_factory(spec.dead_letter_uid, g)
                spec.process_error_limit = errors.max_process_errors_per_checkpoint
            if chain.inputs:
                n = sum(_channels_per_edge(e, e.source.parallelism) for e in chain.inputs)
                spec.input_gate = InputGate(n, config.channel_capacity)
                # what a channel index means: restored channel watermarks need the same
                spec.input_layout = [
                    f"{e.source.uid}/{e.source.parallelism}/{e.partitioning.value}"
                    for e in chain.inputs
                ]
                spec.barrier_handler = _barrier_handler(config, n, monotonic)
            specs[(ci, sub)] = spec
    # channel indexes: per downstream instance, edges in order, upstream instances in order
    channel_id = 0  # the same count in every process: ids of channels between processes
    for ci, chain in enumerate(chains):
        for sub in range(chain.parallelism):
            gate = specs[(ci, sub)].input_gate if here(sub) else None
            base = 0
            for e in chain.inputs:
                src_ci = next(i for i, c in enumerate(chains) if e.source in c.nodes)
                up_p = chains[src_ci].parallelism
                for up in range(up_p):
                    if e.partitioning in _ONE_TO_ONE:
                        if up != sub:
                            continue
                        idx = base
                    else:
                        idx = base + up
                    channel_id += 1
                    writer: ChannelSender
                    if gate is not None and here(up):
                        writer = (
                            SecondInputWriter(gate.queue, idx) if e.side == 1 else gate.writer(idx)
                        )
                    elif gate is not None:  # from another worker
                        assert share is not None
                        wrap = SecondInput if e.side == 1 else None
                        share.peer(up).reader(channel_id, gate, idx, wrap)
                        continue
                    elif here(up):  # to another worker
                        assert share is not None
                        trusted = _exact_from_source(chains[src_ci], e)
                        writer = share.peer(sub).writer(channel_id, trusted=trusted)
                    else:
                        continue
                    writers.setdefault((src_ci, up, id(e)), []).append(writer)
                base += _channels_per_edge(e, up_p)
    for (ci, sub), spec in specs.items():
        for e in chains[ci].outputs:
            out_gate = _make_gate(e, writers[(ci, sub, id(e))], config)
            if e.tag is not None:
                out_gate = SideOutputGate(e.source.uid, e.tag, out_gate)
                for op in spec.operators:
                    if op.uid == e.source.uid and op.side_output is None:
                        op.side_output = []
            spec.outputs.append(out_gate)
    return [specs[k] for k in sorted(specs)]


def _everywhere(subtask: int) -> bool:
    return True


def _exact_from_source(chain: Chain, edge: Edge) -> bool:
    """Whether ``edge`` carries records straight from a source that declares them exact.

    Only a chain that is the source alone (no operator, no timestamp assigner
    between the source and the channel) and an edge that gives each record to
    one channel (hash or rebalance: no record is shared with an in-process
    operator that could change it before it is encoded). The key selector runs
    on those records too; like Flink's, it must not change them.
    """
    head = chain.head
    return (
        len(chain.nodes) == 1
        and head.kind is TransformKind.SOURCE
        and head.watermark_strategy is None
        and edge.partitioning in (Partitioning.HASH, Partitioning.REBALANCE)
        and getattr(head.source(), "json_exact", False) is True
    )


def _key_group_check(t: Transformation, spec: ChainSpec, config: JobConfig) -> KeyGroupCheck:
    """Build the arrival check before ``t``, fed by a FORWARD_KEYED edge (reinterpret_as_keyed)."""
    assert t.key_selector is not None
    reader = spec.reader  # set when the source is in this chain: name its split
    task = spec.task_id

    def describe_input() -> str:
        last = getattr(reader, "last_split", None)
        split = last() if callable(last) else None
        if split is not None:
            return f"split {split} of task {task}"
        active = getattr(reader, "active_splits", None)  # batches mix splits (Kafka)
        if callable(active):
            return f"one of the splits {', '.join(sorted(active()))} of task {task}"
        return f"the input of task {task}"

    return KeyGroupCheck(
        t.uid,
        t.key_selector,
        subtask=spec.subtask,
        parallelism=spec.parallelism,
        max_parallelism=config.max_parallelism,
        describe_input=describe_input,
        shard=config.shard,
    )


def _checks_key_groups(t: Transformation, chain: Chain, shard: Shard) -> bool:
    """Whether records reach ``t`` keyed without a gate that routes them by key group.

    ``reinterpret_as_keyed`` (trusted input), and in a sharded job a ``key_by``
    chained at parallelism 1: the one subtask of this shard may only see keys
    of the shard's key groups.
    """
    if t.partitioning is Partitioning.FORWARD_KEYED:
        return True
    return (
        shard.sharded
        and t.partitioning is Partitioning.HASH
        and t is not chain.head
        and t.key_selector is not None
    )


def _make_gate(e: Edge, writers: list[ChannelSender], config: JobConfig) -> OutputGate:
    how = e.partitioning
    if how in _ONE_TO_ONE:
        return ForwardGate(writers)
    if how is Partitioning.HASH:
        assert e.key_selector is not None
        shard = config.shard
        target_p = e.target.parallelism
        return KeyGroupGate(
            writers,
            e.key_selector,
            config.max_parallelism,
            e.target.uid,
            first=shard.subtask(0, target_p),
            parallelism=shard.parallelism(target_p),
            shard=shard,
        )
    if how is Partitioning.BROADCAST:
        return BroadcastGate(writers)
    return RebalanceGate(writers)
