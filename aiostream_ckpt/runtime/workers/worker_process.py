"""Worker processes: started by the main process, each building the job itself.

A worker is ``python -m aiostream_ckpt.daemon.worker``: it imports the app
module and loads the same config sources as the main process, builds the
job spec, plans the chains, and says hello over its control connection (a
:class:`~aiostream_ckpt.runtime.network.remote.ChannelConnection` on a socket
pair) with the graph's fingerprint and the tasks it runs
(:mod:`~aiostream_ckpt.runtime.network.placement`). The main process refuses a
worker whose graph differs before anything runs.

A worker never outlives the main process: it asks the kernel for SIGKILL
when its parent dies (``PR_SET_PDEATHSIG``, Linux) and exits on the end of
its control connection. A worker that dies is the control connection's
failure, which the owner turns into a failed attempt -- and its exit
(:meth:`WorkerProcess.exited`), for when no end of file comes: a child the
worker forked (``multiprocessing``'s default on Linux) holds the socket on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from aiostream_ckpt import failpoints
from aiostream_ckpt.errors import AiostreamError, WorkerError
from aiostream_ckpt.runtime.network.remote import ChannelConnection
from aiostream_ckpt.runtime.wire import batch_codec

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit if it already has.

    ``PR_SET_PDEATHSIG`` is Linux's; elsewhere the end of the control
    connection is the only signal (the worker exits on it).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request: nobody to serve
        os._exit(1)


@dataclass(frozen=True)
class WorkerLaunch:
    """What a worker needs to build the job the main process built: module and config sources."""

    module: str
    config: Path | None
    sets: tuple[str, ...]
    workers: int

    def argv(
        self, index: int, control_fd: int, peer_fds: dict[int, int] | None = None
    ) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "aiostream_ckpt.daemon.worker",
            self.module,
            "--index",
            str(index),
            "--workers",
            str(self.workers),
            "--control-fd",
            str(control_fd),
            "--parent",
            str(os.getpid()),
        ]
        if self.config is not None:
            args += ["--config", str(self.config)]
        for s in self.sets:
            args += ["--set", s]
        for worker, fd in sorted((peer_fds or {}).items()):
            args += ["--peer", f"{worker}:{fd}"]
        return args


def exit_description(code: int) -> str:
    """Say how a process ended: ``exited with code 1``, ``was killed by SIGKILL``.

    >>> exit_description(-9)
    'was killed by SIGKILL'
    """
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


class WorkerState(Enum):
    CREATED = "created"
    READY = "ready"  # said hello with the expected graph
    STOPPED = "stopped"
    FAILED = "failed"

    def can_become(self, other: WorkerState) -> bool:
        return other in _WORKER_TRANSITIONS[self]


_WORKER_TRANSITIONS = {
    WorkerState.CREATED: {WorkerState.READY, WorkerState.STOPPED, WorkerState.FAILED},
    WorkerState.READY: {WorkerState.STOPPED, WorkerState.FAILED},
    WorkerState.STOPPED: set(),
    WorkerState.FAILED: set(),
}


class WorkerProcess:
    """One worker process and its control connection (see the module docstring)."""

    def __init__(self, index: int, launch: WorkerLaunch, *, arm_failpoints: bool = True) -> None:
        self.index = index
        self.launch = launch
        #: pass ``AIOSTREAM_FAILPOINTS`` on (see :class:`~.worker_group.WorkerGroup`)
        self.arm_failpoints = arm_failpoints
        self.state = WorkerState.CREATED
        self.hello: dict[str, Any] = {}
        self.control = ChannelConnection(f"worker-{index}", batch_codec())
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def failure(self) -> asyncio.Future[BaseException]:
        """Resolves to the error when the worker dies (EOF or reset on its control connection)."""
        return self.control.failure

    def _transition(self, new: WorkerState) -> None:
        if not self.state.can_become(new):
            raise AiostreamError(f"worker {self.index}: cannot go from {self.state} to {new}")
        self.state = new

    async def start(
        self,
        fingerprint: str,
        tasks: list[str],
        peers: dict[int, socket.socket] | None = None,
    ) -> None:
        """Start the process (unless :meth:`spawn` did) and wait for its hello.

        Refuse a different graph or share. ``peers``: as :meth:`spawn`'s.
        """
        if self.state is not WorkerState.CREATED:
            return
        try:
            await self.spawn(peers)
            hello = await self.control.receive_message()
        except BaseException:
            await self._kill()
            raise
        self.hello = hello
        if hello.get("type") == "error":
            await self._kill()
            raise WorkerError(f"worker {self.index} could not build the job: {hello['message']}")
        if hello.get("fingerprint") != fingerprint or hello.get("tasks") != tasks:
            await self._kill()
            raise WorkerError(
                f"worker {self.index} built a different job from {self.launch.module!r} "
                f"(graph {hello.get('fingerprint')} with tasks {hello.get('tasks')}, expected "
                f"{fingerprint} with {tasks}): the app's graph must not depend on anything "
                "but its module and config"
            )
        self._transition(WorkerState.READY)

    async def spawn(self, peers: dict[int, socket.socket] | None = None) -> None:
        """Start the process, without waiting for it; its hello is :meth:`start`'s to check.

        Apart so that the workers can start while the main process still builds
        the job (see :class:`~.worker_group.EarlyWorkers`). ``peers``: this
        worker's end of a socket pair to each other worker (its channels to
        their subtasks); the caller closes its copies afterwards.
        """
        if self._proc is not None:
            return
        ours, theirs = socket.socketpair()
        peer_fds = {j: s.fileno() for j, s in (peers or {}).items()}
        env = None
        if not self.arm_failpoints:
            env = {k: v for k, v in os.environ.items() if k != failpoints.ENV_VAR}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.launch.argv(self.index, theirs.fileno(), peer_fds),
                pass_fds=(theirs.fileno(), *peer_fds.values()),
                env=env,
                # a terminal's Ctrl-C is the main process's to handle (a graceful stop),
                # not every worker's; they still die with it (PR_SET_PDEATHSIG)
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        await self.control.start(ours)

    async def stop(self) -> int | None:
        """Ask the worker to exit, close the connection, reap it; idempotent. Its exit code."""
        if self.state in (WorkerState.STOPPED, WorkerState.FAILED):
            return self._proc.returncode if self._proc is not None else None
        failed = self.failure.done()
        if self.state is WorkerState.READY and not failed:
            self.control.send_message({"type": "stop"})
        await self.control.close()
        code = await self._proc.wait() if self._proc is not None else None
        self._transition(WorkerState.FAILED if failed or code else WorkerState.STOPPED)
        return code

    async def exited(self) -> int:
        """Return the process's exit code once it ended (negative: the signal that ended it)."""
        assert self._proc is not None, "not started"
        return await self._proc.wait()

    async def kill(self) -> None:
        """SIGKILL the process (one that does not stop when asked) and reap it."""
        await self._kill()

    async def _kill(self) -> None:
        self.state = WorkerState.FAILED
        await self.control.close()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()

    async def __aenter__(self) -> WorkerProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.state is WorkerState.CREATED:
            await self._kill()
        else:
            await self.stop()


async def spawn_all(workers: Sequence[WorkerProcess]) -> None:
    """Start every worker with a socket pair to each other one; wait for no hello.

    The pairs are their channels to each other's subtasks. A failure kills
    those already started.
    """
    ends: dict[int, dict[int, socket.socket]] = {w.index: {} for w in workers}
    for i, j in itertools.combinations(sorted(ends), 2):
        ends[i][j], ends[j][i] = socket.socketpair()
    try:
        for w in workers:
            await w.spawn(ends[w.index])
    except BaseException:
        await asyncio.gather(*(w.kill() for w in workers), return_exceptions=True)
        raise
    finally:
        for pair in ends.values():
            for sock in pair.values():
                sock.close()  # the workers hold their own copies


class EarlyWorkers:
    """The first attempt's workers, started before the main process builds the job.

    A worker's start (interpreter, imports, building the job) takes as long
    as the main process's, which needs nothing from it before its hello:
    started first, the two overlap instead of running one after the other.
    The first attempt takes them (:meth:`take`) if it runs as many as were
    started (``job.place_workers`` may run fewer); :meth:`close` kills any
    nobody took (the job was refused, or failed to build).
    """

    def __init__(self, launch: WorkerLaunch) -> None:
        self.launch = launch
        self._workers: list[WorkerProcess] = []

    async def spawn(self) -> None:
        workers = [WorkerProcess(i, self.launch) for i in range(self.launch.workers)]
        await spawn_all(workers)
        self._workers = workers

    async def take(self, launch: WorkerLaunch) -> list[WorkerProcess] | None:
        """Hand the workers over once, if started for ``launch``; else kill them."""
        if self._workers and launch == self.launch:
            workers, self._workers = self._workers, []
            return workers
        await self.close()
        return None

    async def close(self) -> None:
        """Kill the workers nobody took, then end their connections.

        In that order: a worker that saw the end first would say so on the
        stderr it shares with this process, after the line naming the cause.
        """
        workers, self._workers = self._workers, []
        for w in workers:
            if w.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGKILL)
        await asyncio.gather(*(w.kill() for w in workers))
