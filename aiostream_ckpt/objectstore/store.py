"""One bucket of an S3 API store, through boto3's client: blocking calls, made from threads.

Why boto3 in threads rather than an asyncio client (aiobotocore): every
caller already runs off the event loop -- a snapshot's files are written in
a worker thread, checkpoint metadata and retention run in the coordinator's
executor, the file sink's part uploads in its writer thread -- so a blocking,
thread-safe client fits, and keeps one event loop from carrying the
transfers' CPU (signing, checksums) beside the records. boto3 is the optional
extra ``s3``: nothing imports it until an ``s3://`` location is configured.

Transient failures (connection refused or reset, timeouts, throttling, 5xx)
are retried by botocore's standard mode with exponential backoff and jitter,
``max_attempts`` in all; what is left is an :class:`ObjectStoreError` that
names the endpoint, bucket and key and whether a retry can help. A lost
conditional write is :class:`PreconditionFailedError`: never retried here,
its caller decides (a retried conditional write whose first try landed loses
to itself, so callers re-read the object before calling it lost).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiostream_ckpt.errors import (
    ConfigError,
    ObjectNotFoundError,
    ObjectStoreError,
    PreconditionFailedError,
)

#: files above this are uploaded in parts, several at once (s3transfer)
MULTIPART_THRESHOLD = 16 * 1024 * 1024
_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}
_REFUSED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
}
_LOST = {"PreconditionFailed", "412", "ConditionalRequestConflict"}


@dataclass(frozen=True)
class S3Settings:
    """How to reach the store (``s3.*``); None: boto3's usual sources (env, profile, files).

    ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``
    and the shared config and credentials files apply as for any AWS SDK.
    """

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    #: tries per request, the first included (botocore standard retry mode)
    max_attempts: int = 8
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    #: ``auto``, ``path`` (most self-hosted stores) or ``virtual``
    addressing_style: str = "auto"

    def validate(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"invalid config s3.max_attempts={self.max_attempts!r}: must be >= 1")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"invalid config s3.addressing_style={self.addressing_style!r}: "
                "must be auto, path or virtual"
            )


def _client(settings: S3Settings) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigError(
            "an s3:// location needs boto3: pip install 'aiostream-ckpt[s3]'"
        ) from exc
    config = Config(
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        max_pool_connections=16,
        s3={"addressing_style": settings.addressing_style},
    )
    try:
        session = boto3.session.Session(profile_name=settings.profile)
        return session.client(
            "s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=config
        )
    except Exception as exc:  # botocore: ProfileNotFound, invalid endpoint, ...
        raise ConfigError(f"cannot make an S3 client: {exc}") from exc


class ObjectStore:
    """One bucket; every method blocks (call it from a thread) and is thread-safe."""

    def __init__(self, settings: S3Settings, bucket: str) -> None:
        settings.validate()
        self.settings = settings
        self.bucket = bucket
        self._s3 = _client(settings)
        self.endpoint = str(self._s3.meta.endpoint_url)

    # -- errors ---------------------------------------------------------------------

    def _error(self, what: str, key: str | None, exc: Exception) -> ObjectStoreError:
        """Map a botocore error to ours, naming the request, endpoint, bucket and key."""
        from botocore.exceptions import ClientError, NoCredentialsError

        where = f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"
        base = f"{what} {where} at {self.endpoint}"
        if isinstance(exc, NoCredentialsError):
            return ObjectStoreError(
                f"{base}: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE or s3.profile)",
                retriable=False,
            )
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = f"{base}: {code or status} {err.get('Message', '')}".rstrip()
            if code in _LOST or status == 412:
                return PreconditionFailedError(message, retriable=False)
            if code == "NoSuchBucket":
                return ObjectStoreError(
                    f"{base}: the bucket {self.bucket!r} does not exist", retriable=False
                )
            if code in _NOT_FOUND or status == 404:
                return ObjectNotFoundError(message, retriable=False)
            if code in _REFUSED or status == 403:
                return ObjectStoreError(
                    f"{message} (the store refused these credentials)", retriable=False
                )
            return ObjectStoreError(message, retriable=status is None or status >= 500)
        return ObjectStoreError(
            f"{base}: cannot reach the store after {self.settings.max_attempts} tries: {exc}",
            retriable=True,
        )

    def _call(self, what: str, key: str | None, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._s3, method)(Bucket=self.bucket, **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(what, key, exc) from exc

    # -- objects --------------------------------------------------------------------

    def check_bucket(self) -> None:
        """Raise a clear error unless the bucket exists and these credentials may use it."""
        self._call("reach", None, "head_bucket")

    def put_bytes(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Write ``data``; conditionally: only if absent, or only if its ETag is ``if_match``.

        Returns the new ETag.
        """
        extra: dict[str, Any] = {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        reply = self._call("write", key, "put_object", Key=key, Body=data, **extra)
        return str(reply["ETag"])

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        """Return the object's bytes and ETag (``ObjectNotFoundError`` if absent)."""
        from botocore.exceptions import BotoCoreError, ClientError

        reply = self._call("read", key, "get_object", Key=key)
        try:
            data = reply["Body"].read()
        except (BotoCoreError, ClientError, OSError) as exc:
            raise self._error("read", key, exc) from exc
        return bytes(data), str(reply["ETag"])

    def upload_file(self, key: str, path: Path) -> None:
        """Upload a local file, in parallel parts above :data:`MULTIPART_THRESHOLD`."""
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError
        from s3transfer.exceptions import S3UploadFailedError  # type: ignore[import-untyped]

        cfg = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, max_concurrency=4)
        try:
            self._s3.upload_file(str(path), self.bucket, key, Config=cfg)
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            cause = exc.__cause__ if isinstance(exc, S3UploadFailedError) else exc
            err = self._error("upload", key, cause if isinstance(cause, Exception) else exc)
            raise err from exc

    def download_file(self, key: str, path: Path) -> None:
        """Download into ``path`` through a temp file beside it (no torn file under the name)."""
        from botocore.exceptions import BotoCoreError, ClientError

        tmp = path.with_name(path.name + ".download")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._s3.download_file(self.bucket, key, str(tmp))
            os.replace(tmp, path)
        except (BotoCoreError, ClientError) as exc:
            tmp.unlink(missing_ok=True)
            raise self._error("download", key, exc) from exc
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ObjectStoreError(f"cannot write {path}: {exc}", retriable=True) from exc

    def list_keys(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Yield ``(key, size)`` of every object whose key starts with ``prefix``."""
        from botocore.exceptions import BotoCoreError, ClientError

        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        try:
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield str(obj["Key"]), int(obj["Size"])
        except (BotoCoreError, ClientError) as exc:
            raise self._error("list", prefix + "*", exc) from exc

    def delete_keys(self, keys: Iterable[str]) -> None:
        """Delete objects (absent ones are no error), 1000 per request."""
        batch: list[str] = []
        for key in keys:
            batch.append(key)
            if len(batch) == 1000:
                self._delete(batch)
                batch = []
        if batch:
            self._delete(batch)

    def _delete(self, keys: list[str]) -> None:
        reply = self._call(
            "delete",
            keys[0],
            "delete_objects",
            Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
        )
        failed = [e for e in reply.get("Errors", ()) if e.get("Code") not in _NOT_FOUND]
        if failed:
            first = failed[0]
            raise ObjectStoreError(
                f"delete s3://{self.bucket}/{first.get('Key')} at {self.endpoint}: "
                f"{first.get('Code')} {first.get('Message', '')} ({len(failed)} failed)",
                retriable=True,
            )

    # -- multipart uploads ------------------------------------------------------------

    def create_multipart(self, key: str) -> str:
        """Start a multipart upload; return its id (nothing is visible under ``key`` yet)."""
        return str(
            self._call("start an upload to", key, "create_multipart_upload", Key=key)["UploadId"]
        )

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Upload part ``number`` (1-based; all but the last >= 5 MiB); return its ETag."""
        reply = self._call(
            "upload a part of",
            key,
            "upload_part",
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
        )
        return str(reply["ETag"])

    def complete_multipart(
        self, key: str, upload_id: str, etags: list[str], *, if_none_match: bool = True
    ) -> None:
        """Make the upload the object ``key``; with ``if_none_match`` never over another one."""
        parts = [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if if_none_match else {}
        self._call(
            "complete the upload to",
            key,
            "complete_multipart_upload",
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            **extra,
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an upload and its parts (an absent one is no error)."""
        try:
            self._call(
                "abort the upload to", key, "abort_multipart_upload", Key=key, UploadId=upload_id
            )
        except ObjectNotFoundError:
            return

    def list_multipart(self, prefix: str) -> list[tuple[str, str]]:
        """Return ``(key, upload id)`` of the uploads in progress under ``prefix``."""
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Prefix": prefix}
        while True:
            reply = self._call(
                "list the uploads of", prefix + "*", "list_multipart_uploads", **kwargs
            )
            out += [(str(u["Key"]), str(u["UploadId"])) for u in reply.get("Uploads", ())]
            if not reply.get("IsTruncated"):
                return out
            kwargs.update(
                KeyMarker=reply.get("NextKeyMarker", ""),
                UploadIdMarker=reply.get("NextUploadIdMarker", ""),
            )

    def head(self, key: str) -> int | None:
        """Return the object's size, None if absent."""
        try:
            reply = self._call("read", key, "head_object", Key=key)
        except ObjectNotFoundError:
            return None
        return int(reply["ContentLength"])
