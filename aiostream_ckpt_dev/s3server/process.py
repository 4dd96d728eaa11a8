"""SeaweedFS's ``weed mini`` on loopback: a real S3 server for tests, chaos runs and the bench.

``weed mini`` runs a master, a volume server, a filer and the S3 gateway in
one process. By default it opens a dozen fixed ports (9333, 8888, 8333,
8181, 12535, ...) and their gRPC twins (port + 10000), so two test workers
would collide: every listener gets a free loopback port here, the optional
ones (WebDAV, admin UI, Iceberg and Lance catalogs, telemetry) are off. It
is ready when a signed request can write and delete an object in the first
bucket: the S3 port answers before the volume server takes writes.

Credentials are enforced (a wrong secret gets ``SignatureDoesNotMatch``):
``weed mini`` makes its admin identity from ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` in its environment. Synchronous on purpose, like
:mod:`aiostream_ckpt_dev.broker.process`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt_dev.broker.process import LOOPBACK, free_port
from aiostream_ckpt_dev.s3server.build import ensure_weed

ACCESS_KEY = "aiostream-test"
SECRET_KEY = "aiostream-test-secret"
REGION = "us-east-1"
#: the listeners ``weed mini`` opens that we place (the HTTP ones and their gRPC twins)
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class SeaweedS3:
    """One ``weed mini`` on loopback with its data in ``data_dir`` (a temp dir if not given).

    ``buckets`` are created at start. ``restart()`` keeps the ports and the
    data, so clients reconnect to the same objects, as after a real restart.
    The process is tied to ours (SIGTERM when we die, even by SIGKILL) unless
    ``detach``.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        buckets: Sequence[str] = ("aiostream",),
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        start_timeout_s: float = 60.0,
        detach: bool = False,
        weed: Path | None = None,
    ) -> None:
        if not buckets:
            raise ValueError("at least one bucket (the readiness probe writes into it)")
        self._own_dir = data_dir is None
        self._dir = Path(data_dir) if data_dir is not None else None
        self.buckets = tuple(buckets)
        self.access_key = access_key
        self.secret_key = secret_key
        self._start_timeout_s = start_timeout_s
        self._detach = detach
        self._weed = weed
        self._ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    # -- public surface ----------------------------------------------------

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise ConnectorError("the S3 server was never started")
        return self._dir

    @property
    def port(self) -> int:
        if "s3.port" not in self._ports:
            raise ConnectorError("the S3 server was never started")
        return self._ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def env(self) -> dict[str, str]:
        """Return the AWS variables a client (a daemon, boto3) needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
        }

    def client(self, **config: Any) -> Any:
        """Return a boto3 S3 client of this server (no retries unless ``config`` says)."""
        import boto3
        from botocore.config import Config

        cfg = Config(
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=2,
            read_timeout=10,
            s3={"addressing_style": "path"},
            **config,
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=cfg,
        )

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> SeaweedS3:
        """Start ``weed mini`` (building it first if missing) and wait until it takes writes.

        Idempotent. Raises ``ConnectorError`` with the log tail if it exits or
        is not ready in time.
        """
        if self.is_running():
            return self
        weed = self._weed or ensure_weed()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="aiostream-s3-"))
        (self._dir / "data").mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._ports else 3  # ports kept for a restart are fixed
        for attempt in range(attempts):
            if not self._ports:
                self._ports = _free_ports(len(_PORT_FLAGS))
            self._launch(weed)
            try:
                self._wait_ready()
                return self
            except ConnectorError:
                in_use = "address already in use" in self.log_tail().lower()
                self.kill()
                if attempt + 1 < attempts and in_use:
                    self._ports = {}
                    continue
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (it stops in ~3 s), SIGKILL if it hangs. Idempotent."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server: a crash. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (or kill) and start again on the same ports with the same data."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.start()

    def close(self) -> None:
        """Stop, and remove the data dir if we made it."""
        self.stop()
        if self._own_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server output)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(no server output)"

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ---------------------------------------------------------

    def _command(self, weed: Path) -> list[str]:
        d = self.data_dir
        known = _mini_flags(weed)
        optional = [f for f in ("-admin.port.legacy=0",) if f.partition("=")[0][1:] in known]
        return [
            str(weed),
            "mini",
            f"-dir={d / 'data'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            *(f"-{flag}={port}" for flag, port in self._ports.items()),
            f"-filer.localSocket={d / 'filer.sock'}",
            f"-s3.localSocket={d / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *optional,
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-bucket={','.join(self.buckets)}",
        ]

    def _launch(self, weed: Path) -> None:
        cmd = self._command(weed)
        tie_to_parent = not self._detach and threading.current_thread() is threading.main_thread()
        setpriv = shutil.which("setpriv")
        if tie_to_parent and setpriv is not None:
            cmd = [setpriv, "--pdeathsig", "TERM", *cmd]
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                env=env,
                start_new_session=self._detach,
            )

    def _wait_ready(self) -> None:
        """Poll until a probe object can be written and deleted in the first bucket."""
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + self._start_timeout_s
        client = self.client()
        last = "no answer yet"
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ConnectorError(
                    f"weed mini exited during start-up (exit {code}):\n{self.log_tail()}"
                )
            try:
                client.put_object(Bucket=self.buckets[0], Key=".ready-probe", Body=b"1")
                client.delete_object(Bucket=self.buckets[0], Key=".ready-probe")
                return
            except (BotoCoreError, ClientError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"weed mini not ready on {self.endpoint_url} after "
                    f"{self._start_timeout_s:.0f}s ({last}):\n{self.log_tail()}",
                    retriable=True,
                )
            time.sleep(0.2)


@functools.cache
def _mini_flags(weed: Path) -> frozenset[str]:
    """Return the flags this ``weed mini`` knows (4.53 added ``admin.port.legacy``)."""
    out = subprocess.run(
        [str(weed), "help", "mini"], capture_output=True, text=True, check=False, timeout=60
    )
    return frozenset(re.findall(r"^\s+-([\w.]+)", out.stdout + out.stderr, re.MULTILINE))


def _free_ports(n: int) -> dict[str, int]:
    """``n`` distinct free loopback ports, one per flag of :data:`_PORT_FLAGS`."""
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return dict(zip(_PORT_FLAGS, ports, strict=True))
