"""The validator's SparkSession: its driver JVM runs with the quick-start options."""

from __future__ import annotations

from typing import Any

import pytest

from aiostream_ckpt_dev.maven import QUICK_START_JVM_OPTIONS

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_driver_jvm_runs_with_the_quick_start_options(spark: Any) -> None:
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert set(QUICK_START_JVM_OPTIONS) <= set(runtime.getInputArguments())
