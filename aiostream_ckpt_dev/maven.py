"""Fetching jars from Maven Central once, into a cache outside the repo.

The Kafka broker and Spark's Kafka source both come as Maven artifacts: a
small generated pom plus ``dependency:copy-dependencies`` gives a classpath.
This module holds what both need: where the cache is, a lock so concurrent
callers (parallel test sessions, the CLI) run Maven once, and the Maven call.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from aiostream_ckpt.errors import ConfigError

#: Maven 3.8's default dependency plugin (2.8) is too old for these poms.
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"


def cache_root() -> Path:
    """Return ``$AIOSTREAM_CACHE_DIR`` or ``~/.cache/aiostream-ckpt``."""
    env = os.environ.get("AIOSTREAM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "aiostream-ckpt"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing)."""
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def find_mvn(purpose: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(f"Maven ('mvn') not found on PATH; it is needed once to fetch {purpose}")
    return mvn


def copy_dependencies(
    pom: Path, out: Path, *, settings: Path | None = None, refresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``copy-dependencies`` (runtime scope) of ``pom`` into ``out``."""
    cmd = [find_mvn("the jars"), "-q", "-B"]
    if refresh:
        cmd.append("-U")  # a "not found" cached by an earlier failed resolution must not stick
    if settings is not None:
        cmd += ["-s", str(settings)]
    cmd += [
        "-f",
        str(pom),
        f"org.apache.maven.plugins:maven-dependency-plugin:{DEPENDENCY_PLUGIN_VERSION}"
        ":copy-dependencies",
        f"-DoutputDirectory={out}",
        "-DincludeScope=runtime",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)
