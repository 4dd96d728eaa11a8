"""The optional C loops of session windows (``aiostream_ckpt/runtime/windowing/_session_speedups.c``).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler
(the slim image's build stage) the package installs without it and runs the
same loops in Python (``aiostream_ckpt/runtime/windowing/session_fold.py``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aiostream_ckpt.runtime.windowing._session_speedups",
            ["aiostream_ckpt/runtime/windowing/_session_speedups.c"],
            optional=True,
        )
    ]
)
