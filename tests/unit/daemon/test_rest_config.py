"""REST and shutdown settings: loopback by default, no unauthenticated non-loopback bind."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiostream_ckpt.daemon.config import load_config
from aiostream_ckpt.daemon.settings import ShutdownMode, is_loopback
from aiostream_ckpt.errors import ConfigError
from tests.helpers import cli


def test_defaults() -> None:
    d = load_config(env={}).daemon
    assert (d.rest_enabled, d.rest_bind, d.rest_port, d.rest_token) == (
        True,
        "127.0.0.1",
        8081,
        None,
    )
    assert d.shutdown_mode is ShutdownMode.CANCEL and d.savepoint_dir is None


def test_layers_and_token_from_env(tmp_path: Path) -> None:
    toml = tmp_path / "d.toml"
    toml.write_text(
        '[rest]\nport = 9000\n[savepoint]\ndir = "/sp"\n[shutdown]\nmode = "savepoint"\n'
    )
    d = load_config(
        toml, env={"AIOSTREAM_REST__TOKEN": "abc"}, sets=["rest.bind=0.0.0.0", "rest.port=0"]
    ).daemon
    assert (d.rest_bind, d.rest_port, d.rest_token) == ("0.0.0.0", 0, "abc")
    assert d.savepoint_dir == Path("/sp") and d.shutdown_mode is ShutdownMode.SAVEPOINT


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.168.1.5", "example.org"])
def test_non_loopback_bind_without_token_is_refused(bind: str) -> None:
    with pytest.raises(ConfigError, match=r"not a loopback address and no rest\.token"):
        load_config(env={}, sets=[f"rest.bind={bind}"])


def test_non_loopback_bind_is_fine_with_a_token_or_rest_disabled() -> None:
    load_config(env={"AIOSTREAM_REST__TOKEN": "x"}, sets=["rest.bind=0.0.0.0"])
    load_config(env={}, sets=["rest.bind=0.0.0.0", "rest.enabled=false"])


def test_a_read_token_comes_from_env_and_must_differ_from_the_control_token() -> None:
    d = load_config(
        env={"AIOSTREAM_REST__TOKEN": "ctl", "AIOSTREAM_REST__READ_TOKEN": "scrape"},
        sets=["rest.bind=0.0.0.0"],
    ).daemon
    assert (d.rest_token, d.rest_read_token) == ("ctl", "scrape")
    with pytest.raises(ConfigError, match=r"read_token equals rest\.token"):
        load_config(env={"AIOSTREAM_REST__TOKEN": "x", "AIOSTREAM_REST__READ_TOKEN": "x"})


@pytest.mark.parametrize(
    ("key", "value", "must"),
    [
        ("rest.port", "70000", "0..65535"),
        ("rest.port", "x", "a port number"),
        ("shutdown.mode", "drain", "cancel, checkpoint, savepoint"),
        ("rest.enabled", "maybe", "true or false"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, must: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        load_config(env={}, sets=[f"{key}={value}"])
    assert must in str(err.value)


def test_loopback_detection() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "host.docker.internal"]))


def test_cli_refuses_non_loopback_bind_without_token(tmp_path: Path) -> None:
    r = cli(
        "run",
        "apps.pv_count",
        "--set",
        f"checkpoint.dir={tmp_path}",
        "--set",
        "rest.bind=0.0.0.0",
        env={"AIOSTREAM_REST__TOKEN": ""},
    )
    assert r.returncode == 2
    assert "rest.bind='0.0.0.0' is not a loopback address" in r.stderr.strip().splitlines()[-1]
