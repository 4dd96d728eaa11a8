"""Side outputs: a second stream out of an operator, e.g. a window's late records.

The main path does not change: an operator that emits side records appends
``(tag, record)`` to its own ``side_output`` list (set by the job graph only
when someone reads that side output), and the task drains it after the batch
into the side edges' gates. A :class:`SideOutputGate` sits among the task's
output gates so barriers, watermarks and end-of-input reach the side
consumers like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiostream_ckpt.jobspec.functions import OutputTag
from aiostream_ckpt.runtime.operators import StreamOperator
from aiostream_ckpt.runtime.partitioners import OutputGate


class SideOutputGate(OutputGate):
    """Carries one operator's side output ``tag`` to its consumers; main batches skip it."""

    __slots__ = ("_inner", "source_uid", "tag")

    def __init__(self, source_uid: str, tag: OutputTag[Any], inner: OutputGate) -> None:
        super().__init__(inner.writers)
        self.source_uid = source_uid
        self.tag = tag
        self._inner = inner

    @property
    def inner(self) -> OutputGate:
        """The gate the side output's records go through (hash, forward...)."""
        return self._inner

    async def emit(self, batch: list[Any]) -> None:
        return None

    async def emit_side(self, batch: list[Any]) -> None:
        await self._inner.emit(batch)

    async def broadcast_control(self, element: Any) -> None:
        await self._inner.broadcast_control(element)


class SideOutputRouter:
    """Drains the chain's side-output lists into the side gates."""

    def __init__(self, operators: Sequence[StreamOperator], gates: Sequence[SideOutputGate]):
        self._ops = [op for op in operators if op.side_output is not None]
        self._routes: dict[tuple[str, OutputTag[Any]], list[SideOutputGate]] = {}
        for g in gates:
            self._routes.setdefault((g.source_uid, g.tag), []).append(g)

    @staticmethod
    def for_chain(
        operators: Sequence[StreamOperator], outputs: Sequence[OutputGate]
    ) -> SideOutputRouter | None:
        gates = [g for g in outputs if isinstance(g, SideOutputGate)]
        return SideOutputRouter(operators, gates) if gates else None

    async def flush(self) -> int:
        """Send pending side records; return how many."""
        sent = 0
        for op in self._ops:
            items = op.side_output
            if not items:
                continue
            pending = items[:]
            items.clear()
            by_tag: dict[OutputTag[Any], list[Any]] = {}
            for tag, record in pending:
                by_tag.setdefault(tag, []).append(record)
            for tag, records in by_tag.items():
                for gate in self._routes.get((op.uid, tag), ()):
                    await gate.emit_side(records)
            sent += len(pending)
        return sent
