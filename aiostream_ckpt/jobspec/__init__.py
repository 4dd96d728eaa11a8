"""The job description that the API builds and the runtime runs.

A leaf for the API and the runtime: both import it, it imports neither
(``aiostream_ckpt_dev/import_contracts.py`` checks). Here live the frozen
graph (:mod:`.graph`: transformations, partitioning, :class:`~.graph.JobSpec`),
the contracts of user functions (:mod:`.functions`, :mod:`.async_functions`,
:mod:`.co_functions`, :mod:`.broadcast`, :mod:`.window_functions`,
:mod:`.interval_join`), the typed keyed-state protocols (:mod:`.state`),
event-time declarations (:mod:`.watermarks`, :mod:`.windows`) and the job's
settings (:mod:`.config`).
"""
