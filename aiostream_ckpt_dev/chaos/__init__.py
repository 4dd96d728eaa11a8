"""kill -9 across the checkpoint protocol's windows, and the proof that nothing was lost.

- :mod:`.kills`: run a worker and SIGKILL it at random moments (demo, tests, bench);
- :mod:`.windows`: kills aimed at the fail points and input positions;
- :mod:`.faults`: faults injected between restarts (two successors, a corrupt checkpoint);
- :mod:`.cli`: ``aiostream-ckpt chaos MODULE``; :mod:`.suite`: ``make chaos``.
"""
