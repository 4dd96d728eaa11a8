"""The broker's classpath: ``kafka_2.13`` and its runtime dependencies, resolved with Maven once.

Debian ships no Kafka, so we resolve ``kafka_2.13`` and its runtime
dependencies with Maven into a cache outside the repo, once. The POM leaves
out a logging binding (Kafka adds it only to the release tarball), so we add
``log4j-slf4j-impl`` and ``log4j-core``. Without them the broker logs nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from aiostream_ckpt.errors import ConnectorError
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

_STAMP = ".complete"

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
