"""The image as ops run it: health, stop and resume, kill -9, read-only root, exposed REST.

Each test runs containers of the image built from the working tree (see
``conftest.py``) on a fresh named volume and removes them afterwards. Waits
poll the engine for an outcome (a log line, a health status, an exit) with a
deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import check_pv_output, generated_counts

pytestmark = pytest.mark.integration

VOLUME = "/var/lib/aiostream"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


class Container:
    def __init__(self, name: str) -> None:
        self.name = name

    def logs(self) -> str:
        r = docker("logs", self.name)
        return r.stdout + r.stderr

    def state(self, field: str) -> str:
        return docker("inspect", "-f", "{{" + field + "}}", self.name).stdout.strip()

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {what} within {timeout}s:\n{self.logs()[-3000:]}"
                )
            time.sleep(0.2)

    def wait_for_log(self, text: str, timeout: float = 120) -> None:
        self.wait_until(repr(text), lambda: text in self.logs(), timeout)

    def wait_healthy(self, timeout: float = 120) -> None:
        self.wait_until(
            "healthy status", lambda: self.state(".State.Health.Status") == "healthy", timeout
        )

    def wait_exit(self, timeout: float = 300) -> int:
        self.wait_until("exit", lambda: self.state(".State.Running") == "false", timeout)
        return int(self.state(".State.ExitCode"))


@pytest.fixture
def run_container(image: str, volume: str) -> Iterator[Callable[..., Container]]:
    names: list[str] = []

    def run(*args: str, options: tuple[str, ...] = ()) -> Container:
        name = f"aiostream-test-{uuid.uuid4().hex[:8]}"
        r = docker(
            "run", "-d", "--name", name, "--network", "none", "-v", f"{volume}:{VOLUME}",
            "--health-interval", "2s", *options, image, *args,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        names.append(name)
        return Container(name)

    yield run
    for name in names:
        docker("rm", "-f", name)


def test_health_stop_with_final_checkpoint_start_resumes(
    run_container: Callable[..., Container],
) -> None:
    c = run_container()  # the default CMD: the embedded, paced pv_count
    c.wait_healthy()
    c.wait_for_log("checkpoint 2 completed")
    started = time.monotonic()
    assert docker("stop", "-t", "30", c.name).returncode == 0
    took = time.monotonic() - started
    assert c.state(".State.ExitCode") == "0", c.logs()[-3000:]
    assert took < 10, f"docker stop took {took:.1f}s: SIGTERM not handled"
    logs = c.logs()
    assert "shutdown: final checkpoint" in logs, logs[-3000:]
    final = int(logs.split("shutdown: final checkpoint ")[1].split()[0])
    assert docker("start", c.name).returncode == 0
    c.wait_for_log(f"restoring from checkpoint {final} ")
    c.wait_healthy()


def test_kill9_then_start_is_exactly_once(
    run_container: Callable[..., Container], volume: str, image: str, tmp_path: Path
) -> None:
    events, keys = 400_000, 200
    c = run_container(
        "run", "apps.pv_count",
        "--set", f"app.output={VOLUME}/output",
        "--set", f"app.generate={events}",
        "--set", f"app.keys={keys}",
        "--set", "app.rate=100000",
        "--set", "checkpoint.interval=200ms",
    )  # fmt: skip
    c.wait_for_log("checkpoint 3 completed")
    assert docker("kill", "-s", "KILL", c.name).returncode == 0
    assert c.wait_exit() == 137
    assert docker("start", c.name).returncode == 0
    assert c.wait_exit() == 0, c.logs()[-3000:]
    assert "restoring from checkpoint" in c.logs()
    out = tmp_path / "output"
    assert docker("cp", f"{c.name}:{VOLUME}/output", str(out)).returncode == 0
    check = check_pv_output(out, generated_counts(events, keys=keys))
    assert check.exact, check


def test_read_only_root(run_container: Callable[..., Container]) -> None:
    """Everything the daemon writes goes to the state volume."""
    c = run_container(
        "run", "apps.pv_count",
        "--set", f"app.output={VOLUME}/output",
        "--set", "app.generate=50000",
        options=("--read-only",),
    )  # fmt: skip
    assert c.wait_exit() == 0, c.logs()[-3000:]


def test_non_loopback_bind_needs_a_token(image: str, volume: str) -> None:
    r = docker(
        "run", "--rm", "--network", "none", "-v", f"{volume}:{VOLUME}",
        "-e", "AIOSTREAM_REST__BIND=0.0.0.0", image,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to expose job control unauthenticated" in r.stderr


def test_demo_runs_and_stops_in_the_image(
    run_container: Callable[..., Container], image: str
) -> None:
    r = docker("run", "--rm", "--network", "none", image, "demo", "--events", "300000",
               "--kills", "1", timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "spark check skipped" in r.stdout
    assert "exactly-once verified: 300000 events" in r.stdout
    c = run_container("demo", "--events", "3000000")
    c.wait_for_log("running pv_count")
    started = time.monotonic()
    assert docker("stop", "-t", "30", c.name).returncode == 0
    assert time.monotonic() - started < 10, "the demo as PID 1 ignored SIGTERM"
    assert c.state(".State.ExitCode") == "143"
