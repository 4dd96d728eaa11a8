"""Kafka's own command-line tools (``kafka-tools``), run from the broker's cached jars.

Tests check what the project writes with tools nobody here wrote: the console
consumer reads a topic ``read_committed`` as anyone would, and the consumer
group command shows a job's lag as operators see it (``kafka-consumer-groups.sh
--describe``). ``kafka-tools`` is fetched once without its dependencies: its
runtime needs are the broker's jars (clients, server-common, argparse4j).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from aiostream_ckpt.errors import ConnectorError
from aiostream_ckpt_dev.broker.jars import KAFKA_VERSION, ensure_kafka_jars
from aiostream_ckpt_dev.broker.process import java_executable
from aiostream_ckpt_dev.maven import (
    QUICK_START_JVM_OPTIONS,
    cache_root,
    copy_dependencies,
    file_lock,
)

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"

_TOOLS_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.aiostream-ckpt</groupId>
  <artifactId>kafka-tools-only</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>{version}</version>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>
    </dependency>
  </dependencies>
</project>
"""


def ensure_kafka_tools_jar() -> Path:
    """Return the ``kafka-tools`` jar of the broker's version, fetching it with Maven once."""
    base = cache_root() / f"kafka-tools-{KAFKA_VERSION}"
    jar = base / "jars" / f"kafka-tools-{KAFKA_VERSION}.jar"
    if jar.is_file():
        return jar
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / ".lock"):
        if not jar.is_file():
            (base / "pom.xml").write_text(_TOOLS_POM.format(version=KAFKA_VERSION))
            proc = copy_dependencies(base / "pom.xml", base / "jars")
            if proc.returncode != 0:
                output = (proc.stdout + proc.stderr)[-2000:]
                raise ConnectorError(f"mvn could not fetch kafka-tools:\n{output}", retriable=True)
    return jar


def run_kafka_tool(
    main_class: str, args: Sequence[str], *, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tools (``main_class``) with ``args``; its output, whatever its exit."""
    cp = f"{ensure_kafka_tools_jar()}:{ensure_kafka_jars()}/*"
    cmd = [java_executable(), *QUICK_START_JVM_OPTIONS, "-cp", cp, main_class, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
