"""The CLI's dev tooling commands resolve, and the engine never imports the tooling."""

from __future__ import annotations

import importlib
import subprocess
import sys

from aiostream_ckpt.daemon.cli import TOOLING_COMMANDS
from tests.helpers import REPO


def test_every_tooling_command_names_a_function() -> None:
    assert set(TOOLING_COMMANDS) == {"broker", "chaos", "demo", "demo-kafka", "validate"}
    for name, target in TOOLING_COMMANDS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_no_engine_module_imports_the_tooling() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import aiostream_ckpt\n"
        "for m in pkgutil.walk_packages(aiostream_ckpt.__path__, 'aiostream_ckpt.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('aiostream_ckpt_dev')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_an_install_without_the_tooling_says_so() -> None:
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'aiostream_ckpt_dev':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from aiostream_ckpt.daemon.cli import main\n"
        "sys.exit(main(['demo', '--help']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        "aiostream-ckpt: error: 'demo' is dev tooling (package aiostream_ckpt_dev), which this "
        "install lacks; reinstall the project (make setup)"
    ]
