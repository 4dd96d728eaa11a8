"""Peer virtualenvs under ``bench/.peers-venv/<name>``, created with pip on first use.

Each peer gets its own environment because their pins clash (PyFlink pins an
old Beam, Faust its own aiokafka); none of them is a project dependency. A
failed install is remembered with pip's own words, and reported as the reason
the peer did not run.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VENV_ROOT = BENCH_DIR / ".peers-venv"

#: What each environment installs: the peer at the version the issue names where it names one.
REQUIREMENTS: dict[str, list[str]] = {
    "bytewax": ["bytewax==0.21.1", "orjson"],
    "pyflink": ["apache-flink", "orjson"],
    "quixstreams": ["quixstreams", "orjson"],
    "faust": ["faust-streaming", "orjson"],
    "plot": ["matplotlib"],
}


@dataclass(frozen=True)
class PeerEnv:
    name: str
    python: Path | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.python is not None


def _base_python() -> str:
    # The venv's own interpreter would nest venvs; its base is the right one.
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_env(name: str, *, progress: bool = True) -> PeerEnv:
    """The environment for ``name``, creating and filling it if needed."""
    root = VENV_ROOT / name
    python = root / "bin" / "python"
    stamp = root / ".bench-installed"
    failed = root / ".bench-failed"
    want = "\n".join(REQUIREMENTS[name])
    if stamp.exists() and stamp.read_text() == want and python.exists():
        return PeerEnv(name, python)
    if failed.exists() and failed.read_text().startswith(want + "\n---\n"):
        return PeerEnv(name, None, failed.read_text().split("\n---\n", 1)[1])
    if progress:
        print(
            f"[bench] creating {root} (pip install {' '.join(REQUIREMENTS[name])})",
            file=sys.stderr,
            flush=True,
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        r = subprocess.run(
            [_base_python(), "-m", "venv", str(root)], capture_output=True, text=True, check=False
        )
        if r.returncode != 0:
            return _fail(failed, want, name, f"python -m venv failed: {r.stderr.strip()[-800:]}")
    r = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            *REQUIREMENTS[name],
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        text = (r.stderr or r.stdout).strip().splitlines()
        errors = [ln for ln in text if "error" in ln.lower()] or text
        return _fail(failed, want, name, "pip install failed: " + " | ".join(errors[-6:])[-800:])
    stamp.write_text(want)
    failed.unlink(missing_ok=True)
    return PeerEnv(name, python)


def _fail(failed: Path, want: str, name: str, reason: str) -> PeerEnv:
    failed.parent.mkdir(parents=True, exist_ok=True)
    failed.write_text(f"{want}\n---\n{reason}")
    return PeerEnv(name, None, reason)


def version_of(env: PeerEnv, dist: str) -> str | None:
    if env.python is None:
        return None
    r = subprocess.run(
        [str(env.python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() or None if r.returncode == 0 else None
