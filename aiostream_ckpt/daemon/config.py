"""Loading the job configuration: defaults < TOML file < ``AIOSTREAM_*`` env < ``--set``.

Keys are dotted (``checkpoint.interval``). In TOML they are tables::

    [job]
    name = "pv_count"
    parallelism = 2

    [checkpoint]
    dir = "/var/lib/aiostream/pv"
    interval = "1s"

    [app]          # free-form: handed to the app as env.params
    input = "events.jsonl"

In the environment, ``AIOSTREAM_CHECKPOINT__INTERVAL=500ms`` (double
underscore between table and key). On the command line,
``--set checkpoint.interval=500ms``. Durations take ``ms``/``s``/``m``/``h``
suffixes or plain seconds. An unknown key is an error, so a typo never
silently leaves a default in place.

Daemon keys (``rest.*``, ``savepoint.dir``, ``shutdown.mode``, ``process.*``) are described
in :mod:`aiostream_ckpt.daemon.settings`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from aiostream_ckpt.connectors.kafka.security import KafkaSecurity
from aiostream_ckpt.daemon.settings import (
    DAEMON_KEYS,
    DaemonSettings,
    parse_bool,
    parse_daemon_key,
)
from aiostream_ckpt.durations import parse_duration
from aiostream_ckpt.errors import ConfigError
from aiostream_ckpt.jobspec.config import (
    CheckpointConfig,
    CheckpointingMode,
    ErrorConfig,
    JobConfig,
    MalformedPolicy,
    ProcessErrorPolicy,
    RestartConfig,
    RestartStrategyKind,
    StateConfig,
)
from aiostream_ckpt.keygroups import Shard
from aiostream_ckpt.objectstore import ObjectLocation, S3Settings, is_object_url

ENV_PREFIX = "AIOSTREAM_"


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("an integer")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).replace("_", ""))
    except ValueError:
        raise ValueError("an integer") from None


def _parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a number")
    try:
        return float(value)
    except (ValueError, TypeError):
        raise ValueError("a number") from None


def _enum(kind: type[Enum]) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        try:
            return kind(str(value).strip().lower().replace("-", "_"))
        except ValueError:
            choices = ", ".join(str(m.value) for m in kind)
            raise ValueError(f"one of {choices}") from None

    return parse


def _path(value: Any) -> Path:
    return Path(str(value)).expanduser()


def _protocol(value: Any) -> str:
    return str(value).strip().upper().replace("-", "_")  # sasl-ssl -> SASL_SSL


def _mechanism(value: Any) -> str:
    return str(value).strip().upper().replace("_", "-")  # scram_sha_512 -> SCRAM-SHA-512


def _checkpoint_dir(value: Any) -> Path | ObjectLocation:
    """Parse a local directory, or ``s3://bucket/prefix`` (see ``_resolve_checkpoint_dir``)."""
    if is_object_url(value):
        return ObjectLocation.parse(str(value), "checkpoint.dir")
    return _path(value)


def _optional_str(value: Any) -> str | None:
    return str(value) or None


def default_local_copy(location: ObjectLocation) -> Path:
    """Where an object-store ``checkpoint.dir`` is copied locally by default (temp dir)."""
    import tempfile

    return Path(tempfile.gettempdir()) / "aiostream-ckpt" / location.bucket / location.prefix


# key -> (section attribute or None for top level, field name, parser)
_SCHEMA: dict[str, tuple[str | None, str, Callable[[Any], Any]]] = {
    "job.parallelism": (None, "parallelism", _parse_int),
    "job.workers": (None, "workers", _parse_int),
    "job.worker_start_timeout": (None, "worker_start_timeout", parse_duration),
    "job.worker_restore_timeout": (None, "worker_restore_timeout", parse_duration),
    "job.heartbeat_interval": (None, "heartbeat_interval", parse_duration),
    "job.heartbeat_timeout": (None, "heartbeat_timeout", parse_duration),
    "job.max_parallelism": (None, "max_parallelism", _parse_int),
    "job.shard": (None, "shard", Shard.parse),
    "job.batch_size": (None, "batch_size", _parse_int),
    "job.channel_capacity": (None, "channel_capacity", _parse_int),
    "job.chaining": (None, "chaining", parse_bool),
    "job.restore_from": (None, "restore_from", _path),
    "job.allow_non_restored_state": (None, "allow_non_restored_state", parse_bool),
    "job.allow_retract_output": (None, "allow_retract_output", parse_bool),
    "job.allow_duplicate_output": (None, "allow_duplicate_output", parse_bool),
    "checkpoint.dir": ("checkpoint", "directory", _checkpoint_dir),
    "checkpoint.local_dir": ("checkpoint", "local_dir", _path),
    "checkpoint.interval": ("checkpoint", "interval", parse_duration),
    "checkpoint.timeout": ("checkpoint", "timeout", parse_duration),
    "checkpoint.max_concurrent": ("checkpoint", "max_concurrent", _parse_int),
    "checkpoint.min_pause": ("checkpoint", "min_pause", parse_duration),
    "checkpoint.tolerable_failures": ("checkpoint", "tolerable_failures", _parse_int),
    "checkpoint.retained": ("checkpoint", "retained", _parse_int),
    "checkpoint.mode": ("checkpoint", "mode", _enum(CheckpointingMode)),
    "checkpoint.full_every": ("checkpoint", "full_every", _parse_int),
    "checkpoint.max_delta_ratio": ("checkpoint", "max_delta_ratio", _parse_float),
    "checkpoint.alignment_max_buffered_batches": (
        "checkpoint",
        "alignment_max_buffered_batches",
        _parse_int,
    ),
    "checkpoint.unaligned": ("checkpoint", "unaligned", parse_bool),
    "checkpoint.aligned_timeout": ("checkpoint", "aligned_timeout", parse_duration),
    "s3.endpoint_url": ("s3", "endpoint_url", _optional_str),
    "s3.region": ("s3", "region", _optional_str),
    "s3.profile": ("s3", "profile", _optional_str),
    "s3.max_attempts": ("s3", "max_attempts", _parse_int),
    "s3.addressing_style": ("s3", "addressing_style", str),
    "state.local_dir": ("state", "local_dir", _path),
    "state.cache_max_entries": ("state", "cache_max_entries", _parse_int),
    "state.allow_pickle": ("state", "allow_pickle", parse_bool),
    "restart.strategy": ("restart", "strategy", _enum(RestartStrategyKind)),
    "restart.attempts": ("restart", "attempts", _parse_int),
    "restart.delay": ("restart", "delay", parse_duration),
    "restart.max_delay": ("restart", "max_delay", parse_duration),
    "restart.backoff_multiplier": ("restart", "backoff_multiplier", _parse_float),
    "restart.reset_after": ("restart", "reset_after", parse_duration),
    "restart.failure_rate_interval": ("restart", "failure_rate_interval", parse_duration),
    "errors.on_malformed": ("errors", "on_malformed", _enum(MalformedPolicy)),
    "errors.dead_letter_dir": ("errors", "dead_letter_dir", _path),
    "errors.on_process_error": ("errors", "on_process_error", _enum(ProcessErrorPolicy)),
    "errors.max_process_errors_per_checkpoint": (
        "errors",
        "max_process_errors_per_checkpoint",
        _parse_int,
    ),
    "kafka.security_protocol": ("kafka", "security_protocol", _protocol),
    "kafka.sasl_mechanism": ("kafka", "sasl_mechanism", _mechanism),
    "kafka.sasl_username": ("kafka", "sasl_username", str),
    "kafka.sasl_password": ("kafka", "sasl_password", str),
    "kafka.sasl_password_file": ("kafka", "sasl_password_file", _path),
    "kafka.ssl_cafile": ("kafka", "ssl_cafile", _path),
    "kafka.ssl_certfile": ("kafka", "ssl_certfile", _path),
    "kafka.ssl_keyfile": ("kafka", "ssl_keyfile", _path),
    "kafka.ssl_key_password_file": ("kafka", "ssl_key_password_file", _path),
    "kafka.ssl_check_hostname": ("kafka", "ssl_check_hostname", parse_bool),
}
#: keys whose values are never shown (``--print-config``, errors): secrets
SECRET_KEYS = frozenset({"kafka.sasl_password"})
_OTHER_KEYS = {"job.name": str, "log.format": str, "log.level": str, "progress.interval": str}
#: the app's own parameters: any ``app.<name>``
APP_KEYS = "app.*"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_SECTIONS = {
    "checkpoint": CheckpointConfig,
    "state": StateConfig,
    "restart": RestartConfig,
    "errors": ErrorConfig,
    "kafka": KafkaSecurity,
    "s3": S3Settings,
}


def schema_defaults() -> dict[str, Any]:
    """Every config key with its built-in default (``None``: unset), from the schema itself.

    The README's config table is generated from this (``aiostream-ckpt
    config-reference``), so a key cannot be added without showing up there.
    """
    job, daemon, loaded = JobConfig(), DaemonSettings(), LoadedConfig(job=JobConfig())
    out: dict[str, Any] = {}
    for key, (section, name, _) in _SCHEMA.items():
        out[key] = getattr(job if section is None else getattr(job, section), name)
    for key, (name, _) in DAEMON_KEYS.items():
        out[key] = getattr(daemon, name)
    out["job.name"] = loaded.job_name
    out["log.format"] = loaded.log_format
    out["log.level"] = loaded.log_level
    out["progress.interval"] = loaded.progress_interval
    out[APP_KEYS] = None
    return out


def is_duration_key(key: str) -> bool:
    return key == "progress.interval" or (key in _SCHEMA and _SCHEMA[key][2] is parse_duration)


@dataclass
class LoadedConfig:
    job: JobConfig
    params: dict[str, Any] = field(default_factory=dict)
    job_name: str | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    #: seconds between progress lines on stderr (0: none); ``--progress`` wins
    progress_interval: float = 0.0
    #: where each key's value came from, for error messages and `--print-config`
    sources: dict[str, str] = field(default_factory=dict)
    #: REST, savepoint directory, SIGTERM mode (``rest.*``, ``savepoint.*``, ``shutdown.*``)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not key.startswith("app."):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, dict) and key == "app":
            out.update(_flatten(v, "app."))
        else:
            out[key] = v
    return out


def load_config(
    toml_path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    sets: Sequence[str] = (),
    base: JobConfig | None = None,
) -> LoadedConfig:
    """Merge the layers and validate; raises :class:`ConfigError` naming key and source."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if toml_path is not None:
        try:
            with open(toml_path, "rb") as f:
                layers.append((str(toml_path), _flatten(tomllib.load(f))))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {toml_path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {toml_path} is not valid TOML: {exc}") from None
    env_layer: dict[str, Any] = {}
    for name, value in (env or {}).items():
        if name.startswith(ENV_PREFIX) and "__" in name:
            section, _, key = name[len(ENV_PREFIX) :].partition("__")
            env_layer[f"{section.lower()}.{key.lower()}"] = value
    layers.append(("environment", env_layer))
    set_layer: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        set_layer[key.strip()] = value
    layers.append(("--set", set_layer))

    merged: dict[str, tuple[Any, str]] = {}
    for origin, layer in layers:
        for key, value in layer.items():
            merged[key] = (value, origin)
    return _build(merged, base or JobConfig())


def _resolve_checkpoint_dir(values: dict[str, Any], base: JobConfig) -> None:
    """Split ``checkpoint.dir``: a local path, or a location with a local copy."""
    local = values.get("local_dir")
    given = values.get("directory")
    if isinstance(given, ObjectLocation):
        values["remote"] = given
        values["directory"] = local or default_local_copy(given)
        return
    if local is not None and (given is not None or base.checkpoint.remote is None):
        raise ConfigError(
            "checkpoint.local_dir is the local copy of an object-store checkpoint.dir "
            "(s3://...); with a local checkpoint.dir it has no meaning"
        )
    if local is not None:
        values["directory"] = local
    elif given is not None:
        values["remote"] = None


def _build(merged: dict[str, tuple[Any, str]], base: JobConfig) -> LoadedConfig:
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    loaded = LoadedConfig(job=base)
    daemon: dict[str, Any] = {}
    for key, (raw, origin) in sorted(merged.items()):
        loaded.sources[key] = origin
        if key.startswith("app."):
            loaded.params[key[4:]] = raw
            continue
        if key in DAEMON_KEYS:
            name, value = parse_daemon_key(key, raw, origin)
            daemon[name] = value
            continue
        if key in _OTHER_KEYS:
            if key == "job.name":
                loaded.job_name = str(raw)
            elif key == "log.format":
                if str(raw) not in ("text", "json"):
                    raise ConfigError(f"invalid config log.format={raw!r} ({origin}): text or json")
                loaded.log_format = str(raw)
            elif key == "log.level":
                level = str(raw).strip().upper()
                if level not in _LOG_LEVELS:
                    raise ConfigError(
                        f"invalid config log.level={raw!r} ({origin}): one of "
                        + ", ".join(_LOG_LEVELS)
                    )
                loaded.log_level = level
            elif key == "progress.interval":
                try:
                    loaded.progress_interval = parse_duration(raw)
                except ValueError as exc:
                    msg = f"invalid config progress.interval={raw!r} (from {origin}): must be {exc}"
                    raise ConfigError(msg) from None
            continue
        spec = _SCHEMA.get(key)
        if spec is None:
            raise ConfigError(f"unknown config key {key!r} (from {origin})")
        section, name, parse = spec
        try:
            value = parse(raw)
        except (ValueError, TypeError) as exc:
            shown = "(secret)" if key in SECRET_KEYS else repr(raw)
            msg = f"invalid config {key}={shown} (from {origin}): must be {exc}"
            raise ConfigError(msg) from None
        if section is None:
            top[name] = value
        else:
            sections[section][name] = value
    _resolve_checkpoint_dir(sections["checkpoint"], base)
    replaced = {
        name: dataclasses.replace(getattr(base, name), **values)
        for name, values in sections.items()
        if values
    }
    loaded.job = dataclasses.replace(base, **top, **replaced).validate()
    loaded.daemon = DaemonSettings(**daemon).validate()
    return loaded
