"""The logical graph: one :class:`Transformation` per API call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TransformKind(Enum):
    SOURCE = "source"
    MAP = "map"
    ASYNC_MAP = "async_map"
    FLAT_MAP = "flat_map"
    FILTER = "filter"
    PROCESS = "process"
    KEYED_PROCESS = "keyed_process"
    CO_PROCESS = "co_process"
    KEYED_CO_PROCESS = "keyed_co_process"
    BROADCAST_PROCESS = "broadcast_process"
    KEYED_BROADCAST_PROCESS = "keyed_broadcast_process"
    REDUCE = "reduce"
    UNION = "union"
    SINK = "sink"
    WINDOW = "window"
    SIDE_OUTPUT = "side_output"


class Partitioning(Enum):
    """How records travel from an operator's inputs to its instances."""

    FORWARD = "forward"
    HASH = "hash"
    REBALANCE = "rebalance"
    BROADCAST = "broadcast"


@dataclass(eq=False)
class Transformation:
    """A node of the logical graph.

    ``fn`` is what the node runs: a map function, process function, source or sink.
    """

    id: int
    kind: TransformKind
    name: str
    uid: str
    parallelism: int
    inputs: list[Transformation] = field(default_factory=list)
    fn: Any = None
    partitioning: Partitioning = Partitioning.FORWARD
    key_selector: Callable[[Any], Any] | None = None
    #: Sources only: a ``time.WatermarkStrategy`` (event time starts here).
    watermark_strategy: Any = None
    #: ``reduce`` only: the declared type of the value it keeps in state (None: untyped).
    state_type: Any = None

    def __repr__(self) -> str:
        return f"<{self.kind.value} {self.uid!r} p={self.parallelism}>"
