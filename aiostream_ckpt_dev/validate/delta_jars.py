"""Delta Lake for Spark, fetched once from Maven Central into a cache.

Spark reads Delta tables through ``delta-spark_<spark major.minor>_2.13``
and ``delta-storage``; PySpark ships neither. Only those two jars go on the
classpath (their transitive Hadoop, Jackson and log4j are PySpark's own), in
``spark.jars``, with no Ivy resolution at JVM start. Delta 4.3.1 is the
release built for Spark 4.1 (``delta-spark==4.3.1`` on PyPI pins
``pyspark<=4.1.1`` and asks for ``delta-spark_4.1_2.13``).
"""

from __future__ import annotations

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

DELTA_VERSION = "4.3.1"
_MANIFEST = "jars.txt"

#: Spark's SQL extension and catalog for Delta (``spark.read.format("delta")``, SQL, streaming).
DELTA_SPARK_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # a local table's log replay in one task, not 50
    "spark.databricks.delta.snapshotPartitions": "1",
}

_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.aiostream-ckpt</groupId>
  <artifactId>spark-delta-libs</artifactId>
  <version>{delta}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>io.delta</groupId>
      <artifactId>delta-spark_{spark}_2.13</artifactId>
      <version>{delta}</version>
    </dependency>
    <dependency>
      <groupId>io.delta</groupId>
      <artifactId>delta-storage</artifactId>
      <version>{delta}</version>
    </dependency>
  </dependencies>
</project>
"""

_SETTINGS = f"""\
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>central-for-all</id><mirrorOf>*</mirrorOf><url>{MAVEN_CENTRAL}</url></mirror>
  </mirrors>
</settings>
"""


def spark_delta_jars(spark_version: str | None = None, cache_dir: Path | None = None) -> list[Path]:
    """Return the two Delta jars for ``spark.jars``, fetching them once (file-locked)."""
    if spark_version is None:
        import pyspark

        spark_version = str(pyspark.__version__)
    minor = ".".join(spark_version.split(".")[:2])
    base = cache_dir if cache_dir is not None else cache_root() / f"spark-delta-{DELTA_VERSION}"
    cached = _read_manifest(base)
    if cached is not None:
        return cached
    base.mkdir(parents=True, exist_ok=True)
    with file_lock(base / ".lock"):
        cached = _read_manifest(base)
        if cached is not None:
            return cached
        return _fetch(base, minor)


def _read_manifest(base: Path) -> list[Path] | None:
    try:
        names = (base / _MANIFEST).read_text().split()
    except OSError:
        return None
    jars = [base / "jars" / n for n in names]
    return jars if jars and all(j.is_file() for j in jars) else None


def _fetch(base: Path, spark_minor: str) -> list[Path]:
    try:
        find_mvn("Delta Lake for Spark")
    except ConfigError as exc:
        raise ValidationConfigError(str(exc)) from None
    with tempfile.TemporaryDirectory(dir=base, prefix=".fetch-") as tmp:
        work = Path(tmp)
        (work / "settings.xml").write_text(_SETTINGS)
        (work / "pom.xml").write_text(_POM.format(delta=DELTA_VERSION, spark=spark_minor))
        staging = work / "jars"
        proc = copy_dependencies(
            work / "pom.xml",
            staging,
            settings=work / "settings.xml",
            refresh=True,
            exclude_transitive=True,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
            raise ValidationError(
                f"mvn failed (exit {proc.returncode}) fetching io.delta:delta-spark_"
                f"{spark_minor}_2.13:{DELTA_VERSION}:\n{tail}",
                retriable=True,
            )
        keep = sorted(p.name for p in staging.glob("*.jar"))
        if len(keep) != 2:
            raise ValidationError(f"mvn fetched {keep}, not delta-spark and delta-storage")
        final = base / "jars"
        shutil.rmtree(final, ignore_errors=True)
        final.mkdir()
        for name in keep:
            shutil.move(staging / name, final / name)
    (base / _MANIFEST).write_text("\n".join(keep) + "\n")
    return [final / n for n in keep]
