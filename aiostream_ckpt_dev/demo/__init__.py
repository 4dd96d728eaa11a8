"""``aiostream-ckpt demo`` (:mod:`.files`) and ``aiostream-ckpt demo-kafka`` (:mod:`.kafka`)."""
