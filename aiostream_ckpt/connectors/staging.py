"""Two-phase commit over staged files in one directory.

A writer's open transaction is a hidden in-progress file. At the barrier of
checkpoint n it is fsynced and renamed to a hidden *pending* file (pre-commit);
when checkpoint n completes, every pending file up to n is renamed to its final,
visible name (commit). ``rename`` is atomic on POSIX, so a reader of the
directory sees a checkpoint's output entirely or not at all, and a crash at any
point leaves files that :meth:`StagedFileWriter.recover` can sort into "commit"
(listed in the restored state: their checkpoint completed) and "abort" (the rest).

Names (``prefix`` defaults to ``part``; writers sharing a directory need
distinct prefixes)::

    .part-0003-a0-1.inprogress        open transaction of subtask 3 (attempt 0)
    .part-0003-0000000007.pending     pre-committed at checkpoint 7
    part-0000000007-0003.jsonl        committed; sorts in commit order

Hidden names keep staged data out of Spark's and the validator's view.
Recovery (which files to commit, abort or retract, and whether the restored
state belongs to this directory at all) follows the output contract of
:mod:`aiostream_ckpt.connectors.output_recovery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import logging
import os
import re
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.connectors.base import OutputSurvey, RestoreInfo
from aiostream_ckpt.connectors.output_recovery import (
    claim_location,
    count_records,
    fsync_dir,
    plan_recovery,
    retract_files,
)
from aiostream_ckpt.errors import ConnectorError

log = logging.getLogger(__name__)

Serializer = Callable[[Any], bytes]

_BUFFER_SIZE = 1 << 20
_SERIALIZE_SLICE = 512


class TxnState(enum.Enum):
    """Lifecycle of one staged file (one transaction)."""

    IN_PROGRESS = "in-progress"
    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


#: Allowed transitions; anything else is a bug in the writer, not an I/O error.
_TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.IN_PROGRESS: frozenset({TxnState.PENDING, TxnState.ABORTED}),
    TxnState.PENDING: frozenset({TxnState.COMMITTED, TxnState.ABORTED}),
    TxnState.COMMITTED: frozenset(),
    TxnState.ABORTED: frozenset(),
}


@dataclass(slots=True)
class _Txn:
    staged: str
    final: str
    checkpoint_id: int
    state: TxnState

    def advance(self, new: TxnState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise AssertionError(f"transaction {self.staged}: {self.state.value} -> {new.value}")
        self.state = new


@dataclass(frozen=True, slots=True)
class _Naming:
    """File names of one prefix, and the parsers that recognise them."""

    prefix: str

    def inprogress(self, subtask: int, attempt: int, seq: int) -> str:
        return f".{self.prefix}-{subtask:04d}-a{attempt}-{seq}.inprogress"

    def pending(self, subtask: int, checkpoint_id: int) -> str:
        return f".{self.prefix}-{subtask:04d}-{checkpoint_id:010d}.pending"

    def final(self, subtask: int, checkpoint_id: int) -> str:
        return f"{self.prefix}-{checkpoint_id:010d}-{subtask:04d}.jsonl"

    def staged_subtask(self, name: str) -> int | None:
        """Subtask of a staged (in-progress or pending) file, None for other names."""
        m = re.fullmatch(rf"\.{re.escape(self.prefix)}-(\d+)-.+\.(?:inprogress|pending)", name)
        return int(m.group(1)) if m else None

    def committed(self, name: str) -> tuple[int, int] | None:
        """(checkpoint id, subtask) of a committed file, None for other names."""
        m = re.fullmatch(rf"{re.escape(self.prefix)}-(\d+)-(\d+)\.jsonl", name)
        return (int(m.group(1)), int(m.group(2))) if m else None


def serialize_lines(records: list[Any], dumps: Serializer = orjson.dumps) -> bytes:
    """JSON lines of ``records``, each ending in a newline.

    Serialised in slices: with glibc's default heap trimming, keeping thousands
    of freshly allocated ``bytes`` alive at once was measured 10x slower than
    joining slices of a few hundred.
    """
    join = b"\n".join
    if len(records) <= _SERIALIZE_SLICE:
        return join(map(dumps, records)) + b"\n"
    n = _SERIALIZE_SLICE
    return join([join(map(dumps, records[i : i + n])) for i in range(0, len(records), n)]) + b"\n"


def _io_error(what: str, path: Path, e: OSError) -> ConnectorError:
    """Describe an I/O error of the staged output: which file, what cause.

    Retriable: a full disk or a revoked permission may be fixed while the
    restart strategy waits; nothing staged but uncommitted is kept, so the
    restarted job (or the same command run again) resumes from the last
    completed checkpoint without loss or duplicates.
    """
    hint = ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = (
            " (disk full: free space, then run the same command again; the job resumes "
            "from its last completed checkpoint)"
        )
    return ConnectorError(f"cannot {what} {path}: {e.strerror or e}{hint}", retriable=True)


@contextlib.contextmanager
def _io(what: str, path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        raise _io_error(what, path, e) from e


def _commit_file(directory: Path, staged: str, final: str) -> None:
    """Rename staged -> final; already committed is fine, neither file is data loss."""
    try:
        os.rename(directory / staged, directory / final)
    except FileNotFoundError:
        if not (directory / final).exists():
            raise ConnectorError(
                f"pre-committed file {directory / staged} is missing and was never "
                f"committed as {final}: its records are lost",
                retriable=False,
            ) from None


def committed_files(directory: str | Path, *, prefix: str = "part") -> list[Path]:
    """List the committed files of ``directory`` in commit order (checkpoint, subtask)."""
    naming = _Naming(prefix)
    found: list[tuple[int, int, Path]] = []
    with os.scandir(directory) as it:
        for entry in it:
            parsed = naming.committed(entry.name)
            if parsed is not None:
                found.append((parsed[0], parsed[1], Path(entry.path)))
    found.sort()
    return [p for _, _, p in found]


def read_committed_output(directory: str | Path, *, prefix: str = "part") -> Iterator[Any]:
    """Yield the records of committed files in commit order, ignoring staged files.

    This is what a downstream consumer of the sink is allowed to see.
    """
    for path in committed_files(directory, prefix=prefix):
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)


def merge_writer_states(states: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Union of several old writers' states, for restoring at another parallelism.

    Committing is idempotent, so every new writer may be given the union.
    They all wrote to one directory: its location is theirs.
    """
    seen: dict[str, list[str]] = {}
    location = None
    for state in states:
        for staged, final in (state or {}).get("pending", []):
            seen.setdefault(staged, [staged, final])
        location = location or (state or {}).get("location")
    merged: dict[str, Any] = {"pending": list(seen.values())}
    if location is not None:
        merged["location"] = location
    return merged


class StagedFileWriter:
    """One subtask's transactions over staged files; see the module docstring.

    Implements :class:`~aiostream_ckpt.connectors.base.SinkWriter` for records
    that ``serializer`` turns into one line of bytes (no newline).
    ``parallelism``, when given, lets subtask 0 also clean up after subtasks that
    no longer exist (restore at a lower parallelism); their pending files are
    committed only if the restored state lists them (see :func:`merge_writer_states`).
    """

    #: Rescaling: every new writer recovers the union of the old writers' states.
    merge_states = staticmethod(merge_writer_states)

    def __init__(
        self,
        directory: str | Path,
        *,
        subtask: int,
        parallelism: int | None = None,
        attempt: int = 0,
        prefix: str = "part",
        serializer: Serializer = orjson.dumps,
        buffer_size: int = _BUFFER_SIZE,
        restore: RestoreInfo | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._restore = restore
        self._location: str | None = None
        self.subtask = subtask
        self._parallelism = parallelism
        self._attempt = attempt
        self._naming = _Naming(prefix)
        self._dumps = serializer
        self._buffer_size = buffer_size
        self._seq = 0
        self._file: IO[bytes] | None = None
        self._open: _Txn | None = None
        self._pending: list[_Txn] = []
        self._recovered = False
        self._closed = False
        self.records_written = 0

    # -- recovery ---------------------------------------------------------

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        """Commit what ``restored`` lists, abort every other transaction we own."""
        await asyncio.to_thread(self._recover_sync, restored, checkpoint_id)
        self._recovered = True

    def _owns(self, subtask: int) -> bool:
        if subtask == self.subtask:
            return True
        p = self._parallelism
        return self.subtask == 0 and p is not None and subtask >= p

    def survey(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> OutputSurvey:
        """Tell what :meth:`recover` would commit, find lost and retract (touches nothing)."""
        plan = plan_recovery(self.directory, self._naming, self._owns, restored, checkpoint_id)
        retract = [(n, count_records(self.directory / n)) for n, _ in plan.retract]
        return OutputSurvey(str(self.directory), plan.lost, retract, plan.highest_id)

    def _recover_sync(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        plan = plan_recovery(d, self._naming, self._owns, restored, checkpoint_id)
        if plan.lost:
            raise ConnectorError(
                f"pre-committed file(s) {', '.join(str(d / s) for s in plan.lost)} are missing "
                f"and were never committed: their records are lost",
                retriable=False,
            )
        if plan.foreign:
            raise ConnectorError(
                f"output directory already has committed output from a previous run: {d}; "
                "use a new directory or remove it",
                retriable=False,
            )
        self._location = claim_location(d, plan.location)
        for staged, final in plan.commit:
            _commit_file(d, staged, final)
        if plan.retract:
            retract_files(
                d,
                plan.retract,
                restore=self._restore,
                checkpoint_id=checkpoint_id or 0,
                owner=f"{self._naming.prefix}-{self.subtask:04d}",
            )
        for name in plan.abort:
            (d / name).unlink(missing_ok=True)
        if plan.abort:
            n = len(plan.abort)
            log.info("%s: discarded %d staged file(s) of unfinished checkpoints", d, n)
        if plan.commit or plan.abort:
            fsync_dir(d)

    # -- the open transaction ----------------------------------------------

    def _check_usable(self) -> None:
        if not self._recovered:
            raise ConnectorError(f"{self.directory}: writer used before recover()")
        if self._closed:
            raise ConnectorError(f"{self.directory}: writer used after close()")

    def _open_txn(self) -> IO[bytes]:
        self._check_usable()
        self._seq += 1
        name = self._naming.inprogress(self.subtask, self._attempt, self._seq)
        with _io("create", self.directory / name):
            f = open(self.directory / name, "wb", buffering=self._buffer_size)  # noqa: SIM115
        self._open = _Txn(name, "", -1, TxnState.IN_PROGRESS)
        self._file = f
        return f

    def write_sync(self, batch: list[Any]) -> None:
        """Append records to the open transaction (blocking, buffered local I/O)."""
        if not batch:
            return
        f = self._file or self._open_txn()
        try:
            f.write(serialize_lines(batch, self._dumps))
        except OSError as e:
            staged = self._open.staged if self._open is not None else ""
            raise _io_error("write", self.directory / staged, e) from e
        self.records_written += len(batch)

    async def write(self, batch: list[Any]) -> None:
        self.write_sync(batch)

    # -- two-phase commit ---------------------------------------------------

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Pre-commit the open transaction as checkpoint ``checkpoint_id``'s; return the state."""
        self._check_usable()
        if self._pending and self._pending[-1].checkpoint_id >= checkpoint_id:
            raise ConnectorError(
                f"{self.directory}: prepare_commit({checkpoint_id}) after "
                f"prepare_commit({self._pending[-1].checkpoint_id})"
            )
        f, txn = self._file, self._open
        # Detach before awaiting: records written meanwhile open the next transaction.
        self._file = self._open = None
        if f is not None and txn is not None:
            txn.final = self._naming.final(self.subtask, checkpoint_id)
            txn.checkpoint_id = checkpoint_id
            pending = self._naming.pending(self.subtask, checkpoint_id)
            await asyncio.to_thread(self._seal, f, txn.staged, pending, txn.final)
            txn.staged = pending
            txn.advance(TxnState.PENDING)
            self._pending.append(txn)
        return self.state()

    def _seal(self, f: IO[bytes], inprogress: str, pending: str, final: str) -> None:
        d = self.directory
        with _io("write", d / inprogress):
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()
        if (d / final).exists():
            raise ConnectorError(
                f"{d / final} already exists: committed output of a checkpoint this job "
                "did not restore from",
                retriable=False,
            )
        with _io("pre-commit", d / inprogress):
            os.rename(d / inprogress, d / pending)
            fsync_dir(d)

    def state(self) -> dict[str, Any]:
        """Writer state for a checkpoint: every pre-committed, uncommitted file."""
        state: dict[str, Any] = {"pending": [[t.staged, t.final] for t in self._pending]}
        if self._location is not None:
            state["location"] = self._location
        return state

    async def commit(self, checkpoint_id: int) -> None:
        """Commit every pre-committed file up to ``checkpoint_id``; idempotent."""
        due = [t for t in self._pending if t.checkpoint_id <= checkpoint_id]
        if not due:
            return
        # They stay listed in ``state()`` until renamed: a checkpoint taken meanwhile
        # must still name them, or a failed rename would turn into an abort.
        await asyncio.to_thread(self._commit_sync, due)
        for t in due:
            if t.state is TxnState.PENDING:  # a concurrent duplicate commit may have won
                t.advance(TxnState.COMMITTED)
        self._pending = [t for t in self._pending if t.state is TxnState.PENDING]

    def _commit_sync(self, due: list[_Txn]) -> None:
        with _io("commit into", self.directory):
            for t in due:
                _commit_file(self.directory, t.staged, t.final)
                failpoints.hit("sink_commit")
            fsync_dir(self.directory)

    async def close(self) -> None:
        """Close and delete the open transaction: never committed, so a stopped job leaves none.

        Pre-committed files stay: a checkpoint lists them.
        """
        self._closed = True
        f, self._file = self._file, None
        txn, self._open = self._open, None
        if f is not None:
            try:
                f.close()
                if txn is not None:
                    (self.directory / txn.staged).unlink(missing_ok=True)
            except OSError as e:  # its records are uncommitted: recovery discards them anyway
                log.warning("%s: discarding the open part file failed: %s", self.directory, e)


class DeadLetterWriter(StagedFileWriter):
    """Exactly-once output of records a reader could not turn into events.

    The runtime passes :meth:`add` as the reader's
    :data:`~aiostream_ckpt.connectors.base.DeadLetterFn` and drives this writer
    through the same recover / prepare_commit / commit cycle as the sink, at the
    source's barrier. Because entries are committed only with the checkpoint
    whose source position covers them, a malformed line that is replayed after
    a failure is reported once.
    """

    def __init__(
        self,
        directory: str | Path,
        subtask: int,
        *,
        parallelism: int | None = None,
        attempt: int = 0,
        prefix: str = "dead-letter",
        restore: RestoreInfo | None = None,
    ) -> None:
        super().__init__(
            directory,
            subtask=subtask,
            parallelism=parallelism,
            attempt=attempt,
            prefix=prefix,
            restore=restore,
        )
        self.count = 0

    def add(self, raw: bytes | str, reason: str, origin: dict[str, Any]) -> None:
        """Record one dead letter in the open transaction (synchronous, buffered)."""
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        self.write_sync([{"reason": reason, "origin": origin, "raw": text}])
        self.count += 1

    def add_failed_record(
        self, record: Any, operator_uid: str, subtask: int, exc: BaseException
    ) -> None:
        """Record an event whose user function raised, with the operator and the traceback."""
        try:
            raw = orjson.dumps(record, default=repr).decode()
        except TypeError:
            raw = repr(record)
        trace = "".join(traceback.format_exception(exc))
        self.write_sync(
            [
                {
                    "reason": f"process error: {type(exc).__name__}: {exc}",
                    "origin": {"operator": operator_uid, "subtask": subtask},
                    "raw": raw,
                    "traceback": trace,
                }
            ]
        )
        self.count += 1
