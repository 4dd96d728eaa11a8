"""A real single-node Apache Kafka broker (KRaft), built from Maven Central jars.

Tests, CI, the demo and the bench need a broker that really runs transactions
and ``read_committed`` fetches. Fakes (Tansu and friends) drop the aborted
transactions list on Fetch, so they can't check exactly-once. Debian ships no
Kafka, so we resolve ``kafka_2.13`` and its runtime dependencies with Maven
into a cache outside the repo, once. Then we start ``kafka.Kafka`` as a
combined broker+controller node on free loopback ports.

The POM leaves out a logging binding (Kafka adds it only to the release
tarball), so we add ``log4j-slf4j-impl`` and ``log4j-core``. Without them
the broker logs nothing.

The API is synchronous on purpose: pytest session fixtures, the CLI and
scripts use it, and none of them should need an event loop.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.maven import (
    DEPENDENCY_PLUGIN_VERSION,
    cache_root,
    copy_dependencies,
    file_lock,
    find_mvn,
)

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# Kafka 4.1 builds against log4j2 2.24.3; the binding must be the SLF4J 1.x
# one (log4j-slf4j-impl, not -slf4j2-), because Kafka pins slf4j-api 1.7.36.
LOG4J_VERSION = "2.24.3"
# Maven 3.8's default dependency plugin (2.8) predates features we rely on.

_STAMP = ".complete"
_LOOPBACK = "127.0.0.1"
_NODE_ID = 1

_POM = f"""\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0
                             http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.aiostream-ckpt</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_VERSION}</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN_VERSION}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""

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


def ensure_kafka_jars(cache_dir: Path | None = None) -> Path:
    """Return a directory holding the broker's classpath, resolving it with Maven once.

    ``cache_dir`` defaults to ``cache_root()/kafka-<version>``; the jars go to
    its ``libs``. A stamp file is written only after Maven succeeded, so an
    interrupted download is redone. A file lock keeps two concurrent callers
    (parallel test sessions, CLI and tests) from both running Maven.
    """
    base = cache_dir if cache_dir is not None else cache_root() / f"kafka-{KAFKA_VERSION}"
    libs = base / "libs"
    stamp = libs / _STAMP
    if stamp.exists():
        return libs
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / ".lock"):
        if stamp.exists():  # another caller finished while we waited
            return libs
        find_mvn("the Kafka broker's jars")
        staging = base / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(libs, ignore_errors=True)
        staging.mkdir()
        pom = base / "pom.xml"
        pom.write_text(_POM)
        proc = copy_dependencies(pom, staging)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip().splitlines()
            tail = "\n".join(output[-25:])
            raise ConnectorError(
                f"mvn failed (exit {proc.returncode}) resolving kafka_{SCALA_VERSION}:"
                f"{KAFKA_VERSION}:\n{tail}",
                retriable=True,
            )
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if not any(j.startswith(f"kafka_{SCALA_VERSION}-") for j in jars):
            raise ConnectorError(f"mvn succeeded but {staging} holds no kafka_{SCALA_VERSION} jar")
        staging.rename(libs)
        stamp.write_text("\n".join(jars) + "\n")
    return libs


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
        s.bind((_LOOPBACK, 0))
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
        start_timeout_s: float = 90.0,
        detach: bool = False,
        libs_dir: Path | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self._dir = Path(data_dir) if data_dir is not None else None
        self._port = port
        self._controller_port = controller_port
        self._properties = dict(properties or {})
        self._heap = heap
        self._start_timeout_s = start_timeout_s
        self._detach = detach
        self._libs_dir = libs_dir
        self._proc: subprocess.Popen[bytes] | None = None

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
        return f"{_LOOPBACK}:{self.port}"

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
            f"PLAINTEXT://{_LOOPBACK}:{self._port},CONTROLLER://{_LOOPBACK}:{self._controller_port}"
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": str(_NODE_ID),
            # Static voters: the quorum lives in the config, not in the formatted
            # log, so a data dir can be reused on other ports.
            "controller.quorum.voters": f"{_NODE_ID}@{_LOOPBACK}:{self._controller_port}",
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://{_LOOPBACK}:{self._port}",
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
                if metadata_broker_count(_LOOPBACK, self.port, timeout_s=2.0) > 0:
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


def metadata_broker_count(host: str, port: int, *, timeout_s: float) -> int:
    """Send a Metadata v1 request for no topics and return how many brokers it lists.

    A raw socket instead of aiokafka keeps the readiness check free of an
    event loop. A KRaft broker answers only once it's unfenced; before that
    the listener accepts the connection but stays silent.
    """
    client_id = b"aiostream-ckpt-probe"
    # Request header v1: api_key=3 (Metadata), version 1, correlation id, client id.
    # Body: topics = empty array, meaning "no topics" (null would mean all).
    msg = struct.pack(">hhih", 3, 1, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(msg)) + msg)
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        body = recv_exactly(sock, size)
    correlation_id, n_brokers = struct.unpack_from(">ii", body)
    if correlation_id != 7:
        raise OSError(f"bad correlation id {correlation_id} in Metadata response")
    return int(n_brokers)


def _tail(text: str, lines: int) -> str:
    """Return the last ``lines`` lines without Java stack frames, which bury the cause."""
    kept = [ln for ln in text.strip().splitlines() if not ln.lstrip().startswith("at ")]
    return "\n".join(kept[-lines:])


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes of a Kafka response (a closed socket is an error)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


# -- CLI: aiostream-ckpt broker start|stop|status --------------------------


def _state_path() -> Path:
    return cache_root() / "broker" / "state.json"


def _read_state() -> dict[str, object] | None:
    try:
        state = json.loads(_state_path().read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like Java's server sockets, so TIME_WAIT leftovers don't count as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((_LOOPBACK, port))
        except OSError:
            return False
    return True


def _is_our_broker(pid: int, data_dir: str) -> bool:
    """Tell whether ``pid`` is still the broker we started (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and any(data_dir.encode() in arg for arg in cmdline)


def _running_state() -> dict[str, object] | None:
    state = _read_state()
    if state is None:
        return None
    pid, data_dir = state.get("pid"), state.get("data_dir")
    if isinstance(pid, int) and isinstance(data_dir, str) and _is_our_broker(pid, data_dir):
        return state
    return None


def broker_main(argv: list[str]) -> int:
    """Run ``aiostream-ckpt broker start|stop|status``; return the exit code.

    ``start`` runs a detached broker whose data and ports survive
    ``stop``/``start`` (``--fresh`` wipes the data). The state file (pid,
    bootstrap, log) lives in ``cache_root()/broker``. ``status`` exits 0 if
    running, 3 if not (the LSB convention).
    """
    parser = argparse.ArgumentParser(prog="aiostream-ckpt broker")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start a local Kafka broker in the background")
    p_start.add_argument("--port", type=int, help="broker port (default: a free one)")
    p_start.add_argument("--fresh", action="store_true", help="wipe topics and data first")
    p_start.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")
    sub.add_parser("stop", help="stop the background broker")
    sub.add_parser("status", help="print the bootstrap address if running")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return _cli_start(args.port, fresh=args.fresh, timeout_s=args.timeout)
        if args.command == "stop":
            return _cli_stop()
        return _cli_status()
    except (ConfigError, ConnectorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _cli_start(port: int | None, *, fresh: bool, timeout_s: float) -> int:
    running = _running_state()
    if running is not None:
        print(f"already running (pid {running['pid']})", file=sys.stderr)
        print(running["bootstrap_servers"])
        return 0
    data_dir = cache_root() / "broker" / "data"
    if fresh:
        shutil.rmtree(data_dir, ignore_errors=True)
    # Reuse the last ports when free, so clients configured for the previous
    # run find the broker again.
    last = _read_state() or {}
    last_port, last_controller = last.get("port"), last.get("controller_port")
    controller_port = None
    if (
        port is None
        and isinstance(last_port, int)
        and isinstance(last_controller, int)
        and _port_free(last_port)
        and _port_free(last_controller)
    ):
        port, controller_port = last_port, last_controller
    broker = KafkaBroker(
        data_dir,
        port=port,
        controller_port=controller_port,
        detach=True,
        start_timeout_s=timeout_s,
    )
    broker.start()
    state = {
        "pid": broker.pid,
        "bootstrap_servers": broker.bootstrap_servers,
        "port": broker.port,
        "controller_port": broker.controller_port,
        "data_dir": str(broker.data_dir),
        "log_path": str(broker.log_path),
        "kafka_version": KAFKA_VERSION,
    }
    tmp = _state_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_path())
    print(broker.bootstrap_servers)
    return 0


def _cli_stop(timeout_s: float = 30.0) -> int:
    state = _running_state()
    if state is None:
        print("not running", file=sys.stderr)
        return 0
    pid = state["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_our_broker(pid, str(state["data_dir"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_our_broker(pid, str(state["data_dir"])):
        os.kill(pid, signal.SIGKILL)
    print(f"stopped (pid {pid})", file=sys.stderr)
    return 0


def _cli_status() -> int:
    state = _running_state()
    if state is None:
        print("not running")
        return 3
    print(f"{state['bootstrap_servers']} (pid {state['pid']}, log {state['log_path']})")
    return 0


if __name__ == "__main__":
    sys.exit(broker_main(sys.argv[1:]))
