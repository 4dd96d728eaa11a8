"""``make test-container``: the image built and run by a real Docker engine.

Not part of ``make test``: these tests are collected only when
``AIOSTREAM_TEST_CONTAINER=1`` (what the make target sets). With no engine
reachable (``docker info`` fails) the session says so and exits 0: a machine
without Docker cannot run them, which is not a failure of the project.
The engine is the one ``docker`` reaches (``DOCKER_HOST``, ``DOCKER_CONFIG``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.helpers import REPO

ENABLED = os.environ.get("AIOSTREAM_TEST_CONTAINER") == "1"
collect_ignore_glob = [] if ENABLED else ["test_*.py"]


def engine_unreachable() -> str | None:
    """Why no Docker engine can be used here, or None when one answers."""
    if shutil.which("docker") is None:
        return "no docker command on PATH"
    r = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["docker info failed"])[-1]
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not ENABLED:
        return
    why = engine_unreachable()
    if why is not None:
        print(f"\ntest-container: no Docker engine reachable ({why}): container checks not run")
        pytest.exit("no Docker engine reachable", returncode=0)


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """Build the image from the working tree once per session."""
    tag = f"aiostream-ckpt:test-{uuid.uuid4().hex[:8]}"
    # --network host: engines without a default bridge (rootless, this CI) still build
    r = subprocess.run(
        ["docker", "build", "--network", "host", "-t", tag, str(REPO)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, f"docker build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


@pytest.fixture
def volume() -> Iterator[str]:
    """A fresh named volume for the state (initialised from the image, owned by its user)."""
    name = f"aiostream-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "volume", "create", name], check=True, capture_output=True)
    yield name
    subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True, timeout=60)
