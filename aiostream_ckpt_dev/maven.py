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

#: JVM options for the short-lived JVMs of the dev tooling (Maven, the broker
#: of a test session or demo, Kafka's console tools): the C1 compiler only and
#: the serial collector. C2's compiler threads and G1's concurrent threads cost
#: more CPU than they win back in such a JVM's life. Measured on 2 cores at load
#: ~15-20: a broker's start plus a 300k-event pv_count run 8.9-10.0 s of broker
#: CPU instead of 17.8-20.7 s; Maven resolving the broker's jars from a warm
#: ~/.m2 3.4-3.5 s instead of 6.7-7.3 s.
QUICK_START_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


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
    pom: Path,
    out: Path,
    *,
    settings: Path | None = None,
    refresh: bool = False,
    exclude_transitive: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``copy-dependencies`` (runtime scope) of ``pom`` into ``out``.

    ``exclude_transitive``: only the pom's own dependencies (Delta's jars
    without the Hadoop, Jackson and log4j that PySpark already ships).
    """
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
    if exclude_transitive:
        cmd.append("-DexcludeTransitive=true")
    # Options already in MAVEN_OPTS come later and win (a proxy, a bigger heap).
    opts = " ".join([*QUICK_START_JVM_OPTIONS, os.environ.get("MAVEN_OPTS", "")]).strip()
    env = {**os.environ, "MAVEN_OPTS": opts}
    return subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
