"""Exactly-once JSON-lines output in an object store (``ExactlyOnceFileSink("s3://...")``).

Flink's S3 ``FileSink`` in one writer per subtask. A transaction is the
records between two checkpoints, buffered in memory. At the barrier of
checkpoint n (pre-commit) they become a *multipart upload* to
``<prefix>/part-<n>-<subtask>.jsonl``: started, every part uploaded, not
completed -- nothing is visible under the key yet, but the parts are durable
and the writer state lists ``[key, upload id, part ETags]``. When checkpoint
n completes (after its conditional write, see
:mod:`aiostream_ckpt.checkpoint.object_storage`), commit completes the upload
with ``If-None-Match: *``: the object appears whole, once, and never changes.

Recovery completes the uploads the restored state lists (a completion that
finds the object already there, or the upload gone and the object there, was
done before: committing is idempotent) and aborts every other upload of its
subtask under the prefix (transactions of checkpoints that never completed).
So a host that dies leaves nothing it committed behind on its disk, and a
successor on another host finishes its commits. Committed objects newer than
the restore point (a fallback past a bad checkpoint) are not retracted: the
survey reports them, and the restore is refused unless duplicates are allowed.

Blocking store calls run in the job's executor. The upload at the barrier
holds this sink's task as long as it takes (the local sink's fsync does the
same); it is the price of a pre-commit that survives its host.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from typing import Any

import orjson

from aiostream_ckpt import failpoints
from aiostream_ckpt.connectors.base import OutputSurvey, RecordErrorFn, raise_record_error
from aiostream_ckpt.connectors.staging import serialize_each, serialize_lines
from aiostream_ckpt.errors import (
    ConnectorError,
    ObjectNotFoundError,
    ObjectStoreError,
    PreconditionFailedError,
    TransactionLostError,
)
from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore, S3Settings

log = logging.getLogger(__name__)

Serializer = Callable[[Any], bytes]
#: parts of a multipart upload (all but the last must be >= 5 MiB)
PART_SIZE = 8 * 1024 * 1024


def final_name(prefix: str, checkpoint_id: int, subtask: int) -> str:
    return f"{prefix}-{checkpoint_id:010d}-{subtask:04d}.jsonl"


def _parse_final(prefix: str, name: str) -> tuple[int, int] | None:
    m = re.fullmatch(rf"{re.escape(prefix)}-(\d{{10}})-(\d{{4}})\.jsonl", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def merge_object_states(states: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Union of old writers' pending uploads (committing one is idempotent)."""
    seen: dict[str, list[Any]] = {}
    for state in states:
        for entry in (state or {}).get("uploads", []):
            seen.setdefault(str(entry[0]), list(entry))
    return {"uploads": list(seen.values())}


class ObjectFileWriter:
    """One subtask's transactions as multipart uploads; see the module docstring."""

    merge_states = staticmethod(merge_object_states)

    def __init__(
        self,
        location: ObjectLocation,
        *,
        subtask: int,
        parallelism: int | None = None,
        prefix: str = "part",
        serializer: Serializer = orjson.dumps,
        settings: S3Settings | None = None,
        executor: Executor | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        self.location = location
        self.subtask = subtask
        self._parallelism = parallelism
        self._prefix = prefix
        self._dumps = serializer
        self._settings = settings or S3Settings()
        self._executor = executor
        self._store = store
        self._buffer = bytearray()
        #: pre-committed, not yet committed: [key, upload id, [part ETags], checkpoint id]
        self._pending: list[list[Any]] = []
        self._recovered = False
        self.records_written = 0
        self.record_failed: RecordErrorFn = raise_record_error

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore(self._settings, self.location.bucket)
        return self._store

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _owns(self, subtask: int) -> bool:
        p = self._parallelism
        return subtask == self.subtask or (self.subtask == 0 and p is not None and subtask >= p)

    def _key(self, name: str) -> str:
        return self.location.key(name)

    # -- recovery ---------------------------------------------------------------------

    def _committed(self) -> Iterator[tuple[int, int, str]]:
        """(checkpoint id, subtask, key) of the committed objects of subtasks this one owns."""
        for key, _ in self.store.list_keys(self._key(f"{self._prefix}-")):
            parsed = _parse_final(self._prefix, self.location.relative(key))
            if parsed is not None and self._owns(parsed[1]):
                yield parsed[0], parsed[1], key

    def survey(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> OutputSurvey:
        """Tell what recovery would do: uploads gone uncommitted are lost, newer objects kept."""
        listed = {str(e[0]): e for e in (restored or {}).get("uploads", [])}
        lost: list[str] = []
        if listed:
            in_progress = {k for k, _ in self.store.list_multipart(self._key(f"{self._prefix}-"))}
            for key in listed:
                if key not in in_progress and self.store.head(key) is None:
                    lost.append(key)
        committed = list(self._committed())
        highest = max((cid for cid, _, _ in committed), default=0)
        since = checkpoint_id or 0
        newer = sorted(k for cid, _, k in committed if cid > since and k not in listed)
        kept = ""
        if newer:
            kept = (
                f"{len(newer)} object(s) in {self.location} committed after checkpoint {since} "
                f"({', '.join(newer[:3])}{' ...' if len(newer) > 3 else ''}) cannot be retracted"
            )
        return OutputSurvey(str(self.location), lost, [], highest, kept)

    async def recover(self, restored: dict[str, Any] | None, checkpoint_id: int | None) -> None:
        await self._in_thread(self._recover_sync, restored)
        self._recovered = True

    def _recover_sync(self, restored: dict[str, Any] | None) -> None:
        listed = [list(e) for e in (restored or {}).get("uploads", [])]
        for entry in listed:
            self._complete(entry)
        keep = {str(e[1]) for e in listed}
        aborted = 0
        for key, upload_id in self.store.list_multipart(self._key(f"{self._prefix}-")):
            parsed = _parse_final(self._prefix, self.location.relative(key))
            if parsed is None or not self._owns(parsed[1]) or upload_id in keep:
                continue
            self.store.abort_multipart(key, upload_id)
            aborted += 1
        if aborted:
            log.info("%s: aborted %d upload(s) of unfinished checkpoints", self.location, aborted)

    def _complete(self, entry: list[Any]) -> None:
        """Complete one pre-committed upload; done before (object there) counts as done."""
        key, upload_id, etags = str(entry[0]), str(entry[1]), list(entry[2])
        try:
            self.store.complete_multipart(key, upload_id, etags, if_none_match=True)
        except PreconditionFailedError:
            self.store.abort_multipart(key, upload_id)  # the object is there: ours, committed
        except ObjectNotFoundError as exc:
            if self.store.head(key) is None:
                raise TransactionLostError(
                    f"pre-committed upload {upload_id} of {self.location.bucket}/{key} is gone "
                    "and the object was never committed: its records are lost"
                ) from exc

    # -- writing ----------------------------------------------------------------------

    async def write(self, batch: list[Any]) -> None:
        if not self._recovered:
            raise ConnectorError(f"{self.location}: writer used before recover()")
        if not batch:
            return
        try:
            data = serialize_lines(batch, self._dumps)
        except Exception:
            batch, data = serialize_each(batch, self._dumps, self.record_failed)
            if not batch:
                return
        self._buffer += data
        self.records_written += len(batch)

    async def prepare_commit(self, checkpoint_id: int) -> dict[str, Any]:
        """Upload the transaction as a multipart upload, not completed; return the state."""
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            key = self._key(final_name(self._prefix, checkpoint_id, self.subtask))
            upload_id, etags = await self._in_thread(self._upload, key, data)
            self._pending.append([key, upload_id, etags, checkpoint_id])
        return self.state()

    def _upload(self, key: str, data: bytes) -> tuple[str, list[str]]:
        try:
            upload_id = self.store.create_multipart(key)
            etags = [
                self.store.upload_part(key, upload_id, i // PART_SIZE + 1, data[i : i + PART_SIZE])
                for i in range(0, len(data), PART_SIZE)
            ]
        except ObjectStoreError as exc:
            raise ConnectorError(f"pre-commit into {self.location}: {exc}", retriable=True) from exc
        return upload_id, etags

    def state(self) -> dict[str, Any]:
        return {"uploads": [list(e[:3]) for e in self._pending]}

    async def commit(self, checkpoint_id: int) -> None:
        """Complete every pre-committed upload up to ``checkpoint_id``; idempotent."""
        due = [e for e in self._pending if e[3] <= checkpoint_id]
        if not due:
            return
        await self._in_thread(self._commit_sync, due)
        self._pending = [e for e in self._pending if e[3] > checkpoint_id]

    def _commit_sync(self, due: list[list[Any]]) -> None:
        try:
            for entry in due:
                self._complete(entry)
                failpoints.hit("sink_commit")
        except ObjectStoreError as exc:
            raise ConnectorError(f"commit into {self.location}: {exc}", retriable=True) from exc

    def request_roll(self) -> None:
        """Every checkpoint closes its object already: nothing to roll."""

    async def close(self) -> None:
        """Drop the open transaction (never pre-committed); pre-committed uploads stay listed."""
        self._buffer = bytearray()


def committed_objects(
    url: str, *, prefix: str = "part", settings: S3Settings | None = None
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(name, bytes)`` of the committed objects under ``url``, in commit order."""
    location = ObjectLocation.parse(url)
    store = ObjectStore(settings or S3Settings(), location.bucket)
    names = []
    for key, _ in store.list_keys(location.key(f"{prefix}-")):
        parsed = _parse_final(prefix, location.relative(key))
        if parsed is not None:
            names.append((parsed, key))
    for _, key in sorted(names):
        yield location.relative(key), store.get_bytes(key)[0]


def read_object_output(
    url: str, *, prefix: str = "part", settings: S3Settings | None = None
) -> Iterator[Any]:
    """Yield the records of the committed objects under ``url``: what a consumer may see."""
    for _, data in committed_objects(url, prefix=prefix, settings=settings):
        for line in data.splitlines():
            if line.strip():
                yield orjson.loads(line)
