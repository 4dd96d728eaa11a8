"""Object stores with the S3 API: where checkpoints and committed output can outlive a host."""

from aiostream_ckpt.objectstore.location import ObjectLocation, is_object_url
from aiostream_ckpt.objectstore.store import ObjectStore, S3Settings

__all__ = ["ObjectLocation", "ObjectStore", "S3Settings", "is_object_url"]
