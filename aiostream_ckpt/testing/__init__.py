"""A testing kit for app authors.

Public kit (like Flink's operator test harnesses and ``bytewax.testing``):

- :class:`ScriptedSource` with :class:`Watermark` and :class:`Fail` markers:
  records, watermarks between them, failures at a position;
- :class:`CollectingSinks` / :func:`run_job`: run a whole job in-process on the
  real checkpoint and restart path and read what each output (side outputs
  included) committed;
- :class:`KeyedFunctionHarness`: one ``KeyedProcessFunction`` driven record by
  record, with explicit watermarks, a manual processing-time clock, state
  access and snapshot/restore.

The project's own harnesses (kill -9 loops, recount, ``make chaos``) live in
the dev tooling, ``aiostream_ckpt_dev``.
"""

from aiostream_ckpt.testing.harness import HarnessSnapshot, KeyedFunctionHarness
from aiostream_ckpt.testing.jobs import CollectingSinks, JobOutputs, run_job, run_job_async
from aiostream_ckpt.testing.scripted import (
    Checkpoint,
    Fail,
    InjectedFailure,
    ScriptedSource,
    Watermark,
)

__all__ = [
    "Checkpoint",
    "CollectingSinks",
    "Fail",
    "HarnessSnapshot",
    "InjectedFailure",
    "JobOutputs",
    "KeyedFunctionHarness",
    "ScriptedSource",
    "Watermark",
    "run_job",
    "run_job_async",
]
