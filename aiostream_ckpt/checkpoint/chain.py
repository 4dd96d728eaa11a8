"""The chain object: which checkpoints of a prefix are completed, and who may add one.

An object store has no rename and no lock, but it has conditional writes.
``<prefix>/_chain`` lists the completed checkpoints (their metadata objects),
those set aside, the highest id handed out and the stop-with-savepoint; every
change to it is a ``PUT`` with ``If-Match`` on the ETag this daemon last
wrote or read (``If-None-Match: *`` for the first). That write *is* the
completion of a checkpoint (Flink's completed-checkpoint store on
ZooKeeper/Kubernetes, where a resourceVersion plays the ETag's part).

Fencing: a daemon starting on a prefix *claims* it by writing the chain with
its generation (the previous one + 1). From then on, the ETag every older
owner holds is stale: a daemon paused (SIGSTOP, a long GC, a partition) and
resumed after a replacement took over gets ``412 Precondition Failed`` on its
next completion, so it can neither complete a checkpoint nor, since sinks
commit only on completion, commit output; it stops with :class:`FencedError`.
The local directory's ``flock`` can do this only for one host.

Outcomes: a write answered ``412`` is re-read, because a retried request whose
first try landed loses to itself: our own write token there means it landed.
Another owner's generation there means fenced. A write whose answer was lost
(the store went away) has an unknown outcome: :class:`CheckpointOutcomeUnknownError`
makes the job fail over, and the next attempt reads what the chain says.
"""

from __future__ import annotations

import copy
import logging
import os
import secrets
import socket
import time
from typing import Any

import orjson

from aiostream_ckpt.errors import (
    CheckpointError,
    CheckpointOutcomeUnknownError,
    FencedError,
    ObjectNotFoundError,
    ObjectStoreError,
    PreconditionFailedError,
)
from aiostream_ckpt.objectstore import ObjectLocation, ObjectStore

log = logging.getLogger(__name__)
CHAIN_KEY = "_chain"
CHAIN_VERSION = 1


def _empty(job_name: str) -> dict[str, Any]:
    return {
        "version": CHAIN_VERSION,
        "job": job_name,
        "generation": 0,
        "owner": None,
        "write": None,
        "checkpoints": [],  # newest first: {"id": n, "metadata": key relative to the prefix}
        "set_aside": {},  # str(id) -> {"reason": ..., "metadata": ...}
        "high_water": 0,  # highest checkpoint id any owner handed out
        "stop_savepoint": None,
    }


class CheckpointChain:
    """This daemon's view of ``<prefix>/_chain`` and the ETag it may change it with.

    Blocking (call from a thread). Not thread-safe: the coordinator changes
    it from one finalizing step at a time.
    """

    def __init__(self, store: ObjectStore, location: ObjectLocation, job_name: str) -> None:
        self.store = store
        self.location = location
        self.key = location.key(CHAIN_KEY)
        self.job_name = job_name
        self.state: dict[str, Any] = _empty(job_name)
        self._etag: str | None = None
        self.generation = 0

    # -- reading --------------------------------------------------------------------

    def read(self) -> tuple[dict[str, Any] | None, str | None]:
        """Return the chain as the store has it now, and its ETag; (None, None) if none."""
        try:
            data, etag = self.store.get_bytes(self.key)
        except ObjectNotFoundError:
            return None, None
        try:
            body = orjson.loads(data)
            if body.get("version") != CHAIN_VERSION or not isinstance(body["checkpoints"], list):
                raise ValueError(f"version {body.get('version')!r}")
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{self.location.url}/{CHAIN_KEY} is not a checkpoint chain ({exc}): "
                "is this prefix another program's?"
            ) from exc
        return body, etag

    # -- owning ---------------------------------------------------------------------

    def claim(self) -> None:
        """Take the prefix over: write the chain with the next generation, fencing older owners.

        A rival claiming at the same moment makes our write fail; we read
        again and claim over it (the later claim wins, the other is fenced at
        its first completion).
        """
        for _ in range(10):
            body, etag = self.read()
            fresh = body is None
            state = _empty(self.job_name) if body is None else body
            previous = state.get("owner")
            state = copy.deepcopy(state)
            state["generation"] = int(state.get("generation", 0)) + 1
            state["owner"] = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "job": self.job_name,
            }
            try:
                self._put(state, None if fresh else etag, create=fresh)
            except PreconditionFailedError:
                continue
            self.generation = int(state["generation"])
            if previous:
                log.info(
                    "took over %s at generation %d (previous owner: pid %s on %s since %s)",
                    self.location.url,
                    self.generation,
                    previous.get("pid"),
                    previous.get("host"),
                    previous.get("since"),
                )
            return
        raise CheckpointError(f"cannot claim {self.location.url}: ten rival claims in a row")

    def update(self, change: dict[str, Any]) -> None:
        """Replace fields of the chain if we still own it (see the module docstring)."""
        state = copy.deepcopy(self.state)
        state.update(change)
        try:
            self._put(state, self._etag, create=False)
            return
        except PreconditionFailedError:
            body, etag = self.read()
            cause = "it changed since our last write"
        except ObjectStoreError as exc:
            try:
                body, etag = self.read()
            except ObjectStoreError:
                raise CheckpointOutcomeUnknownError(
                    f"cannot tell whether {self.location.url}/{CHAIN_KEY} was written: {exc}"
                ) from exc
            cause = str(exc)
        if body is not None and body.get("write") == state["write"]:
            self.state, self._etag = body, etag  # our write landed; its answer was lost
            return
        if body is None or int(body.get("generation", 0)) != self.generation:
            raise FencedError(self._fenced_message(body))
        # still ours, but not what we wrote now: an earlier write of ours landed late, or
        # this one may yet land. Take the store's word and fail over: the next attempt
        # checks ownership against it (touch) and restores what it says.
        self.state, self._etag = body, etag
        raise CheckpointOutcomeUnknownError(
            f"{self.location.url}/{CHAIN_KEY} was not changed as asked ({cause}): "
            "failing over to restore what it says"
        )

    def _fenced_message(self, body: dict[str, Any] | None) -> str:
        if body is None:
            return f"{self.location.url}/{CHAIN_KEY} was deleted while this daemon owned it"
        owner = body.get("owner") or {}
        return (
            f"another daemon took over {self.location.url} (generation "
            f"{body.get('generation')} > ours {self.generation}: pid {owner.get('pid')} on "
            f"host {owner.get('host')} since {owner.get('since')}); this one stops without "
            "completing a checkpoint or committing output"
        )

    def _put(self, state: dict[str, Any], etag: str | None, *, create: bool) -> None:
        state["write"] = secrets.token_hex(8)
        data = orjson.dumps(state, option=orjson.OPT_INDENT_2)
        new = self.store.put_bytes(self.key, data, if_none_match=create, if_match=etag)
        self.state, self._etag = state, new

    def touch(self) -> None:
        """Check we still own the prefix by a conditional write (an attempt's start)."""
        self.update({})
