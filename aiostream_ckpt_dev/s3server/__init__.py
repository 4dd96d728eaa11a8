"""A real S3-compatible server (SeaweedFS) for tests, chaos runs and the bench."""

from aiostream_ckpt_dev.s3server.build import SEAWEEDFS_VERSION, ensure_weed
from aiostream_ckpt_dev.s3server.process import SeaweedS3

__all__ = ["SEAWEEDFS_VERSION", "SeaweedS3", "ensure_weed"]
