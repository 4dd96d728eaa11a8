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
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.connectors.base import (
    OutputSurvey,
    RecordErrorFn,
    RestoreInfo,
    raise_record_error,
)
from aiostream_ckpt.connectors.held_output import (
    HELD_KEY,
    HeldCopy,
    copies_of,
    keep_copy,
    merge_copies,
    put_back,
)
from aiostream_ckpt.connectors.output_recovery import (
    RecoveryPlan,
    claim_location,
    count_records,
    plan_recovery,
    retract_files,
)
from aiostream_ckpt.durable import child_path, fsync_dir
from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt.keygroups import Shard
from aiostream_ckpt.user_errors import function_name

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
    #: committed files' extension: ``jsonl``, or ``parquet`` (``connectors.parquet``)
    suffix: str = "jsonl"

    def inprogress(self, subtask: int, attempt: int, seq: int) -> str:
        return f".{self.prefix}-{subtask:04d}-a{attempt}-{seq}.inprogress"

    def pending(self, subtask: int, checkpoint_id: int) -> str:
        return f".{self.prefix}-{subtask:04d}-{checkpoint_id:010d}.pending"

    def final(self, subtask: int, checkpoint_id: int) -> str:
        return f"{self.prefix}-{checkpoint_id:010d}-{subtask:04d}.{self.suffix}"

    def pending_id(self, name: str) -> tuple[int, int] | None:
        """(subtask, checkpoint id) of a pre-committed file, None for other names."""
        m = re.fullmatch(rf"\.{re.escape(self.prefix)}-(\d+)-(\d{{10}})\.pending", name)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def resume(self, subtask: int, checkpoint_id: int) -> str:
        """Staged copy of an open file's checkpointed part (see ``_resume_open``)."""
        return f".{self.prefix}-{subtask:04d}-resume-{checkpoint_id:010d}.inprogress"

    def staged_subtask(self, name: str) -> int | None:
        """Subtask of a staged (in-progress or pending) file, None for other names."""
        m = re.fullmatch(rf"\.{re.escape(self.prefix)}-(\d+)-.+\.(?:inprogress|pending)", name)
        return int(m.group(1)) if m else None

    def committed(self, name: str) -> tuple[int, int] | None:
        """(checkpoint id, subtask) of a committed file, None for other names."""
        m = re.fullmatch(rf"{re.escape(self.prefix)}-(\d+)-(\d+)\.{re.escape(self.suffix)}", name)
        return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True, slots=True)
class RollingPolicy:
    """When the open part file is closed: else it stays open across checkpoints.

    The default (no limits) closes it at every checkpoint: one committed file
    per subtask and checkpoint. With ``max_bytes`` and/or ``max_seconds`` a
    part file spans checkpoints and is closed at the first checkpoint after it
    reached either limit (and at the end of input and at savepoints). An open
    file stays hidden (staged) until closed; at each checkpoint its content is
    fsynced and its length goes into the checkpoint, so a restore keeps
    exactly what that checkpoint covered (see ``_resume_open``) and committed
    files never change.

    >>> RollingPolicy(max_bytes=1 << 20).due(2 << 20, 0.0), RollingPolicy().due(0, 0.0)
    (True, True)
    """

    max_bytes: int = 0
    max_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_seconds < 0:
            raise ValueError(f"rolling limits must not be negative: {self}")

    def due(self, size: int, age: float) -> bool:
        if not self.max_bytes and not self.max_seconds:
            return True
        return bool(
            (self.max_bytes and size >= self.max_bytes)
            or (self.max_seconds and age >= self.max_seconds)
        )


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


def serialize_each(
    batch: list[Any], dumps: Serializer, record_failed: RecordErrorFn
) -> tuple[list[Any], bytes]:
    """Serialize a batch ``serialize_lines`` failed on, record by record: kept records, lines.

    Each record ``dumps`` raises on goes to ``record_failed`` (which raises
    unless it dead-lettered it) before anything is written, so a writer
    writes whole records only.
    """
    function = f"serializer {function_name(dumps)}"
    kept: list[Any] = []
    lines: list[bytes] = []
    for rec in batch:
        try:
            line = dumps(rec)
        except Exception as exc:
            record_failed(function, rec, exc)
            continue
        kept.append(rec)
        lines.append(line)
    return kept, b"".join(line + b"\n" for line in lines)


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
        os.rename(child_path(directory, staged), child_path(directory, final))
    except FileNotFoundError:
        if not child_path(directory, final).exists():
            raise ConnectorError(
                f"pre-committed file {directory / staged} is missing and was never "
                f"committed as {final}: its records are lost",
                retriable=False,
            ) from None


def committed_files(
    directory: str | Path, *, prefix: str = "part", suffix: str = "jsonl"
) -> list[Path]:
    """List the committed files of ``directory`` in commit order (checkpoint, subtask).

    A sharded job's shards write into ``shard-I-of-N`` subdirectories (of
    every layout the job ran in, before and after a rescale): their files
    are listed too. A rescaled job's checkpoint ids go on above every old
    shard's, so a key's output stays in commit order across the layouts.
    """
    naming = _Naming(prefix, suffix)
    found: list[tuple[int, int, Path]] = []
    with os.scandir(directory) as it:
        for entry in it:
            parsed = naming.committed(entry.name)
            if parsed is not None:
                found.append((parsed[0], parsed[1], Path(entry.path)))
            elif entry.is_dir() and Shard.from_dirname(entry.name) is not None:
                found.extend((c, s, p) for p, (c, s) in _committed_in(Path(entry.path), naming))
    found.sort()
    return [p for _, _, p in found]


def _committed_in(directory: Path, naming: _Naming) -> Iterator[tuple[Path, tuple[int, int]]]:
    with os.scandir(directory) as it:
        for entry in it:
            parsed = naming.committed(entry.name)
            if parsed is not None:
                yield Path(entry.path), parsed


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
    opened: dict[str, list[Any]] = {}
    location = None
    for state in states:
        for staged, final in (state or {}).get("pending", []):
            seen.setdefault(staged, [staged, final])
        for name, length in (state or {}).get("open", []):
            opened.setdefault(name, [name, length])
        location = location or (state or {}).get("location")
    merged: dict[str, Any] = {"pending": list(seen.values())}
    if opened:
        merged["open"] = list(opened.values())
    if held := merge_copies(states):
        merged[HELD_KEY] = held
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
        suffix: str = "jsonl",
        serializer: Serializer = orjson.dumps,
        buffer_size: int = _BUFFER_SIZE,
        restore: RestoreInfo | None = None,
        rolling: RollingPolicy | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        executor: Executor | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._executor = executor
        self._rolling = rolling or RollingPolicy()
        self._monotonic = monotonic
        self._opened_at = 0.0
        #: [name, length] of the open file as the last checkpoint recorded it
        self._open_mark: list[Any] | None = None
        self._roll_next = False
        self._restore = restore
        self._location: str | None = None
        self.subtask = subtask
        self._parallelism = parallelism
        self._attempt = attempt
        self._naming = _Naming(prefix, suffix)
        self._dumps = serializer
        self._buffer_size = buffer_size
        self._seq = 0
        self._file: IO[bytes] | None = None
        self._open: _Txn | None = None
        self._pending: list[_Txn] = []
        #: the pending file of a savepoint's own epoch (for the fail point at its commit)
        self._held: set[str] = set()
        self._recovered = False
        self._closed = False
        self.records_written = 0
        #: see :class:`~aiostream_ckpt.connectors.base.RecordFunctions`
        self.record_failed: RecordErrorFn = raise_record_error

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking file work in the job's threads (the owner's pool, never a new one)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- recovery ---------------------------------------------------------

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        """Commit what ``restored`` lists, abort every other transaction we own."""
        await self._in_thread(self._recover_sync, restored, checkpoint_id)
        self._recovered = True

    def count_records(self, path: Path) -> int:
        """Count the records of a committed file of this writer (one per line)."""
        return count_records(path)

    def _owns(self, subtask: int) -> bool:
        if subtask == self.subtask:
            return True
        p = self._parallelism
        return self.subtask == 0 and p is not None and subtask >= p

    def _plan(
        self, restored: dict[str, Any] | None, checkpoint_id: int | None, *, verify: bool
    ) -> RecoveryPlan:
        restore = self._restore
        root = Path(restore.path) if restore is not None and restore.kind == "savepoint" else None
        return plan_recovery(
            self.directory,
            self._naming,
            self._owns,
            restored,
            checkpoint_id,
            copies=copies_of(restored),
            copy_root=root,
            verify=verify,
        )

    def survey(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> OutputSurvey:
        """Tell what :meth:`recover` would commit, find lost and retract (touches nothing)."""
        plan = self._plan(restored, checkpoint_id, verify=True)
        retract = [(n, self.count_records(self.directory / n)) for n, _ in plan.retract]
        return OutputSurvey(str(self.directory), plan.lost, retract, plan.highest_id)

    def _recover_sync(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        plan = self._plan(restored, checkpoint_id, verify=False)  # the survey verified them
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
        if plan.same and checkpoint_id is not None:
            for name, length in (restored or {}).get("open", []):
                self._resume_open(d, str(name), int(length), checkpoint_id)
        for staged, final, copy in plan.from_copy:
            put_back(copy, d, staged)
            log.info(
                "%s: %s, pre-committed by the restored savepoint, was gone; brought back "
                "from the savepoint's copy %s",
                d,
                final,
                copy,
            )
        for staged, final in [*plan.commit, *((s, f) for s, f, _ in plan.from_copy)]:
            _commit_file(d, staged, final)
        if plan.retract:
            retract_files(
                d,
                plan.retract,
                restore=self._restore,
                checkpoint_id=checkpoint_id or 0,
                owner=f"{self._naming.prefix}-{self.subtask:04d}",
                count=self.count_records,
            )
        for name in plan.abort:
            (d / name).unlink(missing_ok=True)
        if plan.abort:
            n = len(plan.abort)
            log.info("%s: discarded %d staged file(s) of unfinished checkpoints", d, n)
        if plan.commit or plan.from_copy or plan.abort:
            fsync_dir(d)

    def _resume_open(self, d: Path, name: str, length: int, checkpoint_id: int) -> None:
        """Commit the first ``length`` bytes of a file that was open at the restored checkpoint.

        They are the records that checkpoint covers (the sources will not
        replay them); the rest of the file is replayed. The file itself may
        still be open (``name``), or have been closed at a later checkpoint
        that did not complete (then it is the first pending file of its
        subtask after the restored one) or that did complete but is being
        gone back from (its first committed file after it, which the contract
        then retracts). The part is copied to ``part-<restored>-<subtask>``:
        committed files never change, and the copy is staged and renamed, so a
        crash here is redone by the next recovery.
        """
        naming = self._naming
        sub = naming.staged_subtask(name)
        if sub is None or not self._owns(sub) or length == 0:
            return
        final = naming.final(sub, checkpoint_id)
        if (d / final).exists():
            return  # resumed by an earlier recovery
        source: Path | None = d / name if (d / name).exists() else None
        if source is None:
            later: list[tuple[int, str]] = []
            for other in os.listdir(d):
                if (pending := naming.pending_id(other)) is not None:
                    other_sub, cid = pending
                elif (committed := naming.committed(other)) is not None:
                    cid, other_sub = committed
                else:
                    continue
                if other_sub == sub and cid > checkpoint_id:
                    later.append((cid, other))
            if later:
                source = d / min(later)[1]
        if source is None or source.stat().st_size < length:
            raise ConnectorError(
                f"{d}: the part file {name} open at checkpoint {checkpoint_id} is missing or "
                f"shorter than the {length} bytes that checkpoint covers: its records are lost",
                retriable=False,
            )
        staged = d / naming.resume(sub, checkpoint_id)
        with _io("resume", staged), open(source, "rb") as src, open(staged, "wb") as dst:
            left = length
            while left:
                chunk = src.read(min(left, 1 << 20))
                dst.write(chunk)
                left -= len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        with _io("commit", d / final):
            os.rename(staged, d / final)
            fsync_dir(d)
        log.info(
            "%s: committed the %d bytes of open part file %s that checkpoint %d covers as %s",
            d,
            length,
            source.name,
            checkpoint_id,
            final,
        )

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
        path = child_path(self.directory, name)
        with _io("create", path):
            f = open(path, "wb", buffering=self._buffer_size)  # noqa: SIM115
        self._open = _Txn(name, "", -1, TxnState.IN_PROGRESS)
        self._file = f
        self._opened_at = self._monotonic()
        self._open_mark = None
        return f

    def write_sync(self, batch: list[Any]) -> None:
        """Append records to the open transaction (blocking, buffered local I/O)."""
        if not batch:
            return
        try:
            data = serialize_lines(batch, self._dumps)
        except Exception:
            batch, data = serialize_each(batch, self._dumps, self.record_failed)
            if not batch:
                return
        f = self._file or self._open_txn()
        try:
            f.write(data)
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
        if f is not None and txn is not None and not self._roll_now(f):
            # the file spans this checkpoint: make what it holds durable, record its length
            with _io("write", self.directory / txn.staged):
                f.flush()
                length = f.tell()
                await self._in_thread(os.fsync, f.fileno())
            self._open_mark = [txn.staged, length]
            return self.state()
        self._roll_next = False
        self._open_mark = None
        # Detach before awaiting: records written meanwhile open the next transaction.
        self._file = self._open = None
        if f is not None and txn is not None:
            txn.final = self._naming.final(self.subtask, checkpoint_id)
            txn.checkpoint_id = checkpoint_id
            pending = self._naming.pending(self.subtask, checkpoint_id)
            await self._in_thread(self._seal, f, txn.staged, pending, txn.final)
            txn.staged = pending
            txn.advance(TxnState.PENDING)
            self._pending.append(txn)
        return self.state()

    def _seal(self, f: IO[bytes], inprogress: str, pending: str, final: str) -> None:
        d = self.directory
        staged = child_path(d, inprogress)
        with _io("write", staged):
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()
        if child_path(d, final).exists():
            raise ConnectorError(
                f"{d / final} already exists: committed output of a checkpoint this job "
                "did not restore from",
                retriable=False,
            )
        with _io("pre-commit", staged):
            os.rename(staged, child_path(d, pending))
            fsync_dir(d)

    def _roll_now(self, f: IO[bytes]) -> bool:
        return self._roll_next or self._rolling.due(f.tell(), self._monotonic() - self._opened_at)

    def request_roll(self) -> None:
        """Close the open file at the next checkpoint, whatever its size (end of input)."""
        self._roll_next = True

    def state(self) -> dict[str, Any]:
        """Writer state: every pre-committed, uncommitted file, and the open file's length."""
        state: dict[str, Any] = {"pending": [[t.staged, t.final] for t in self._pending]}
        if self._open_mark is not None:
            state["open"] = [self._open_mark]
        if self._location is not None:
            state["location"] = self._location
        return state

    async def hold_for_savepoint(
        self, checkpoint_id: int, state: dict[str, Any], directory: Path, root: Path
    ) -> dict[str, Any]:
        """Keep a copy of every file ``state`` lists in ``directory`` (in the savepoint ``root``).

        See :mod:`.held_output` and :class:`~.base.SavepointHolder`. A savepoint
        closes the open file (the task rolls it), so ``state`` lists pending
        files only.
        """
        if state.get("open"):
            raise ConnectorError(
                f"{self.directory}: savepoint {checkpoint_id} found a part file open; "
                "a savepoint must close it (request_roll)"
            )
        pending = [(str(s), str(f)) for s, f in state.get("pending", [])]
        if not pending:
            return state
        held = await self._in_thread(self._hold_sync, pending, directory, root)
        # its own file: only a checkpoint after it commits that (the fail point's window)
        own = self._naming.pending(self.subtask, checkpoint_id)
        self._held.update(c.staged for c in held if c.staged == own)
        return {**state, HELD_KEY: [c.to_state() for c in held]}

    def _hold_sync(
        self, pending: list[tuple[str, str]], directory: Path, root: Path
    ) -> list[HeldCopy]:
        d = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        held = []
        for staged, final in pending:
            with _io("keep a savepoint copy of", d / staged):
                held.append(
                    keep_copy(
                        [child_path(d, staged), child_path(d, final)],
                        child_path(directory, final),
                        root,
                        staged,
                    )
                )
        with _io("keep savepoint copies in", directory):
            fsync_dir(directory)
        return held

    async def commit(self, checkpoint_id: int) -> None:
        """Commit every pre-committed file up to ``checkpoint_id``; idempotent."""
        due = [t for t in self._pending if t.checkpoint_id <= checkpoint_id]
        if not due:
            return
        # They stay listed in ``state()`` until renamed: a checkpoint taken meanwhile
        # must still name them, or a failed rename would turn into an abort.
        await self._in_thread(self._commit_sync, due)
        for t in due:
            if t.state is TxnState.PENDING:  # a concurrent duplicate commit may have won
                t.advance(TxnState.COMMITTED)
        self._pending = [t for t in self._pending if t.state is TxnState.PENDING]

    def _commit_sync(self, due: list[_Txn]) -> None:
        with _io("commit into", self.directory):
            for t in due:
                _commit_file(self.directory, t.staged, t.final)
                failpoints.hit("sink_commit")
                if t.staged in self._held:
                    self._held.discard(t.staged)
                    failpoints.hit("savepoint_output_commit")
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
                # a file a checkpoint recorded stays: the next start commits that part of it
                if txn is not None and self._open_mark is None:
                    child_path(self.directory, txn.staged).unlink(missing_ok=True)
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
        executor: Executor | None = None,
    ) -> None:
        super().__init__(
            directory,
            subtask=subtask,
            parallelism=parallelism,
            attempt=attempt,
            prefix=prefix,
            restore=restore,
            executor=executor,
        )
        self.count = 0

    def add(self, raw: bytes | str, reason: str, origin: dict[str, Any]) -> None:
        """Record one dead letter in the open transaction (synchronous, buffered)."""
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        self.write_sync([{"reason": reason, "origin": origin, "raw": text}])
        self.count += 1

    def add_failed_record(
        self,
        record: Any,
        operator_uid: str,
        subtask: int,
        exc: BaseException,
        function: str | None = None,
    ) -> None:
        """Record an event whose user function raised, with the operator and the traceback.

        ``function`` names the user function when it is not the operator's
        record function (a key selector, ``on_timer``, a window function).
        """
        try:
            raw = orjson.dumps(record, default=repr).decode()
        except TypeError:
            raw = repr(record)
        trace = "".join(traceback.format_exception(exc))
        self.write_sync(
            [
                {
                    "reason": f"process error: {type(exc).__name__}: {exc}",
                    "origin": {
                        "operator": operator_uid,
                        "subtask": subtask,
                        **({"function": function} if function else {}),
                    },
                    "raw": raw,
                    "traceback": trace,
                }
            ]
        )
        self.count += 1
