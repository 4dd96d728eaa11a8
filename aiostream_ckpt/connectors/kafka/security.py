"""How a job's Kafka clients authenticate: TLS and SASL settings, secrets read late and never shown.

The daemon's ``kafka.*`` keys (``kafka.security_protocol``,
``kafka.sasl_mechanism``, ``kafka.sasl_username``, ``kafka.sasl_password`` /
``kafka.sasl_password_file``, ``kafka.ssl_cafile``, ``kafka.ssl_certfile``,
``kafka.ssl_keyfile``, ``kafka.ssl_key_password_file``,
``kafka.ssl_check_hostname``) make one :class:`KafkaSecurity` for every Kafka
source and sink of the job, the ``transactions`` command and the demo; a
source's ``consumer_config`` or a sink's ``producer_config`` still wins key by
key. Passwords come from the environment (``AIOSTREAM_KAFKA__SASL_PASSWORD``)
or a file, are read when a client is made, and appear in no ``repr``, log
line, error or REST answer (:meth:`KafkaSecurity.describe` is what may be
shown).

Apart from the clients (no aiokafka import): declaring a job checks the
settings in a process that never connects.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiostream_ckpt.errors import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _read_secret(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class KafkaSecurity:
    """TLS/SASL settings for aiokafka clients; see the module docstring."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    sasl_password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password_file: Path | None = None
    ssl_check_hostname: bool = True

    def validate(self) -> KafkaSecurity:
        """Check the settings fit together; ``ConfigError`` naming the key."""
        protocol = self.security_protocol
        if protocol not in PROTOCOLS:
            raise ConfigError(
                f"invalid config kafka.security_protocol={protocol!r}: "
                f"one of {', '.join(PROTOCOLS)}"
            )
        sasl = protocol.startswith("SASL_")
        if sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ConfigError(
                    f"kafka.security_protocol={protocol} needs kafka.sasl_mechanism: one of "
                    f"{', '.join(MECHANISMS)} (got {self.sasl_mechanism!r})"
                )
            if not self.sasl_username:
                raise ConfigError(f"kafka.security_protocol={protocol} needs kafka.sasl_username")
            if (self.sasl_password is None) == (self.sasl_password_file is None):
                raise ConfigError(
                    f"kafka.security_protocol={protocol} needs one of kafka.sasl_password "
                    "(e.g. from AIOSTREAM_KAFKA__SASL_PASSWORD) or kafka.sasl_password_file"
                )
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password_file:
            raise ConfigError(
                f"kafka.sasl_* settings need kafka.security_protocol SASL_SSL or SASL_PLAINTEXT "
                f"(it is {protocol})"
            )
        if not protocol.endswith("SSL") and (self.ssl_cafile or self.ssl_certfile):
            raise ConfigError(
                "kafka.ssl_* settings need kafka.security_protocol SSL or SASL_SSL "
                f"(it is {protocol})"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("kafka.ssl_certfile and kafka.ssl_keyfile go together (client TLS)")
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_password_file"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"kafka.{key}={str(path)!r}: no such file")
        return self

    @property
    def is_plaintext(self) -> bool:
        return self.security_protocol == "PLAINTEXT"

    def describe(self) -> dict[str, Any]:
        """Return what may be shown (REST, logs): the settings; of the password only its source."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL_"):
            out.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_username=self.sasl_username,
                sasl_password="(from file)" if self.sasl_password_file else "(set)",
            )
        if self.security_protocol.endswith("SSL"):
            out.update(
                ssl_cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
                ssl_client_certificate=self.ssl_certfile is not None,
                ssl_check_hostname=self.ssl_check_hostname,
            )
        return out

    def ssl_context(self) -> ssl.SSLContext:
        """Return a client TLS context: the CA file (else the system's), a client certificate."""
        context = ssl.create_default_context(
            cafile=str(self.ssl_cafile) if self.ssl_cafile else None
        )
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile is not None:
            password = (
                _read_secret(self.ssl_key_password_file, "kafka.ssl_key_password")
                if self.ssl_key_password_file
                else None
            )
            context.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile), password)
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaConsumer``/``Producer``/``Client`` (secrets read now)."""
        if self.is_plaintext:
            return {}
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.endswith("SSL"):
            kwargs["ssl_context"] = self.ssl_context()
        if self.security_protocol.startswith("SASL_"):
            password = self.sasl_password
            if password is None:
                assert self.sasl_password_file is not None
                password = _read_secret(self.sasl_password_file, "kafka.sasl_password")
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=password,
            )
        return kwargs


PLAINTEXT = KafkaSecurity()


def merged_config(security: KafkaSecurity | None, own: dict[str, Any]) -> dict[str, Any]:
    """Return the job's security settings under a connector's own config (which wins)."""
    if security is None or security.is_plaintext:
        return dict(own)
    return {**security.client_kwargs(), **own}
