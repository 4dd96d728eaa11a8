"""``s3://bucket/prefix`` locations: parsed once, so a bad URL fails at startup naming the key."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiostream_ckpt.errors import ConfigError

SCHEME = "s3://"
#: S3's bucket naming rules (lower case, digits, dots, hyphens; 3-63 characters)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def is_object_url(value: object) -> bool:
    """Whether ``value`` names an object-store location rather than a local path."""
    return isinstance(value, str) and value.startswith(SCHEME)


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    """A bucket and a key prefix (no leading or trailing ``/``; may be empty)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str, key: str = "location") -> ObjectLocation:
        """Parse ``s3://bucket[/prefix]``; ``key`` names the setting in the error."""
        if not url.startswith(SCHEME):
            raise ConfigError(f"invalid config {key}={url!r}: must start with {SCHEME}")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        if not _BUCKET_RE.match(bucket):
            raise ConfigError(
                f"invalid config {key}={url!r}: {bucket!r} is not an S3 bucket name "
                "(3-63 characters: lower-case letters, digits, dots, hyphens)"
            )
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ConfigError(f"invalid config {key}={url!r}: empty, '.' or '..' path segment")
        return cls(bucket, prefix)

    def key(self, relative: str) -> str:
        """Return the object key of ``relative`` (a ``/``-separated path) under the prefix."""
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """Return the path under the prefix of ``key`` (the inverse of :meth:`key`)."""
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def child(self, relative: str) -> ObjectLocation:
        return ObjectLocation(self.bucket, self.key(relative.strip("/")))

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def __str__(self) -> str:
        return self.url
