"""The test broker's TLS and SASL listeners: a CA and certificate made here, SCRAM and PLAIN users.

Companies run Kafka behind TLS and SASL, so the connectors are tested against
a broker that requires them: ``KafkaBroker(secure=True)`` adds, beside its
PLAINTEXT listener (which the broker, its controller and the tests' own
plumbing keep using), an ``SSL``, a ``SASL_SSL`` and a ``SASL_PLAINTEXT``
listener on free loopback ports. Their certificate is signed by a CA made
here with ``cryptography`` (both valid for ``127.0.0.1`` and ``localhost``);
:data:`USERS` log in with SCRAM-SHA-512 (credentials written into the cluster
metadata when the storage is formatted: ``kafka-storage format --add-scram``)
or PLAIN (the listener's JAAS config).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

SECURE_PROTOCOLS = ("SSL", "SASL_SSL", "SASL_PLAINTEXT")
#: user -> password, for both SCRAM-SHA-512 and PLAIN
USERS = {"alice": "alice-secret-pw", "bob": "bob-secret-pw"}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")


@dataclass(frozen=True)
class Certificates:
    """The CA the clients trust, the broker's key and chain (PEM), a CA nobody trusts."""

    ca_file: Path
    server_pem: Path
    other_ca_file: Path


def _ca(name: str) -> tuple[object, object]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_certificates(directory: Path) -> Certificates:
    """Make (once) a CA, a broker certificate it signs for 127.0.0.1/localhost, and a stray CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    certs = Certificates(directory / "ca.pem", directory / "server.pem", directory / "other-ca.pem")
    if certs.server_pem.is_file():
        return certs
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("aiostream-ckpt test CA")
    _, other_cert = _ca("a CA nobody trusts")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)  # type: ignore[attr-defined]
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    pem = serialization.Encoding.PEM
    certs.ca_file.write_bytes(ca_cert.public_bytes(pem))  # type: ignore[attr-defined]
    certs.other_ca_file.write_bytes(other_cert.public_bytes(pem))  # type: ignore[attr-defined]
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    chain = cert.public_bytes(pem) + ca_cert.public_bytes(pem)  # type: ignore[attr-defined]
    certs.server_pem.write_bytes(key_pem + chain)
    return certs


def listener_properties(certs: Certificates) -> dict[str, str]:
    """``server.properties`` entries for the TLS keystore and the SASL logins."""
    plain_users = " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server_pem),
        "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
    }
    for listener in ("sasl_ssl", "sasl_plaintext"):
        props[f"listener.name.{listener}.plain.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        )
        props[f"listener.name.{listener}.scram-sha-512.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
    return props


def scram_format_args() -> list[str]:
    """``kafka-storage format`` arguments creating the SCRAM-SHA-512 users."""
    args = []
    for user, password in USERS.items():
        args += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
    return args
