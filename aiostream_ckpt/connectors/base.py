"""Source and sink seams.

Sources are *replayable*: a reader reports its position (per split) when the
barrier is injected, and a restarted reader resumes from it. Sinks take part in
two-phase commit: pre-commit at the barrier, commit on checkpoint-complete.
Both are created per parallel instance from a factory object that lives in the
job graph, so the same job description can be run again after a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from aiostream_ckpt.aio import Wakeup
from aiostream_ckpt.clock import Clock, SystemClock
from aiostream_ckpt.errors import RecordError
from aiostream_ckpt.keygroups import DEFAULT_MAX_PARALLELISM, WHOLE_JOB, Shard

if TYPE_CHECKING:
    from aiostream_ckpt.connectors.kafka.security import KafkaSecurity

#: Called by readers for records they cannot turn into events; the runtime
#: routes them to the dead-letter output (or fails the job when fail-fast).
DeadLetterFn = Callable[[bytes | str, str, dict[str, Any]], None]


def _raise_dead_letter(raw: bytes | str, reason: str, origin: dict[str, Any]) -> None:
    raise RecordError(f"malformed record at {origin}: {reason}")


#: ``(function, record, exc)``: a user function run per record outside an
#: operator (a sink's serializer, a source's timestamp assigner; ``function``
#: names it) raised ``exc`` on ``record``. Returns when the record is to be
#: left out (dead-lettered under ``errors.on_process_error=dead_letter``);
#: raises the job's error otherwise. The task binds it (see :class:`RecordFunctions`).
RecordErrorFn = Callable[[str, Any, Exception], None]


def raise_record_error(function: str, record: Any, exc: Exception) -> None:
    """Raise ``exc`` as it was: the :data:`RecordErrorFn` of a component the task did not bind."""
    raise exc


@runtime_checkable
class RecordFunctions(Protocol):
    """A component that runs user functions per record outside the operators' loops.

    The task sets ``record_failed`` to its ``errors.on_process_error`` policy;
    the component calls it only for a record a function raised on, so the
    record path pays nothing for it.
    """

    record_failed: RecordErrorFn


@dataclass(frozen=True, slots=True)
class RestoreInfo:
    """What an attempt restores from, for writers that must say why they retract output."""

    kind: str  # "checkpoint" or "savepoint"; "none" after every checkpoint was set aside
    checkpoint_id: int
    path: str
    #: unique per attempt: names the ``_retracted/<tag>/`` directory of this restore
    tag: str
    #: newer checkpoints whose output may be committed: the restore replays their records
    newer: tuple[int, ...] = ()
    #: ``--allow-duplicate-output``: repeating committed output is accepted (with a warning)
    allow_duplicate_output: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.checkpoint_id, "path": self.path}

    def describe(self) -> str:
        if self.kind == "none":
            return "restoring nothing (every checkpoint was set aside)"
        return f"restoring {self.kind} {self.checkpoint_id} ({self.path})"


def duplicate_output_refusal(what: str, kept: str) -> str:
    """Say why a restore (``what``) that would repeat committed output (``kept``) is refused."""
    return (
        f"{what} would write again output that read_committed consumers have already seen: "
        f"{kept}; nothing was changed. Either restore the newer checkpoint if it can be "
        "repaired, or write to a new topic (the job starts a fresh output there from the "
        "restore point), or run again with --allow-duplicate-output to accept those records twice"
    )


@dataclass(frozen=True, slots=True)
class OutputSurvey:
    """What a writer's recovery would do to its output, found before it touches anything.

    ``lost``: pre-committed transactions the restored state lists that are
    neither staged nor committed (the restore point cannot be used);
    ``retract``: committed files newer than the restored checkpoint, as
    ``(name, records)``; ``highest_id``: the highest checkpoint id that names
    any of its committed or retracted output (new ids must go above it);
    ``kept``: committed output newer than the restore point that cannot be
    retracted (Kafka transactions), said in words; restoring would repeat it.
    """

    location: str
    lost: list[str]
    retract: list[tuple[str, int]]
    highest_id: int
    kept: str = ""


@dataclass(slots=True)
class ConnectorContext:
    """What a reader or writer instance knows about its place in the job.

    ``subtask_index`` and ``parallelism`` are the job's, across all shards
    (see :class:`~aiostream_ckpt.keygroups.Shard`): what splits, file names
    and transactional ids are keyed by, so that shards never collide and a
    rescale finds every old instance's state.
    """

    job_name: str
    operator_uid: str
    subtask_index: int
    parallelism: int
    attempt: int = 0
    clock: Clock = field(default_factory=SystemClock)
    #: The job's ``checkpoint.max_concurrent``: sinks size their transaction pools by it.
    max_concurrent_checkpoints: int = 1
    #: The job's ``job.max_parallelism`` (key groups): sources whose splits are
    #: partitioned by key group hand them out by it (:mod:`.key_grouped`).
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    dead_letter: DeadLetterFn = _raise_dead_letter
    restore: RestoreInfo | None = None
    #: The attempt's threads for a writer's blocking file work (fsync, rename);
    #: ``None``: the loop's default executor.
    executor: Executor | None = None
    #: How the job's Kafka clients connect (``kafka.*``: TLS, SASL); None: plaintext.
    kafka_security: KafkaSecurity | None = None
    #: A source's: set while its task has work between two reads (a barrier to
    #: inject, timers due). A reader that waits long (pacing) returns early then,
    #: with what is due (maybe nothing), so a barrier does not wait for its sleep.
    wakeup: Wakeup = field(default_factory=Wakeup)
    #: The shard of the job this instance runs in (``--shard I/N``).
    shard: Shard = WHOLE_JOB

    def shard_path(self, directory: Path) -> Path:
        """Where this instance's shard writes what the job would write to ``directory``."""
        return directory / self.shard.dirname if self.shard.sharded else directory


class SourceReader(Protocol):
    """One parallel instance of a source.

    Contract: every record returned by :meth:`read_batch` before
    :meth:`snapshot_position` is called is covered by that position; a reader
    restarted with it emits exactly the records after them.

    Optional: ``lag() -> Mapping[str, float]``, how far each split is behind
    its end (records; bytes for files), exported as ``aiostream_source_lag``.
    """

    async def start(self, restored: dict[str, Any] | None) -> None:
        """Open the reader at its restored positions.

        ``restored`` is the union of all old instances' positions (split id ->
        position); the reader keeps the splits it is assigned.
        """
        ...

    async def read_batch(self, max_records: int) -> list[Any] | None:
        """Up to ``max_records`` events; ``[]`` when none is ready now; ``None`` at end of input."""
        ...

    def snapshot_position(self) -> dict[str, Any]:
        """JSON-able position of every split this reader owns."""
        ...

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...

    async def close(self) -> None: ...


#: Records of one split, in the order that split produced them.
SplitBatch = tuple[str, list[Any]]


@runtime_checkable
class SplitAwareReader(Protocol):
    """Optional reader capability: say which split each record came from.

    Used only when the source has a watermark strategy, so per-split
    (per-partition, per-file) watermarks can be kept: the instance's watermark
    is the minimum over its active splits. The plain :meth:`SourceReader.read_batch`
    path stays as it is. Readers without it count as one split.
    """

    async def read_split_batches(self, max_records: int) -> list[SplitBatch] | None:
        """Like ``read_batch`` (same position contract), grouped by split id.

        At most ``max_records`` records in all; ``[]`` when none is ready;
        ``None`` at end of input.
        """
        ...

    def active_splits(self) -> Collection[str]:
        """Return the splits being read now that may still produce records.

        A finished split leaves this set (it no longer holds the watermark
        back); a split not yet started (a queued file) is not in it either.
        """
        ...


@runtime_checkable
class CheckpointPositionReader(Protocol):
    """Optional reader capability: take the position of a *named* checkpoint.

    When a reader has it, the task calls it at barrier n instead of
    :meth:`SourceReader.snapshot_position` (same contract), so the reader
    knows which position :meth:`SourceReader.notify_checkpoint_complete`
    confirms (Flink's ``snapshotState(checkpointId)``): the Kafka source
    commits exactly that checkpoint's offsets to its consumer group, not
    an older one's after checkpoints were aborted.
    """

    def snapshot_position_for(self, checkpoint_id: int) -> dict[str, Any]:
        """Return what ``snapshot_position`` returns, as checkpoint ``checkpoint_id``'s."""
        ...


@runtime_checkable
class BacklogAwareReader(Protocol):
    """Optional reader capability: whether a split has records available beyond those read.

    Used only with a watermark strategy, to decide when a split's partial chunk
    may move the watermark (``time.watermarks``): while records of the split
    wait to be read (a backlog, or anything before a bounded input's end), the
    chunk is completed first, so event time moves at the same records however
    the reads were sized; once the reader has read everything available now (a
    live tail), waiting would only add latency. Readers without it count as
    always caught up.
    """

    async def has_backlog(self, split: str) -> bool:
        """Return True when more records of ``split`` can be read now, or will until it ends."""
        ...


@runtime_checkable
class WatermarkEmittingReader(Protocol):
    """Optional reader capability: a watermark the source declares itself.

    Used only when the source has a watermark strategy: the instance's watermark
    is the larger of the strategy's (from record timestamps) and this one, so a
    reader can move event time forward between records (the testing kit's
    scripted source does, to make late data reproducible).
    """

    def emitted_watermark(self) -> int | None:
        """Return the highest watermark the reader declared so far (``None``: none yet)."""
        ...


@runtime_checkable
class Source(Protocol):
    """A source of records.

    Optional attribute ``json_exact`` (default False): every record is a fresh
    value that JSON gives back exactly (what ``orjson.loads`` returns), so a
    channel to another process may skip its exactness check for records that
    come straight from the source (see ``runtime.wire``).
    """

    name: str
    #: True when the input ends (files, generator); unbounded sources never return None.
    bounded: bool

    def create_reader(self, ctx: ConnectorContext) -> SourceReader: ...


class SinkWriter(Protocol):
    """One parallel instance of a sink, in two-phase commit.

    - :meth:`write` adds records to the open transaction.
    - :meth:`prepare_commit` runs at the barrier of checkpoint n: flush, close the
      open transaction as *pre-committed*, open the next one, and return the
      writer state that goes into checkpoint n. That state lists every
      pre-committed, not yet committed transaction (a checkpoint that was aborted
      leaves its transaction to be committed with the next one).
    - :meth:`commit` runs when checkpoint n is complete: commit every
      pre-committed transaction up to n. Must be idempotent.
    - :meth:`recover` runs before anything else after a restart, with the writer
      state of the restored checkpoint (``None`` on a fresh start): commit what it
      lists (that checkpoint is complete) and abort every other transaction this
      instance may have left behind.

    Rescaling (restore at another parallelism): a writer that can be rescaled
    offers ``merge_states(states) -> dict``, where ``states`` are the old
    instances' states by old subtask index (``None`` where one had none). Every
    new instance then recovers the merged state, so committing a listed
    transaction must be idempotent across instances, and :meth:`recover` may
    abort only transactions of its own subtask (subtask 0 also those of
    subtasks at or above the new parallelism). A writer without
    ``merge_states`` is refused at another parallelism
    (:mod:`aiostream_ckpt.runtime.writer_state`).
    """

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None: ...

    async def write(self, batch: list[Any]) -> None: ...

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]: ...

    async def commit(self, checkpoint_id: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SavepointHolder(Protocol):
    """Optional writer capability: keep what a savepoint lists for as long as the savepoint.

    A savepoint taken while the job runs does not commit: the transactions its
    writer state lists stay pre-committed until the next checkpoint commits
    them. If the job dies first, its restart goes back to the checkpoint
    before the savepoint and aborts them; the savepoint, reported complete,
    would then be unusable. So at a savepoint the task calls
    :meth:`hold_for_savepoint` (after :meth:`SinkWriter.prepare_commit`, before
    acknowledging) with that state and a directory inside the savepoint; the
    writer keeps there its own copy of every transaction the state lists and
    returns the state naming the copies (relative to the savepoint ``root``).
    Its :meth:`~SinkWriter.recover` from that savepoint
    (``ConnectorContext.restore``) uses a copy for a transaction that is
    neither pending nor committed any more. Disposing of the savepoint
    (removing its directory) releases the copies. Without this capability a
    savepoint is usable only until its output is aborted.
    """

    async def hold_for_savepoint(
        self, checkpoint_id: int, state: dict[str, Any], directory: Path, root: Path
    ) -> dict[str, Any]: ...


@runtime_checkable
class Sink(Protocol):
    name: str

    def create_writer(self, ctx: ConnectorContext) -> SinkWriter: ...


@runtime_checkable
class DirectoryOutput(Protocol):
    """Optional sink capability: name the directories its writers stage and commit in.

    The job locks them, with its checkpoint directory, for as long as it runs:
    two jobs committing into one directory would reuse each other's staged
    and committed file names. A second job started on them is refused.
    In a sharded job each shard's writers write under
    :meth:`ConnectorContext.shard_path` of each directory, and that is what
    the shard locks: shards never share an output directory.
    """

    def output_directories(self) -> Collection[Path]: ...


@runtime_checkable
class TransactionReporter(Protocol):
    """Optional writer capability: report its open transactions (REST, metrics, warnings).

    A transaction open too long is aborted by the system it writes to (Kafka:
    at ``transaction_timeout_ms``); if it was pre-committed, its records are
    lost when the job then dies before committing it, so operators need to
    see its age before that.
    """

    def transactions(self) -> list[dict[str, Any]]:
        """Open and pre-committed transactions, oldest first (JSON-able rows)."""
        ...

    def oldest_transaction_age(self) -> float:
        """Seconds the oldest open or pre-committed transaction has run (0 when none)."""
        ...

    def check_transaction_ages(self) -> None:
        """Log a WARNING, once per transaction, when one nears its timeout."""
        ...


class GlobalCommitter(Protocol):
    """One commit for all subtasks of a sink, made where the job's completion is known.

    Flink's ``GlobalCommitter`` (the Delta and Iceberg sinks'): the writers'
    :meth:`SinkWriter.prepare_commit` list what they pre-committed (data files
    not yet in a table) in their states; those states go into the checkpoint's
    metadata, so the process running the coordinator has all of them, whatever
    process each subtask ran in. When checkpoint n is complete (its metadata
    durable) :meth:`commit` makes one commit of everything they list, before
    any task is told (so a writer that learns of n may forget what n committed).
    The commit carries n as an idempotency token: a repeated commit of n, after
    a crash between the commit and the notification, must change nothing.

    ``states`` are the writer states by subtask index, as the checkpoint holds them.
    """

    def survey(self, states: dict[int, dict[str, Any]], checkpoint_id: int | None) -> OutputSurvey:
        """Tell what :meth:`recover` would do (read-only), as a file writer's ``survey``."""
        ...

    async def recover(self, states: dict[int, dict[str, Any]], checkpoint_id: int | None) -> None:
        """Before any writer recovers: commit what the restored checkpoint lists, unless done.

        ``checkpoint_id`` None is a fresh start, 0 a restore to before every
        checkpoint; output of newer checkpoints is retracted or refused as the
        survey said, and data files no checkpoint lists are removed.
        """
        ...

    async def commit(self, checkpoint_id: int, states: dict[int, dict[str, Any]]) -> None:
        """Commit everything ``states`` list up to ``checkpoint_id``; idempotent."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class GlobalCommitSink(Protocol):
    """Optional sink capability: one :class:`GlobalCommitter` commits its writers' output."""

    def create_committer(self, ctx: ConnectorContext) -> GlobalCommitter:
        """Return the committer of this sink (``ctx.subtask_index`` 0, the job's parallelism)."""
        ...
