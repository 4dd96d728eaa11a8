"""A real single-node Apache Kafka broker (KRaft): the JVM process, on loopback ports.

Tests, CI, the demo and the bench need a broker that really runs transactions
and ``read_committed`` fetches. Fakes (Tansu and friends) drop the aborted
transactions list on Fetch, so they can't check exactly-once. We start
``kafka.Kafka`` from the jars of :mod:`.jars` as a combined broker+controller
node on free loopback ports, and call it ready when it answers a Metadata
request (:func:`~aiostream_ckpt_dev.kafka_wire.metadata_broker_count`).

The API is synchronous on purpose: pytest session fixtures, the CLI and
scripts use it, and none of them should need an event loop.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.broker.jars import ensure_kafka_jars
from aiostream_ckpt_dev.broker.security import (
    SECURE_PROTOCOLS,
    Certificates,
    listener_properties,
    make_certificates,
    scram_format_args,
)
from aiostream_ckpt_dev.kafka_wire import metadata_broker_count
from aiostream_ckpt_dev.maven import QUICK_START_JVM_OPTIONS

LOOPBACK = "127.0.0.1"
_NODE_ID = 1

# Root at INFO into a file only: the tail of that file is what a failed start
# reports. The per-request and state-change loggers are the noisy ones.
_LOG4J2_XML = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="server" fileName="${sys:kafka.logs.dir}/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="org.apache.kafka.raft" level="WARN"/>
    <Logger name="org.apache.kafka.storage.internals.log" level="WARN"/>
    <Root level="INFO">
      <AppenderRef ref="server"/>
    </Root>
  </Loggers>
</Configuration>
"""


def java_executable() -> str:
    """Return the ``java`` to run: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError(
            "Java not found (JAVA_HOME unset, no 'java' on PATH); Kafka needs JDK 17+"
        )
    return found


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """Return a cluster id in Kafka's ``Uuid`` form, like ``kafka-storage random-uuid``.

    Made in Python to save a JVM start. Kafka rejects ids that start with '-'.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaBroker:
    """One KRaft node (broker and controller) on loopback, for tests and demos.

    ``data_dir`` holds ``server.properties``, the logs and the data. It is
    made in the temp dir if not given, and then removed on context exit.
    ``restart()`` keeps the ports and the data, so clients reconnect and see
    the same topics and transactions, as after a real broker restart.
    ``properties`` overrides or extends the generated ``server.properties``.
    ``jvm_options`` go to every JVM it starts (the storage format and the
    broker); :data:`~aiostream_ckpt_dev.maven.QUICK_START_JVM_OPTIONS` unless given; a
    broker measured for peak throughput (the bench) passes ``()``.
    ``detach`` starts the JVM in its own session, so it outlives this process
    (the CLI). Otherwise it is tied to us: if the Python process dies, even by
    SIGKILL, the kernel sends the broker SIGTERM (Linux ``PDEATHSIG``, via
    ``setpriv`` when present). This keeps a killed test run from leaking JVMs.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        properties: Mapping[str, str] | None = None,
        heap: str = "512m",
        jvm_options: Sequence[str] = QUICK_START_JVM_OPTIONS,
        start_timeout_s: float = 90.0,
        detach: bool = False,
        libs_dir: Path | None = None,
        secure: bool = False,
    ) -> None:
        self._own_dir = data_dir is None
        self._dir = Path(data_dir) if data_dir is not None else None
        self._port = port
        self._controller_port = controller_port
        self._properties = dict(properties or {})
        self._heap = heap
        self._jvm_options = list(jvm_options)
        self._start_timeout_s = start_timeout_s
        self._detach = detach
        self._libs_dir = libs_dir
        self._proc: subprocess.Popen[bytes] | None = None
        #: ``secure``: SSL, SASL_SSL and SASL_PLAINTEXT listeners too (:mod:`.security`)
        self._secure = secure
        self._secure_ports: dict[str, int] = {}

    # -- public surface ----------------------------------------------------

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise ConnectorError("broker was never started")
        return self._dir

    @property
    def port(self) -> int:
        if self._port is None:
            raise ConnectorError("broker was never started")
        return self._port

    @property
    def controller_port(self) -> int:
        if self._controller_port is None:
            raise ConnectorError("broker was never started")
        return self._controller_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def listener(self, protocol: str) -> str:
        """Return ``host:port`` of ``protocol``'s listener (SSL and SASL_* need ``secure``)."""
        if protocol == "PLAINTEXT":
            return self.bootstrap_servers
        if protocol not in self._secure_ports:
            raise ConfigError(f"this broker has no {protocol} listener (KafkaBroker(secure=True))")
        return f"{LOOPBACK}:{self._secure_ports[protocol]}"

    @property
    def certificates(self) -> Certificates:
        """The CA (``ca_file``) clients of the TLS listeners trust, and a CA they must not."""
        return make_certificates(self.data_dir / "tls")

    @property
    def log_path(self) -> Path:
        """The broker's log4j log (``server.log``)."""
        return self.data_dir / "logs" / "server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> KafkaBroker:
        """Format storage if needed, start the JVM, and wait until the broker serves metadata.

        Idempotent. Raises ``ConfigError`` if Java is missing and ``ConnectorError``
        (with the log tail) if the broker exits or doesn't come up in time.
        """
        if self.is_running():
            return self
        java = java_executable()
        libs = self._libs_dir or ensure_kafka_jars()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="aiostream-kafka-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        # Ports we chose ourselves may be taken between probing and binding;
        # pick again then. Ports given to us (or kept for restart) are fixed.
        attempts = 3 if self._port is None and self._controller_port is None else 1
        for attempt in range(attempts):
            self._port = self._port or free_port()
            self._controller_port = self._controller_port or free_port()
            if self._secure:
                for protocol in SECURE_PROTOCOLS:
                    self._secure_ports[protocol] = self._secure_ports.get(protocol) or free_port()
            self._write_config()
            self._format(java, libs)
            self._launch(java, libs)
            try:
                self._wait_ready()
                return self
            except ConnectorError:
                if attempt + 1 < attempts and "Address already in use" in self.log_tail():
                    self.kill()
                    self._port = self._controller_port = None
                    self._secure_ports = {}
                    continue
                self.kill()
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut down cleanly (SIGTERM), with SIGKILL if it hangs. Idempotent."""
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
        """SIGKILL the broker: a crash, for tests of broker failure. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (or kill) and start again with the same ports and data."""
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

    def log_tail(self, lines: int = 40) -> str:
        """Return the last lines of the JVM's stdout/stderr and of ``server.log``."""
        parts = []
        for path in (self.data_dir / "logs" / "jvm.out", self.log_path):
            with contextlib.suppress(OSError):
                text = _tail(path.read_text(errors="replace"), lines)
                if text:
                    parts.append(f"--- {path} ---\n{text}")
        return "\n".join(parts) or "(no broker output)"

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ---------------------------------------------------------

    def _first_error(self) -> str:
        """Return the first ERROR line and its exception message: the cause, not the fallout."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "no server.log (see jvm.out below)"
        for i, line in enumerate(lines):
            if "] ERROR " in line or "] FATAL " in line:
                cause = line.split("] ", 1)[1]
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                if nxt and not nxt.startswith(("[", "\t", " ")):
                    cause += f": {nxt}"
                return cause
        return "no ERROR in server.log"

    def _server_properties(self) -> dict[str, str]:
        listeners = (
            f"PLAINTEXT://{LOOPBACK}:{self._port},CONTROLLER://{LOOPBACK}:{self._controller_port}"
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            # Static voters: the quorum lives in the config, not in the formatted
            # log, so a data dir can be reused on other ports.
            "controller.quorum.voters": f"{_NODE_ID}@{LOOPBACK}:{self._controller_port}",
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self._port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "data"),
            # A single node can't meet the replication defaults (3, min ISR 2);
            # without these, groups and InitProducerId never get their topics.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Start-up and first-use speed: 50 partitions each by default.
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            "num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # After a SIGKILL the restarted node is refused registration
            # (DUPLICATE_BROKER_REGISTRATION) until its old session expires:
            # 9 s by default, ~3 s with these.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # A pre-committed transaction must outlive a crash and the restart
            # that commits it; 1 h as Flink recommends (default cap is 15 min).
            "transaction.max.timeout.ms": "3600000",
            # The cleaner's 128 MiB dedupe buffer would take a quarter of the heap.
            "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        }
        if self._secure:
            ports = self._secure_ports
            extra = ",".join(f"{p}://{LOOPBACK}:{ports[p]}" for p in SECURE_PROTOCOLS)
            props["listeners"] += "," + extra
            props["advertised.listeners"] += "," + extra
            props["listener.security.protocol.map"] += "," + ",".join(
                f"{p}:{p}" for p in SECURE_PROTOCOLS
            )
            props.update(listener_properties(self.certificates))
        props.update(self._properties)
        return props

    def _write_config(self) -> None:
        (self.data_dir / "logs").mkdir(exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in self._server_properties().items())
        (self.data_dir / "server.properties").write_text(text)
        (self.data_dir / "log4j2.xml").write_text(_LOG4J2_XML)

    def _jvm_base(self, java: str, libs: Path) -> list[str]:
        return [
            java,
            f"-Xmx{self._heap}",
            *self._jvm_options,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{libs}/*",
        ]

    def _format(self, java: str, libs: Path) -> None:
        if (self.data_dir / "data" / "meta.properties").exists():
            return
        cmd = [
            *self._jvm_base(java, libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            random_cluster_id(),
            "-c",
            str(self.data_dir / "server.properties"),
            *(scram_format_args() if self._secure else ()),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            out = _tail(proc.stdout + proc.stderr, 15)
            raise ConnectorError(
                f"kafka StorageTool format failed (exit {proc.returncode}):\n{out}"
            )

    def _launch(self, java: str, libs: Path) -> None:
        cmd = [*self._jvm_base(java, libs), "kafka.Kafka", str(self.data_dir / "server.properties")]
        tie_to_parent = not self._detach and threading.current_thread() is threading.main_thread()
        setpriv = shutil.which("setpriv")
        if tie_to_parent and setpriv is not None:
            # PDEATHSIG fires when the forking *thread* exits, hence main thread only.
            cmd = [setpriv, "--pdeathsig", "TERM", *cmd]
        with (self.data_dir / "logs" / "jvm.out").open("ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=self._detach,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        last_error = "no answer yet"
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise ConnectorError(
                    f"Kafka broker exited during start-up (exit {code}): {self._first_error()}"
                    f"\n{self.log_tail()}"
                )
            try:
                if metadata_broker_count(LOOPBACK, self.port, timeout_s=2.0) > 0:
                    return
                last_error = "metadata lists no live broker yet"
            except OSError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"Kafka broker not ready on {self.bootstrap_servers} after "
                    f"{self._start_timeout_s:.0f}s ({last_error}):\n{self.log_tail()}",
                    retriable=True,
                )
            time.sleep(0.1)


def _tail(text: str, lines: int) -> str:
    """Return the last ``lines`` lines without Java stack frames, which bury the cause."""
    kept = [ln for ln in text.strip().splitlines() if not ln.lstrip().startswith("at ")]
    return "\n".join(kept[-lines:])
