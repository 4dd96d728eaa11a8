"""Settings for every test tier, and how pytest-xdist splits them between workers."""

from __future__ import annotations

import os
from typing import Any

import pytest

# Every `aiostream-ckpt run` a test starts serves the REST API; on port 0 each
# picks a free port, so test sessions running side by side never collide on 8081.
os.environ.setdefault("AIOSTREAM_REST__PORT", "0")

#: The tests of the ``spark`` fixture (its conftest.py): one worker runs them all.
SPARK_TESTS = "tests/integration/validate/"


def xdist_scope(nodeid: str) -> str:
    """The unit of work of a test under ``--dist loadfile`` (``make test``).

    A file's tests run on one worker, so a module-scoped fixture (a run its
    tests all check) runs once. A process has one SparkSession (seconds of JVM
    start; the Kafka source is on its classpath or not), so all of Spark's
    tests are one unit. Session fixtures (the Kafka broker) start once per worker.
    """
    path = nodeid.split("::", 1)[0]
    return "spark" if path.startswith(SPARK_TESTS) else path


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with Spark's test files as one unit.

    Not ``--dist loadgroup`` and ``xdist_group`` marks: pytest-xdist 3.8 marks
    a group by rewriting the test's node id, which pytest 9.2 no longer reads
    (pytest-xdist issue 1386), so the groups are silently ignored.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkOnOneWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return SparkOnOneWorker(config, log)
