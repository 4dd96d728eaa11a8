"""An attempt's restore, in the order that keeps committed output safe.

1. **Choose**: the newest completed checkpoint of the directory that is not
   set aside, or the savepoint a stop-with-savepoint committed if it is newer,
   else the ``--from-savepoint`` savepoint, else nothing (a fresh start).
   Unreadable metadata sets its checkpoint aside at once.
2. **Verify**: every task rewinds its source and restores its keyed state;
   restoring checks every state file (present, size, sha256) before applying
   it. Nothing is written to any output yet.
3. **Survey** the outputs: what each file writer would commit, which of its
   pre-committed files are gone (the restore point is then unusable), what it
   would retract, the highest checkpoint id its output has used, and what
   committed output newer than the restore point it cannot retract (Kafka
   transactions of checkpoints that completed after it).
4. **Decide**: a checkpoint that failed 2 or 3 is set aside (renamed
   ``chk-N.bad``, never chosen again) and the runner tries the next older
   one; a savepoint restore that would retract committed output is refused
   unless ``--allow-retract-output``; any restore that would repeat output
   that cannot be retracted is refused unless ``--allow-duplicate-output``;
   new checkpoint ids start above every id the outputs used.
5. **Recover** the outputs: only now do sinks and dead-letter writers commit,
   abort and retract (move aside with a manifest); a sink's global committer
   (``runtime.global_commit``: one table commit for all subtasks) before its
   writers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

from aiostream_ckpt.checkpoint.coordinator import CheckpointCoordinator
from aiostream_ckpt.checkpoint.metadata import CompletedCheckpoint
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint
from aiostream_ckpt.connectors.base import OutputSurvey, RestoreInfo, duplicate_output_refusal
from aiostream_ckpt.errors import CheckpointError, CorruptCheckpointError, RestoreRefusedError
from aiostream_ckpt.runtime.global_commit import GlobalCommitters
from aiostream_ckpt.runtime.task import StreamTask

log = logging.getLogger(__name__)


class RestorePoints:
    """Chooses restore points and sets aside the bad ones, durably."""

    def __init__(self, storage: CheckpointStorage, restore_from: Path | None) -> None:
        self.storage = storage
        self.restore_from = restore_from
        #: set aside in this process when the rename failed (read-only directory)
        self._bad: set[int] = set()
        #: the directory of the stop-with-savepoint's savepoint when it was chosen
        self._stop_savepoint: Path | None = None
        self._stop_savepoint_bad = False

    def set_aside(self, checkpoint_id: int, reason: str) -> None:
        self._bad.add(checkpoint_id)
        try:
            self.storage.set_aside(checkpoint_id, reason)
        except CheckpointError as exc:
            log.error("%s; skipping it in this process only", exc)

    def is_stop_savepoint(self, restored: CompletedCheckpoint) -> bool:
        """Whether ``restored`` is the directory's own stop-with-savepoint restore point."""
        return restored.is_savepoint and restored.directory == self._stop_savepoint

    def set_aside_stop_savepoint(self, reason: str) -> None:
        """Fall back from a bad stop-with-savepoint savepoint to the checkpoints."""
        self._stop_savepoint = None
        self._stop_savepoint_bad = True
        try:
            self.storage.set_aside_stop_savepoint(reason)
        except CheckpointError as exc:
            log.error("%s; skipping it in this process only", exc)

    def choose(self) -> CompletedCheckpoint | None:
        chosen: CompletedCheckpoint | None = None
        for cid in self.storage.completed_newest_first():
            if cid in self._bad:
                continue
            try:
                chosen = self.storage.read_completed(cid, with_state=True)
                break
            except CorruptCheckpointError as exc:
                log.error(
                    "checkpoint %d is corrupt (%s); falling back to the previous one", cid, exc
                )
                self.set_aside(cid, str(exc))
        stopped = None if self._stop_savepoint_bad else self.storage.stop_savepoint()
        if stopped is not None and (chosen is None or stopped[0] > chosen.checkpoint_id):
            try:
                savepoint = read_checkpoint(stopped[1])
            except CorruptCheckpointError as exc:
                self.set_aside_stop_savepoint(str(exc))
            else:
                self._stop_savepoint = savepoint.directory
                return savepoint
        if chosen is None and self.restore_from is not None:
            return read_checkpoint(self.restore_from)
        return chosen

    def savepoint_restored_next(self) -> Path | None:
        """Return the savepoint a restart would restore now (None: a checkpoint, or nothing).

        :meth:`choose`'s order without reading any metadata: the directory's
        stop-with-savepoint savepoint when it is newer than every checkpoint,
        else the ``--from-savepoint`` one while no checkpoint completed. The
        job depends on that savepoint: it must not be disposed of. Read-only.
        """
        completed = self.storage.completed_newest_first()
        newest = next((c for c in completed if c not in self._bad), None)
        stopped = None if self._stop_savepoint_bad else self.storage.stop_savepoint()
        if stopped is not None and (newest is None or stopped[0] > newest):
            return stopped[1]
        if newest is None and self.restore_from is not None:
            return self.restore_from
        return None

    def after_set_aside(self) -> bool:
        """Whether checkpoints were set aside: restoring nothing then means 'before them all'."""
        return bool(self._bad) or bool(self.storage.set_aside_checkpoints())


def restore_info(
    restored: CompletedCheckpoint | None,
    *,
    fallback: bool,
    storage: CheckpointStorage,
    allow_duplicates: bool = False,
) -> RestoreInfo | None:
    """Describe the restore for writers that retract or keep output (None on a fresh start)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    if restored is None:
        if not fallback:
            return None
        tag = f"{stamp}-restored-nothing-{secrets.token_hex(3)}"
        newer = tuple(storage.committed_after(0))
        return RestoreInfo("none", 0, "", tag, newer, allow_duplicates)
    kind = "savepoint" if restored.is_savepoint else "checkpoint"
    tag = f"{stamp}-restored-{kind}-{restored.checkpoint_id}-{secrets.token_hex(3)}"
    newer = tuple(storage.committed_after(restored.checkpoint_id))
    path = str(restored.directory)
    return RestoreInfo(kind, restored.checkpoint_id, path, tag, newer, allow_duplicates)


async def _all(steps: Iterable[Awaitable[Any]]) -> list[Any]:
    """Await every step, then raise the first failure (none is left running)."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


async def restore_tasks(
    tasks: list[StreamTask],
    restored: CompletedCheckpoint | None,
    coordinator: CheckpointCoordinator,
    *,
    allow_retract: bool,
    allow_duplicates: bool,
    committers: GlobalCommitters | None = None,
    recover_id: int | None = None,
) -> None:
    """Run steps 2-5 of the module docstring for one attempt (before the coordinator starts).

    ``committers``: the sinks' global committers, surveyed with the writers
    and recovered (to ``recover_id``) before them.
    """
    surveys = await verify_and_survey(tasks)
    if committers is not None:
        surveys += await committers.surveys(restored, recover_id)
    highest = decide_restore(
        surveys, restored, allow_retract=allow_retract, allow_duplicates=allow_duplicates
    )
    coordinator.skip_ids_through(highest)
    if committers is not None:
        await committers.recover(restored, recover_id)
    await recover_outputs(tasks)


async def verify_and_survey(tasks: list[StreamTask]) -> list[OutputSurvey]:
    """Run steps 2 and 3: restore every task's state, then survey every output (read-only)."""
    await _all(t.restore_state() for t in tasks)
    found = await _all(t.survey_outputs() for t in tasks)
    return [s for per_task in found for s in per_task]


def decide_restore(
    surveys: list[OutputSurvey],
    restored: CompletedCheckpoint | None,
    *,
    allow_retract: bool,
    allow_duplicates: bool,
) -> int:
    """Step 4 over the surveys of every task (of every worker): refuse, or say the highest id used.

    New checkpoint ids must start above the returned id.
    """
    lost = [f"{s.location}/{name}" for s in surveys for name in s.lost]
    if lost:
        what = "savepoint" if restored is not None and restored.is_savepoint else "checkpoint"
        raise CorruptCheckpointError(
            f"{what} {restored.checkpoint_id if restored else '?'} lists pre-committed output "
            f"that is neither staged nor committed: {', '.join(lost[:5])}"
            + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        )
    kept = [s.kept for s in surveys if s.kept]
    if kept and not allow_duplicates:
        raise RestoreRefusedError(_kept_refusal(restored, kept))
    if kept:
        log.warning(
            "%s; their records are written again (--allow-duplicate-output): "
            "read_committed consumers see them twice",
            "; ".join(sorted(set(kept))),
        )
    retract = [(s.location, name, n) for s in surveys for name, n in s.retract]
    if retract and restored is not None and restored.is_savepoint and not allow_retract:
        raise RestoreRefusedError(_refusal(restored, retract))
    return max((s.highest_id for s in surveys), default=0)


async def recover_outputs(tasks: list[StreamTask]) -> None:
    """Step 5: only now do the writers commit, abort and retract."""
    await _all(t.recover_outputs() for t in tasks)


def _kept_refusal(restored: CompletedCheckpoint | None, kept: list[str]) -> str:
    if restored is None:
        what = "restoring nothing (every checkpoint was set aside)"
    else:
        kind = "savepoint" if restored.is_savepoint else "checkpoint"
        what = f"restoring {kind} {restored.checkpoint_id} ({restored.directory})"
    return duplicate_output_refusal(what, "; ".join(sorted(set(kept))))


def _refusal(restored: CompletedCheckpoint, retract: list[tuple[str, str, int]]) -> str:
    records = sum(n for _, _, n in retract)
    places = sorted({loc for loc, _, _ in retract})
    names = ", ".join(name for _, name, _ in retract[:5]) + (" ..." if len(retract) > 5 else "")
    return (
        f"restoring savepoint {restored.checkpoint_id} ({restored.directory}) would retract "
        f"{len(retract)} committed file(s) with {records} record(s) that were committed after "
        f"it, in {', '.join(places)} ({names}); nothing was changed. Either restore into a new "
        "output directory (blue/green: the job starts writing there from the savepoint's "
        "positions), or run again with --allow-retract-output to move those files to "
        "<output>/_retracted/ with a manifest and produce their records again"
    )
