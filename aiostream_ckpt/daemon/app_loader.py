"""Loading an app module and building its job.

An app is a Python module (``apps.pv_count``) or file (``apps/pv_count.py``)
with a function ``build(env: StreamEnvironment) -> None`` that adds sources,
operators and sinks to ``env``. Import and build errors become
:class:`AppLoadError`s naming the module and the cause, with the app's
traceback (its own frames) as their ``detail``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from aiostream_ckpt.api.environment import StreamEnvironment
from aiostream_ckpt.errors import AiostreamError, AppLoadError
from aiostream_ckpt.user_errors import user_traceback


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec


def app_name(spec: str) -> str:
    """Name a job after its module's last part (``apps/pv_count.py`` -> ``pv_count``)."""
    return Path(spec).stem if _is_file(spec) else spec.rsplit(".", 1)[-1]


def import_app(spec: str) -> ModuleType:
    try:
        if _is_file(spec):
            path = Path(spec)
            if not path.is_file():
                raise AppLoadError(f"app file not found: {spec}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            if mod_spec is None or mod_spec.loader is None:
                raise AppLoadError(f"cannot load app file {spec}")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[path.stem] = module
            mod_spec.loader.exec_module(module)
            return module
        if str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        return importlib.import_module(spec)
    except AppLoadError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if spec == missing or spec.startswith(missing + "."):
            raise AppLoadError(_not_found(spec, missing)) from exc
        raise AppLoadError(
            f"cannot import app module {spec!r}: ModuleNotFoundError: {exc} (the app imports "
            f"it; it is not installed in the Python running the daemon, {sys.executable})",
            detail=user_traceback(exc),
        ) from exc
    except Exception as exc:  # any import-time error is the app's: its line, then the cause
        raise AppLoadError(
            f"cannot import app module {spec!r}: {type(exc).__name__}: {exc}",
            detail=user_traceback(exc),
        ) from exc


def _not_found(spec: str, missing: str) -> str:
    """Say where an app module was looked for, and what is there instead."""
    package, _, _ = missing.rpartition(".")
    if package:
        found = importlib.util.find_spec(package)
        places = list(found.submodule_search_locations or []) if found else []
        there = sorted(p.stem for d in places for p in Path(d).glob("*.py") if p.stem != "__init__")
        return (
            f"cannot import app module {spec!r}: package {package!r} ({', '.join(places)}) "
            f"has no module {missing.rpartition('.')[2]!r}"
            + (f"; it has: {', '.join(there)}" if there else "")
        )
    return (
        f"cannot import app module {spec!r}: no module {missing!r} in the current directory "
        f"({Path.cwd()}) or on the Python path. App modules are imported by name from the "
        f"directory you run in (and PYTHONPATH); run from the directory that holds "
        f"{missing!r}, or give the app's file path (e.g. {spec.replace('.', '/')}.py)"
    )


def build_app(spec: str, env: StreamEnvironment) -> None:
    module = import_app(spec)
    build = getattr(module, "build", None)
    if not callable(build):
        raise AppLoadError(f"app module {spec!r} has no build(env) function")
    try:
        build(env)
    except AiostreamError:
        raise
    except Exception as exc:
        raise AppLoadError(
            f"app module {spec!r}: build(env) failed: {type(exc).__name__}: {exc}",
            detail=user_traceback(exc),
        ) from exc
