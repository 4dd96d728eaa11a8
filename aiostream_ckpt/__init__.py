"""aiostream-ckpt: Flink-style asynchronous barrier snapshots on asyncio."""
