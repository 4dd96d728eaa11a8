"""Spark's Kafka source, fetched once from Maven Central into a cache.

PySpark does not bundle ``spark-sql-kafka-0-10``. ``spark.jars.packages`` would
resolve it through Ivy at every JVM start; instead we resolve it once with
``mvn dependency:copy-dependencies`` into a cache outside the repo and pass the
jars in ``spark.jars``. Jars whose artifact PySpark already ships (scala-library,
lz4, snappy, slf4j, ...) are dropped, so the classpath has one copy of each.

Details found by trying: Spark's parent POM declares a Google Cloud mirror of
Central that is not reachable here, so the fetch uses a settings file that
mirrors every repository to Central; Maven 3.8's default dependency plugin is
2.8, so 3.x is pinned; and the Central we reach lacks
``spark-token-provider-kafka-0-10`` 4.0.1-4.1.1 (it has 4.0.0 and
4.1.0-preview1), so when the exact version is missing we pin that small
transitive dependency (config helpers for delegation tokens, unused on a
plaintext local broker) to the nearest version there and say so in the manifest.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt_dev.maven import (
    MAVEN_CENTRAL,
    cache_root,
    copy_dependencies,
    file_lock,
    find_mvn,
)
from aiostream_ckpt_dev.validate.errors import ValidationConfigError, ValidationError

_MANIFEST = "jars.txt"
_JAR_NAME = re.compile(r"(?P<artifact>.+?)-(?P<version>\d[^/]*)\.jar")

_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.aiostream-ckpt</groupId>
  <artifactId>spark-kafka-libs</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
{management}  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""

_TOKEN_PROVIDER = "spark-token-provider-kafka-0-10_2.13"
#: Tried in order when Central lacks the token provider at the exact version.
TOKEN_PROVIDER_FALLBACKS = ("4.1.0-preview1", "4.0.0")

_MANAGEMENT = f"""\
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.spark</groupId>
        <artifactId>{_TOKEN_PROVIDER}</artifactId>
        <version>{{version}}</version>
      </dependency>
    </dependencies>
  </dependencyManagement>
"""

_SETTINGS = f"""\
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror>
      <id>central-for-all</id>
      <mirrorOf>*</mirrorOf>
      <url>{MAVEN_CENTRAL}</url>
    </mirror>
  </mirrors>
</settings>
"""


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def artifact_of(jar_name: str) -> str | None:
    """Return the artifact id in a ``<artifact>-<version>.jar`` file name."""
    m = _JAR_NAME.fullmatch(jar_name)
    return m.group("artifact") if m else None


def spark_kafka_jars(spark_version: str | None = None, cache_dir: Path | None = None) -> list[Path]:
    """Return the jars to add to ``spark.jars`` for the Kafka source, fetching them once.

    The artifact version must equal the PySpark version exactly (Spark checks
    nothing, it just breaks at run time). A manifest is written only after a
    complete fetch, and a file lock keeps concurrent callers from both running
    Maven.
    """
    if spark_version is None:
        import pyspark

        spark_version = str(pyspark.__version__)
    base = cache_dir if cache_dir is not None else cache_root() / f"spark-kafka-{spark_version}"
    cached = _read_manifest(base)
    if cached is not None:
        return cached
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / ".lock"):
        cached = _read_manifest(base)
        if cached is not None:
            return cached
        return _fetch(base, spark_version)


def _read_manifest(base: Path) -> list[Path] | None:
    try:
        names = (base / _MANIFEST).read_text().split()
    except OSError:
        return None
    jars = [base / "jars" / n for n in names]
    return jars if jars and all(j.is_file() for j in jars) else None


def _fetch(base: Path, version: str) -> list[Path]:
    try:
        find_mvn("Spark's Kafka source")
    except ConfigError as exc:
        raise ValidationConfigError(str(exc)) from None
    shipped = {a for p in pyspark_jars_dir().glob("*.jar") if (a := artifact_of(p.name))}
    with tempfile.TemporaryDirectory(dir=base, prefix=".fetch-") as tmp:
        work = Path(tmp)
        (work / "settings.xml").write_text(_SETTINGS)
        staging = work / "jars"
        for pin in (None, *TOKEN_PROVIDER_FALLBACKS):
            management = "" if pin is None else _MANAGEMENT.format(version=pin)
            (work / "pom.xml").write_text(_POM.format(version=version, management=management))
            proc = copy_dependencies(
                work / "pom.xml", staging, settings=work / "settings.xml", refresh=True
            )
            if proc.returncode == 0:
                break
            output = proc.stdout + proc.stderr
            if f"Could not find artifact org.apache.spark:{_TOKEN_PROVIDER}" not in output:
                break
        if proc.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-20:])
            raise ValidationError(
                f"mvn failed (exit {proc.returncode}) fetching spark-sql-kafka-0-10_2.13:"
                f"{version}:\n{tail}",
                retriable=True,
            )
        keep = sorted(p.name for p in staging.glob("*.jar") if artifact_of(p.name) not in shipped)
        if not any(n.startswith(f"spark-sql-kafka-0-10_2.13-{version}.") for n in keep):
            raise ValidationError(f"mvn succeeded but fetched no spark-sql-kafka jar: {keep}")
        final = base / "jars"
        shutil.rmtree(final, ignore_errors=True)
        final.mkdir()
        for name in keep:
            shutil.move(staging / name, final / name)
    (base / _MANIFEST).write_text("\n".join(keep) + "\n")
    return [final / n for n in keep]
