"""The daemon address file: what ``health`` connects to (issue 16, item 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiostream_ckpt.daemon import address
from aiostream_ckpt.daemon.client import daemon_address_file


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:9000"),
        ("0.0.0.0", "http://127.0.0.1:9000"),
        ("::", "http://[::1]:9000"),
        ("10.1.2.3", "http://10.1.2.3:9000"),
    ],
)
def test_a_wildcard_bind_is_reached_on_loopback(host: str, url: str) -> None:
    assert address.DaemonAddress(pid=1, rest_enabled=True, host=host, port=9000).url == url


def test_publish_read_withdraw(tmp_path: Path) -> None:
    path = tmp_path / "c" / "daemon.json"
    me = address.DaemonAddress(pid=os.getpid(), rest_enabled=False)
    address.publish(path, me)
    assert address.read(path) == me and me.url is None
    address.withdraw(path, pid=os.getpid() + 1)  # another daemon's: kept
    assert path.exists()
    address.withdraw(path, pid=os.getpid())
    assert not path.exists()


def test_liveness_needs_an_aiostream_process() -> None:
    assert not address.is_daemon_alive(os.getpid())  # pytest is not aiostream-ckpt
    assert not address.is_daemon_alive(2**22 + 12345)  # no such pid


def test_the_file_is_found_through_the_environment(tmp_path: Path) -> None:
    env = {"AIOSTREAM_CHECKPOINT__DIR": str(tmp_path / "ck")}
    assert daemon_address_file(env) == tmp_path / "ck" / "daemon.json"
    env["AIOSTREAM_REST__ADDRESS_FILE"] = str(tmp_path / "a.json")
    assert daemon_address_file(env) == tmp_path / "a.json"
    assert daemon_address_file({}) is None
