"""deploy/: the Kubernetes manifests and the systemd unit, linted and read as they would run.

The manifests validate against the Kubernetes API schemas (kubernetes-validate,
which ships them; strict: no unknown field), the rescale script passes
shellcheck, and the systemd template unit passes ``systemd-analyze verify``.
Then each is read as its runner would: pod ``aiostream-ckpt-1`` of the
StatefulSet and unit ``aiostream-ckpt@1`` give a daemon whose configuration
is shard 1 of 2 with its own checkpoint directory, and whose ``health`` probe
finds that shard's address file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from aiostream_ckpt.daemon.cli import _parser
from aiostream_ckpt.daemon.client import daemon_address_file
from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.keygroups import Shard
from tests.helpers import REPO

DEPLOY = REPO / "deploy"
MANIFEST = DEPLOY / "kubernetes" / "aiostream-ckpt.yaml"
UNIT = DEPLOY / "systemd" / "aiostream-ckpt@.service"
BIN = Path(sys.executable).parent


def _resources() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_the_manifests_validate_against_the_kubernetes_schemas() -> None:
    done = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", str(MANIFEST)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"passed for resource (\S+)", done.stdout)
    assert sorted(passed) == [
        "configmap/aiostream-ckpt-job",
        "persistentvolumeclaim/aiostream-ckpt-checkpoints",
        "service/aiostream-ckpt",
        "service/aiostream-ckpt-shards",
        "statefulset/aiostream-ckpt",
    ], done.stdout


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` references to variables defined before (others stay as written)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def test_pod_i_of_the_statefulset_runs_shard_i_of_its_replicas(tmp_path: Path) -> None:
    found = _resources()
    sts = found["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
        elif "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.labels['apps.kubernetes.io/pod-index']"
            env[var["name"]] = "1"  # pod aiostream-ckpt-1
        else:
            env[var["name"]] = f"secret-{var['valueFrom']['secretKeyRef']['key']}"
    assert env["AIOSTREAM_SHARDS"] == str(sts["spec"]["replicas"])
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # the config file from the ConfigMap, where the pod mounts it
    job = tmp_path / "job.toml"
    job.write_text(found["ConfigMap"]["data"]["job.toml"])
    args = container["args"]
    assert args[:2] == ["run", "apps.pv_count"] and args[2:] == [
        "--config",
        "/etc/aiostream-ckpt/job.toml",
    ]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["job"] == "/etc/aiostream-ckpt"
    aiostream = {k: v for k, v in env.items() if k.startswith("AIOSTREAM_")}
    loaded = load_config(job, env=aiostream)
    assert loaded.job.shard == Shard(1, 2)
    assert loaded.job.checkpoint_dir() == Path("/var/lib/aiostream/checkpoints/shard-1-of-2")
    assert str(loaded.job.checkpoint_dir()).startswith(mounts["checkpoints"])
    assert str(loaded.job.local_state_root()).startswith(mounts["local-state"])
    assert loaded.daemon.rest_bind == "0.0.0.0" and loaded.daemon.rest_token == "secret-token"
    assert loaded.daemon.shutdown_mode.value == "savepoint"
    # the probes run `aiostream-ckpt health` in the same environment: this shard's address
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["aiostream-ckpt", "health"]
    assert daemon_address_file(aiostream) == Path(
        "/var/lib/aiostream/checkpoints/shard-1-of-2/daemon.json"
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes["checkpoints"]["persistentVolumeClaim"]["claimName"]
    assert found["PersistentVolumeClaim"]["metadata"]["name"] == claim
    assert found["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "emptyDir" in volumes["local-state"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"rest": loaded.daemon.rest_port}


def test_the_rescale_script_passes_shellcheck() -> None:
    done = subprocess.run(
        [str(BIN / "shellcheck"), str(DEPLOY / "kubernetes" / "rescale.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _unit_here(tmp_path: Path) -> Path:
    """The unit with its two host paths moved here: the binary of this install, the env file."""
    text = UNIT.read_text()
    text = text.replace("/opt/aiostream-ckpt/bin/aiostream-ckpt", str(BIN / "aiostream-ckpt"))
    text = text.replace("/etc/aiostream-ckpt/job.env", str(DEPLOY / "systemd" / "job.env"))
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    return unit


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    unit = _unit_here(tmp_path)
    done = subprocess.run(
        [analyze, "verify", str(unit.with_name("aiostream-ckpt@0.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def test_unit_instance_i_runs_shard_i_of_n() -> None:
    """ExecStart as systemd expands it for aiostream-ckpt@1: ``%i`` and ``${VAR}``."""
    env = dict(
        line.split("=", 1)
        for line in (DEPLOY / "systemd" / "job.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    (exec_start,) = [ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart=")]
    command = exec_start.removeprefix("ExecStart=").replace("%i", "1")
    command = re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], command)
    argv = command.split()
    assert argv[0] == "/opt/aiostream-ckpt/bin/aiostream-ckpt"
    args = _parser().parse_args(argv[1:])
    assert args.command == "run" and args.module == "apps.pv_count"
    aiostream = {k: v for k, v in env.items() if k.startswith("AIOSTREAM_") and "__" in k}
    loaded = load_config(
        DEPLOY / "systemd" / "job.toml", env=aiostream, sets=[f"job.shard={args.shard}"]
    )
    assert loaded.job.shard == Shard(1, int(env["AIOSTREAM_SHARDS"]))
    assert loaded.job.checkpoint_dir() == Path("/var/lib/aiostream-ckpt/checkpoints/shard-1-of-2")
    assert loaded.daemon.rest_port == 0  # several shards on one host
    unit = UNIT.read_text()
    assert "RestartPreventExitStatus=2" in unit and "Restart=on-failure" in unit
    assert "ReadWritePaths=/var/lib/aiostream-ckpt" in unit
