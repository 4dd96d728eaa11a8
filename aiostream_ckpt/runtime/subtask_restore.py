"""The task's part of a restore: state first, outputs after (every task's, in the job's order).

``runtime.failover.recovery`` runs step 1 for every task of the job before any task
surveys or recovers its outputs, so a corrupt checkpoint is found before a
sink commits or retracts anything. The steps, numbered as in the code:

1. State: rewind the source to the union of its restored positions; restore
   each keyed operator's state (its files verified, in a worker thread) and
   operator state; read the in-flight records of an unaligned checkpoint
   (verified, in a worker thread; the task replays them before any new
   input); open the operators; resume event time.
2. Survey (read-only): what recovering each writer would commit, keep or
   retract, so the job can refuse a restore before changing anything.
3. Outputs: the dead-letter writer and the sink commit what the checkpoint
   pre-committed and abort or retract what came after it.

What each writer gets back is decided in ``runtime.writer_state``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.connectors.base import OutputSurvey
from aiostream_ckpt.jobspec.functions import RuntimeContext
from aiostream_ckpt.runtime.chain import ChainSpec
from aiostream_ckpt.runtime.channel_state import (
    CHANNEL_KEY,
    ChannelStateCodec,
    read_channel_state,
    restore_check,
)
from aiostream_ckpt.runtime.subtask_checkpoint import DEAD_LETTER_KEY, WRITER_KEY
from aiostream_ckpt.runtime.writer_state import restored_writer_state


class SubtaskRestore:
    """Restores one task from ``restored`` (None: a fresh start); each step runs once."""

    def __init__(
        self,
        spec: ChainSpec,
        restored: CompletedCheckpoint | None,
        *,
        executor: Executor,
        params: dict[str, Any],
    ) -> None:
        self._spec = spec
        self._restored = restored
        self._executor = executor
        self._params = params
        #: the checkpoint writers recover to: the restored one's id, None on a fresh
        #: start, 0 when every checkpoint was set aside (all earlier output is newer)
        self.checkpoint_id = restored.checkpoint_id if restored is not None else None
        self._state_restored = self._outputs_recovered = False
        self._in_flight: list[tuple[int, Any]] = []

    def take_in_flight(self) -> list[tuple[int, Any]]:
        """Return the restored in-flight elements, ``(channel, element)`` in replay order; once."""
        out, self._in_flight = self._in_flight, []
        return out

    async def restore_state(
        self, restore_time: Callable[[CompletedCheckpoint | None], None]
    ) -> None:
        """Step 1; ``restore_time`` resumes the task's event time once the operators are open."""
        if self._state_restored:
            return
        spec = self._spec
        restored = self._restored
        if restored is not None:
            failpoints.hit("restore_begin")
        if spec.reader is not None:
            positions: dict[str, Any] | None = None
            if restored is not None and spec.head_uid is not None:
                positions = {}
                for st in restored.subtask_states(spec.head_uid).values():
                    positions.update((st.get("operator") or {}).get("positions", {}))
            await spec.reader.start(positions)
        for op in spec.operators:
            if op.backend is not None and restored is not None:
                handles = [
                    st["keyed"]
                    for st in restored.subtask_states(op.uid).values()
                    if st.get("keyed")
                ]
                if handles:
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, op.backend.restore, restored.root, handles
                    )
            if restored is not None:
                op.restore_state(restored, spec.subtask, spec.parallelism)
            op.open(
                RuntimeContext(
                    operator_uid=op.uid,
                    subtask_index=spec.subtask,
                    parallelism=spec.parallelism,
                    params=self._params,
                    backend=op.backend,
                )
            )
        if restored is not None:
            self._in_flight = await self._read_in_flight(restored)
        restore_time(restored)
        self._state_restored = True

    async def _read_in_flight(self, restored: CompletedCheckpoint) -> list[tuple[int, Any]]:
        """Read this subtask's channel state, refusing one whose channels changed meaning."""
        spec = self._spec
        uid = spec.input_uid
        if uid is None:
            return []
        old = restored.subtask_states(uid)
        old_parallelism = int(restored.operators[uid]["parallelism"]) if old else 0
        for st in old.values():
            handle = st.get(CHANNEL_KEY)
            if handle:
                restore_check(
                    handle,
                    checkpoint_id=restored.checkpoint_id,
                    uid=uid,
                    old_parallelism=old_parallelism,
                    parallelism=spec.parallelism,
                    layout=spec.input_layout,
                )
        handle = (old.get(spec.subtask) or {}).get(CHANNEL_KEY)
        if not handle:
            return []
        codec = ChannelStateCodec(allow_pickle=True)  # pickled only if it was allowed then
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, read_channel_state, restored.root, handle, codec
        )

    async def survey_outputs(self) -> list[OutputSurvey]:
        """Step 2: tell what recovering this task's writers would do (read-only)."""
        out = []
        for writer, uid, key in self._writers():
            survey = getattr(writer, "survey", None)
            if callable(survey):
                state = self._writer_state(uid, key, writer)
                loop = asyncio.get_running_loop()
                out.append(
                    await loop.run_in_executor(self._executor, survey, state, self.checkpoint_id)
                )
        return out

    async def recover_outputs(self) -> None:
        """Step 3: let the dead-letter writer and the sink commit, abort and retract."""
        if self._outputs_recovered:
            return
        if self._restored is not None:
            failpoints.hit("restore_before_sinks")
        for writer, uid, key in self._writers():
            await writer.recover(self._writer_state(uid, key, writer), self.checkpoint_id)
        self._outputs_recovered = True
        if self._restored is not None:
            failpoints.hit("restore_after_sinks")

    def _writers(self) -> list[tuple[Any, str | None, str]]:
        spec = self._spec
        out: list[tuple[Any, str | None, str]] = []
        if spec.dead_letter is not None:
            out.append((spec.dead_letter, spec.dead_letter_uid, DEAD_LETTER_KEY))
        if spec.writer is not None:
            out.append((spec.writer, spec.sink_uid, WRITER_KEY))
        return out

    def _writer_state(self, uid: str | None, key: str, writer: object) -> dict[str, Any] | None:
        """Own old state, or all old states merged when the parallelism changed."""
        spec = self._spec
        return restored_writer_state(
            self._restored,
            uid,
            key,
            subtask=spec.subtask,
            parallelism=spec.parallelism,
            writer=writer,
        )
