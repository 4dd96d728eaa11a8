"""Which worker process runs which subtask, and the graph every process must agree on.

Every process (the main one and each worker) plans the chains from the job
spec it built itself by importing the app: nothing is pickled from closures.
So the placement must follow from the plan alone, and every worker must have
built the *same* plan: :func:`graph_fingerprint` is what a worker reports
and the main process compares before anything runs.

Subtask ``i`` of every chain runs in worker ``i % workers``: forward edges
(subtask i to subtask i) then never cross a process, and a keyed edge
crosses for the share of key groups another worker owns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from aiostream_ckpt.jobspec.graph import Transformation
from aiostream_ckpt.runtime.network.remote import ChannelConnection


def worker_of(subtask: int, workers: int) -> int:
    """Return the worker that runs ``subtask`` (of any chain)."""
    return subtask % workers


@dataclass(frozen=True)
class ProcessShare:
    """This process's part of the job: its worker index and a connection to every other worker."""

    worker: int
    workers: int
    peers: Mapping[int, ChannelConnection]

    def here(self, subtask: int) -> bool:
        """Whether ``subtask`` (of any chain) runs in this process."""
        return worker_of(subtask, self.workers) == self.worker

    def peer(self, subtask: int) -> ChannelConnection:
        """Return the connection to the worker that runs ``subtask``."""
        return self.peers[worker_of(subtask, self.workers)]


def task_id(head_uid: str, subtask: int) -> str:
    """Return the id of a chain's subtask, as the runtime names its tasks."""
    return f"{head_uid}-{subtask}"


def worker_tasks(chains: Sequence[tuple[str, int]], worker: int, workers: int) -> list[str]:
    """Return the task ids ``worker`` runs, given each chain's (head uid, parallelism)."""
    return [
        task_id(head, sub)
        for head, parallelism in chains
        for sub in range(parallelism)
        if worker_of(sub, workers) == worker
    ]


def graph_fingerprint(transformations: Sequence[Transformation]) -> str:
    """Return a digest of what decides the plan: uids, kinds, parallelism, edges.

    Two processes that built the same job from the same app and config get
    the same digest; an app whose graph depends on something else (the
    clock, the host, a random choice) does not, and is refused before it
    runs with its subtasks wired to the wrong peers.
    """
    nodes = [
        (
            t.uid,
            t.kind.value,
            t.parallelism,
            t.partitioning.value,
            [i.uid for i in t.inputs],
        )
        for t in transformations
    ]
    return hashlib.sha256(orjson.dumps(nodes)).hexdigest()[:16]
