"""Checkpoint storage in an object store (``checkpoint.dir=s3://bucket/prefix``).

The working state and every snapshot are written on local disk as with a
local ``checkpoint.dir`` (``checkpoint.local_dir`` is that local copy): the
snapshot code, its pins and its checksums are the same. What changes is
where a checkpoint *completes*:

1. the coordinator's finalizing step (in its executor, off the event loop)
   uploads the files the checkpoint references that the store lacks -- an
   incremental checkpoint's new delta, once; its base chain is there already
   -- then its metadata as ``chk-N/_metadata.g<generation>``, then
2. changes the chain object (:mod:`.chain`) with a conditional write. That
   write is the completion; only after it are sinks told to commit. A
   daemon that lost the prefix to a newer one fails it and stops.

Layout under the prefix::

    _chain                                  the completed checkpoints; the owner
    chk-0000000042/_metadata.g3             metadata of a checkpoint (g: its owner)
    shared/<file>                           state files, referenced by metadata

A restore on a host with an empty disk downloads the chosen checkpoint's
metadata and every state file it references (verified against the sizes and
sha256 its handles list), then restores from the local copy. Retention keeps
the chain's newest ``retained`` checkpoints; it deletes what a dropped one
referenced and no kept one (nor a snapshot in flight) does. Objects no
checkpoint of the chain references (an owner died between its uploads and its
chain write) are swept when a daemon claims the prefix, never while it runs:
an owner that was paused could otherwise delete a newer owner's new files.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.checkpoint.chain import CheckpointChain
from aiostream_ckpt.checkpoint.metadata import (
    METADATA_FILE,
    CompletedCheckpoint,
    decode_metadata,
    encode_metadata,
)
from aiostream_ckpt.checkpoint.storage import CheckpointStorage, read_checkpoint, write_atomically
from aiostream_ckpt.errors import (
    CheckpointError,
    CorruptCheckpointError,
    ObjectNotFoundError,
    ObjectStoreError,
)
from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore, S3Settings

log = logging.getLogger(__name__)
_METADATA_RE = re.compile(r"^chk-\d{10}/_metadata\.g\d+$")
_CHANNEL_RE = re.compile(r"^chk-\d{10}/[^/]+/channel-state$")
_TRANSFER_THREADS = 4


class ObjectCheckpointStorage(CheckpointStorage):
    """A local copy (``root``) whose checkpoints complete in the object store at ``location``."""

    def __init__(
        self,
        root: Path,
        location: ObjectLocation,
        store: ObjectStore,
        *,
        job_name: str,
        retained: int,
    ) -> None:
        super().__init__(root)
        self.location = location
        self.store = store
        self.retained = retained
        self.chain = CheckpointChain(store, location, job_name)
        #: state files the store holds (referenced by the chain, or uploaded by us)
        self._remote_files: set[str] = set()
        #: metadata of the chain's checkpoints, by id (read once)
        self._metadata: dict[int, CompletedCheckpoint] = {}
        #: chain entries the last completion dropped: retention deletes what only they used
        self._dropped: list[dict[str, Any]] = []
        self._savepoint_ids = 0
        self._pool: ThreadPoolExecutor | None = None

    @property
    def url(self) -> str:
        return self.location.url

    def _transfers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_TRANSFER_THREADS, thread_name_prefix="s3-transfer")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- owning the prefix ----------------------------------------------------------

    def claim(self) -> None:
        """Check the store, take the prefix over (fencing older owners), sweep orphans.

        Blocking; before anything is restored or written. An unreachable
        store, refused credentials or a missing bucket fail here, clearly.
        """
        self.store.check_bucket()
        self.chain.claim()
        referenced: set[str] = set()
        metadata_keys: set[str] = set()
        for entry in self._entries():
            metadata_keys.add(entry["metadata"])
            try:
                referenced |= set(state_files(self._read(entry)))
            except CorruptCheckpointError as exc:
                log.error("checkpoint %d in %s: %s", entry["id"], self.url, exc)
        for reason in self.chain.state["set_aside"].values():
            metadata_keys.add(reason.get("metadata", ""))
        self._remote_files = set(referenced)
        self._sweep(referenced, metadata_keys)

    def _sweep(self, referenced: set[str], metadata_keys: set[str]) -> None:
        """Delete objects of this chain that no checkpoint references (see the module doc)."""
        prefix = self.location.key("")
        orphans = []
        for key, _ in self.store.list_keys(prefix):
            rel = self.location.relative(key)
            if rel in referenced or rel in metadata_keys:
                continue
            if rel.startswith("shared/") or _METADATA_RE.match(rel) or _CHANNEL_RE.match(rel):
                orphans.append(key)
        if not orphans:
            return
        body, _ = self.chain.read()  # listed before this read: no newer owner's objects in it
        if body is None or int(body.get("generation", 0)) != self.chain.generation:
            return
        log.info("%s: removing %d object(s) no checkpoint references", self.url, len(orphans))
        self.store.delete_keys(orphans)

    def begin_attempt(self, attempt: int) -> None:
        """Before a restarted attempt restores: check by a conditional write we still own it."""
        if attempt > 0:
            self.chain.touch()

    # -- the chain ------------------------------------------------------------------

    def _entries(self) -> list[dict[str, Any]]:
        return list(self.chain.state["checkpoints"])

    def _entry(self, checkpoint_id: int) -> dict[str, Any]:
        for e in self._entries():
            if e["id"] == checkpoint_id:
                return e
        raise CorruptCheckpointError(f"checkpoint {checkpoint_id} is not in {self.url}/_chain")

    def completed_newest_first(self) -> Iterator[int]:
        for e in self._entries():
            yield int(e["id"])

    def next_checkpoint_id(self) -> int:
        state = self.chain.state
        seen = [
            super().next_checkpoint_id() - 1,
            int(state["high_water"]),
            *(int(e["id"]) for e in state["checkpoints"]),
            *(int(k) for k in state["set_aside"]),
        ]
        if state.get("stop_savepoint"):
            seen.append(int(state["stop_savepoint"]["id"]))
        return max(seen) + 1

    def note_savepoint_id(self, checkpoint_id: int) -> None:
        super().note_savepoint_id(checkpoint_id)  # locally now; in the chain at the next write
        self._savepoint_ids = max(self._savepoint_ids, checkpoint_id)

    def set_aside(self, checkpoint_id: int, reason: str) -> None:
        state = self.chain.state
        kept = [e for e in state["checkpoints"] if e["id"] != checkpoint_id]
        metadata = next(
            (e["metadata"] for e in state["checkpoints"] if e["id"] == checkpoint_id), None
        )
        aside = {**state["set_aside"], str(checkpoint_id): {"reason": reason, "metadata": metadata}}
        self.chain.update({"checkpoints": kept, "set_aside": aside})
        self._metadata.pop(checkpoint_id, None)
        if self.checkpoint_dir(checkpoint_id).is_dir():
            try:
                super().set_aside(checkpoint_id, reason)
            except CheckpointError as exc:
                log.warning("%s (it is set aside in %s all the same)", exc, self.url)
        log.error("checkpoint %d set aside in %s: %s", checkpoint_id, self.url, reason)

    def set_aside_checkpoints(self) -> dict[int, str]:
        aside = self.chain.state["set_aside"]
        return {int(k): str(v.get("reason", "")) for k, v in sorted(aside.items())}

    def committed_after(self, checkpoint_id: int) -> list[int]:
        state = self.chain.state
        ids = {int(e["id"]) for e in state["checkpoints"]} | {int(k) for k in state["set_aside"]}
        if state.get("stop_savepoint"):
            ids.add(int(state["stop_savepoint"]["id"]))
        return sorted(i for i in ids if i > checkpoint_id)

    def record_stop_savepoint(self, directory: Path, checkpoint_id: int) -> None:
        super().record_stop_savepoint(directory, checkpoint_id)
        body = {"id": checkpoint_id, "path": str(directory.resolve())}
        self.chain.update({"stop_savepoint": body, "high_water": self._high_water(checkpoint_id)})

    def stop_savepoint(self) -> tuple[int, Path] | None:
        sp = self.chain.state.get("stop_savepoint")
        return None if not sp else (int(sp["id"]), Path(sp["path"]))

    def set_aside_stop_savepoint(self, reason: str) -> None:
        sp = self.chain.state.get("stop_savepoint")
        if not sp:
            return
        self.chain.update({"stop_savepoint": None})
        super().set_aside_stop_savepoint(reason)

    def _high_water(self, checkpoint_id: int) -> int:
        return max(int(self.chain.state["high_water"]), self._savepoint_ids, checkpoint_id)

    # -- reading and restoring ------------------------------------------------------

    def _read(self, entry: dict[str, Any]) -> CompletedCheckpoint:
        """Return the metadata of a chain entry: fetched into the local copy once, verified."""
        cid = int(entry["id"])
        cached = self._metadata.get(cid)
        if cached is not None:
            return cached
        local = self.checkpoint_dir(cid) / METADATA_FILE
        try:
            data, _ = self.store.get_bytes(self.location.key(entry["metadata"]))
        except ObjectNotFoundError as exc:
            raise CorruptCheckpointError(f"{self.url}/{entry['metadata']} is missing") from exc
        decode_metadata(data, Path(f"{self.url}/{entry['metadata']}"))  # verify first
        local.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(local, data)
        completed = read_checkpoint(local.parent)
        self._metadata[cid] = completed
        return completed

    def read_completed(
        self, checkpoint_id: int, *, with_state: bool = False
    ) -> CompletedCheckpoint:
        """Read checkpoint ``checkpoint_id``; ``with_state``: download its state files too."""
        completed = self._read(self._entry(checkpoint_id))
        if with_state:
            self._fetch_state(completed)
        return completed

    def latest_valid(self) -> CompletedCheckpoint | None:
        for cid in self.completed_newest_first():
            try:
                return self.read_completed(cid)
            except CorruptCheckpointError as exc:
                log.error("checkpoint %d is corrupt (%s); falling back to an older one", cid, exc)
        return None

    def _fetch_state(self, completed: CompletedCheckpoint) -> None:
        """Download every state file ``completed`` references that the local copy lacks."""
        wanted = state_files(completed)
        jobs = [self._transfers().submit(self._fetch_one, e) for e in wanted.values()]
        fetched = sum(1 for j in jobs if j.result())
        if fetched:
            log.info(
                "checkpoint %d: downloaded %d of its %d state file(s) from %s",
                completed.checkpoint_id,
                fetched,
                len(wanted),
                self.url,
            )
        self._remote_files |= set(wanted)

    def _fetch_one(self, entry: dict[str, Any]) -> bool:
        rel = entry["path"]
        local = self.root / rel
        if _matches(local, entry):
            return False
        try:
            self.store.download_file(self.location.key(rel), local)
        except ObjectNotFoundError as exc:
            raise CorruptCheckpointError(f"state file {self.url}/{rel} is missing") from exc
        if not _matches(local, entry):
            raise CorruptCheckpointError(
                f"state file {self.url}/{rel}: size or sha256 differs from its handle"
            )
        return True

    # -- completing -----------------------------------------------------------------

    def write_completed(self, completed: CompletedCheckpoint) -> None:
        """Upload what the store lacks, then the metadata, then change the chain (the commit)."""
        if completed.is_savepoint:
            super().write_completed(completed)
            return
        cid = completed.checkpoint_id
        missing = sorted(set(state_files(completed)) - self._remote_files)
        try:
            for job in [self._transfers().submit(self._upload, rel) for rel in missing]:
                job.result()
        except ObjectStoreError as exc:
            raise CheckpointError(f"checkpoint {cid}: {exc}", retriable=True) from exc
        self._remote_files.update(missing)
        data = encode_metadata(completed.to_json())
        metadata = f"chk-{cid:010d}/{METADATA_FILE}.g{self.chain.generation}"
        try:
            self.store.put_bytes(self.location.key(metadata), data)
        except ObjectStoreError as exc:
            raise CheckpointError(f"checkpoint {cid}: {exc}", retriable=True) from exc
        super().write_completed(completed)  # the local copy, for a restart on this host
        failpoints.hit("checkpoint_uploaded")
        entries = [{"id": cid, "metadata": metadata}, *self._entries()]
        kept, dropped = entries[: self.retained], entries[self.retained :]
        self.chain.update({"checkpoints": kept, "high_water": self._high_water(cid)})
        self._metadata[cid] = completed
        self._dropped += dropped

    def _upload(self, rel: str) -> None:
        path = self.root / rel
        if not path.is_file():
            raise CheckpointError(f"state file {path} is gone before its upload", retriable=True)
        self.store.upload_file(self.location.key(rel), path)

    # -- retention ------------------------------------------------------------------

    def apply_retention(self, retained: int) -> None:
        """Delete what the checkpoints the chain dropped referenced, locally and in the store."""
        kept_ids = set(self.completed_newest_first())
        referenced = self._pinned()
        for cid in kept_ids:
            try:
                referenced |= self.read_completed(cid).referenced_files()
            except (CorruptCheckpointError, ObjectStoreError) as exc:
                log.warning("retention skipped: checkpoint %d unreadable (%s)", cid, exc)
                return  # do not garbage-collect on a state we cannot fully read
        dropped, self._dropped = self._dropped, []
        gone: set[str] = set()
        for entry in dropped:
            cached = self._metadata.pop(int(entry["id"]), None)
            if cached is None:
                try:
                    cached = read_checkpoint(self.checkpoint_dir(int(entry["id"])))
                except CorruptCheckpointError:
                    continue  # its files are left to the next claim's sweep
            gone |= set(state_files(cached)) - referenced
        keys = [self.location.key(r) for r in sorted(gone)]
        keys += [self.location.key(e["metadata"]) for e in dropped]
        try:
            self.store.delete_keys(keys)
            self._remote_files -= gone
        except ObjectStoreError as exc:
            log.warning(
                "%s: retention could not delete (%s); the next claim sweeps them", self.url, exc
            )
        self._local_retention(kept_ids, referenced)

    def _local_retention(self, kept_ids: set[int], referenced: set[str]) -> None:
        """Keep in the local copy what the chain keeps and what snapshots in flight pinned."""
        for cid in self._ids_on_disk():
            if cid not in kept_ids:
                shutil.rmtree(self.checkpoint_dir(cid), ignore_errors=True)
        shared = list(self.shared_dir.iterdir())
        referenced = referenced | self._pinned()
        for f in shared:
            if f.relative_to(self.root).as_posix() in referenced:
                continue
            if f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
            else:
                f.unlink(missing_ok=True)


def state_files(completed: CompletedCheckpoint) -> dict[str, dict[str, Any]]:
    """Every file a checkpoint's restore reads, by path under the root: size and sha256.

    Keyed state's chains (shared files, usually of earlier checkpoints too) and
    an unaligned checkpoint's channel state (``chk-N/<uid>-<subtask>/``, its own).
    """
    out: dict[str, dict[str, Any]] = {}
    for op in completed.operators.values():
        for st in op["subtasks"].values():
            handle = st.get("keyed") or {}
            for e in handle.get("chain") or [{"path": p} for p in handle.get("files", ())]:
                out[e["path"]] = e
            channel = st.get("channel")
            if channel:
                rel = str(channel["file"])
                out[rel] = {"path": rel, "size": channel["size_bytes"], "sha256": channel["sha256"]}
    return out


def _matches(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the local file is the one a handle's chain entry describes."""
    try:
        if "size" in entry and path.stat().st_size != entry["size"]:
            return False
    except FileNotFoundError:
        return False
    if "sha256" not in entry:
        return path.is_file()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return bool(h.hexdigest() == entry["sha256"])


def open_storage(
    directory: Path, remote: ObjectLocation | None, s3: S3Settings, *, job_name: str, retained: int
) -> CheckpointStorage:
    """Open the job's checkpoint storage: the local directory, or its copy of an object store's."""
    if remote is None:
        return CheckpointStorage(directory)
    store = ObjectStore(s3, remote.bucket)
    return ObjectCheckpointStorage(directory, remote, store, job_name=job_name, retained=retained)
