"""``connect(...).process``: one operator with two inputs.

Both inputs feed the task's one input gate (barriers align over all their
channels, as for a union). The channels of the *second* input wrap each batch
in :class:`SecondInput` as they send it (:class:`SecondInputWriter`), so the
task tells the inputs apart by the element's type, not by a per-channel lookup,
and plain tasks' hot path does not change: a wrapped batch is not a ``list``,
so the plain loop hands it to ``_on_control``, which :class:`CoProcessTask`
extends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiostream_ckpt.jobspec.co_functions import CoProcessFunction, KeyedCoProcessFunction
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.channels import ChannelWriter
from aiostream_ckpt.runtime.elements import SecondInput
from aiostream_ckpt.runtime.operators import ProcessOperator, RecordFailed
from aiostream_ckpt.runtime.task import StreamTask
from aiostream_ckpt.runtime.timed_process import TimedKeyedProcessOperator


class SecondInputWriter(ChannelWriter):
    """A channel into the second input: batches travel wrapped, control elements as they are."""

    __slots__ = ()

    async def send(self, element: Any) -> None:
        if type(element) is list:
            element = SecondInput(element)
        await self.put((self.index, element))


class CoProcessOperator(ProcessOperator):
    """Runs a :class:`CoProcessFunction` (no keyed state)."""

    def __init__(self, uid: str, function: CoProcessFunction[Any, Any, Any]) -> None:
        super().__init__(uid, function)  # type: ignore[arg-type]

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return self._run(batch, self.function.process_element1)  # type: ignore[attr-defined]

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        pe = self.function.process_element2  # type: ignore[attr-defined]
        return self._run(batch, pe, self.process_batch2)


class KeyedCoProcessOperator(TimedKeyedProcessOperator):
    """Runs a :class:`KeyedCoProcessFunction`: each input's key selector sets the shared key."""

    def __init__(
        self,
        uid: str,
        function: KeyedCoProcessFunction[Any, Any, Any],
        key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]],
    ) -> None:
        super().__init__(uid, function, key_selectors[0])  # type: ignore[arg-type]
        self._key_selectors = key_selectors

    def process_batch(self, batch: list[Any]) -> list[Any]:
        pe = self.function.process_element1  # type: ignore[attr-defined]
        return self._run_keyed(batch, pe, self._key_selectors[0])

    def process_batch2(self, batch: list[Any]) -> list[Any]:
        pe = self.function.process_element2  # type: ignore[attr-defined]
        return self._run_keyed(batch, pe, self._key_selectors[1], self.process_batch2)


def is_co_chain(spec: ChainSpec) -> bool:
    return bool(spec.operators) and hasattr(spec.operators[0], "process_batch2")


class CoProcessTask(StreamTask):
    """A task headed by a two-input operator: second-input batches go to ``process_batch2``."""

    async def _on_control(self, channel: int, element: Any) -> None:
        if type(element) is not SecondInput:
            await super()._on_control(channel, element)
            return
        batch = element.batch
        self.metrics.records_in += len(batch)
        self.metrics.batches_in += 1
        head = self.spec.operators[0]
        try:
            out = head.process_batch2(batch)  # type: ignore[attr-defined]
        except RecordFailed as failure:
            # dead letters, the rest of the batch through process_batch2 (failure.resume),
            # then the chain after the head: what the whole chain emits
            await self._chain.emit_fired(self._chain.finish_failed(failure))
            return
        head.records_out += len(out)
        await self._chain.push_tail(out)
