"""Load-test stream apps and compare aiostream-ckpt with its peers (``python -m bench``)."""
