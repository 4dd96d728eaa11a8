"""One root exception for the package, with a subclass per area.

Every error says whether retrying can help (``retriable``), the way aiokafka's
errors do, so the restart strategy can tell a broker hiccup from a bad config.
"""

from __future__ import annotations


class AiostreamError(Exception):
    """Root of every error raised by aiostream-ckpt.

    ``detail`` is shown above the one-line message where a person reads it
    (the CLI's stderr, the failure log): the app's traceback, for errors in
    user code.
    """

    retriable: bool = False
    detail: str = ""

    def __init__(
        self, message: str, *, retriable: bool | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable
        if detail:
            self.detail = detail


class ConfigError(AiostreamError):
    """A configuration value is missing, malformed or out of range."""


def check_config(cond: bool, key: str, value: object, must: str) -> None:
    """Raise a :class:`ConfigError` naming ``key`` and its bad ``value`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"invalid config {key}={value!r}: must be {must}")


class AppLoadError(AiostreamError):
    """The app module could not be imported or does not build a job."""


class JobGraphError(AiostreamError):
    """The job built by the app is not valid (duplicate uid, no sink, ...)."""


class CheckpointError(AiostreamError):
    """A checkpoint could not be taken, stored or read."""


class FencedError(CheckpointError):
    """Another daemon took over this job's checkpoints in the object store (no retry helps).

    Completing a checkpoint there is a conditional write on the chain object;
    it failed because a newer owner wrote it. This daemon may neither complete
    a checkpoint nor commit output any more: it stops.
    """

    retriable = False


class CheckpointOutcomeUnknownError(CheckpointError):
    """Completing a checkpoint may or may not have landed (the object store did not answer).

    Neither completed nor aborted: the job fails over (retriable) and the next
    attempt restores what the store says, committing or aborting its output.
    """

    retriable = True


class ObjectStoreError(AiostreamError):
    """An object store (S3 API) refused a request or could not be reached.

    ``retriable``: unreachable or overloaded after the client's own retries (a
    restart may help); not for a missing bucket or refused credentials.
    """


class PreconditionFailedError(ObjectStoreError):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


class ObjectNotFoundError(ObjectStoreError):
    """The object (or the multipart upload) does not exist."""


class DirectoryOwnedError(AiostreamError):
    """A directory the job would write is owned by another running job (or cannot be locked)."""


class CorruptCheckpointError(CheckpointError):
    """Checkpoint metadata or a state file failed its checksum or could not be parsed."""


class RestoreRefusedError(CheckpointError):
    """A restore would retract committed output and was not allowed to (no retry helps)."""


class StateError(AiostreamError):
    """Keyed or operator state could not be read, written or restored."""


class StateMigrationError(StateError):
    """Restored state does not match the job (unknown operator uid, key group range, serde)."""


class ConnectorError(AiostreamError):
    """A source or sink failed; ``retriable`` tells whether a restart may help."""


class TransactionLostError(ConnectorError):
    """Output a completed checkpoint pre-committed is gone (its transaction was aborted).

    Never retriable: a restart from the same checkpoint cannot bring it back.
    """

    retriable = False


class ChannelError(AiostreamError):
    """A channel between processes failed (its peer died, a frame was malformed).

    Retriable: the attempt fails and the restart strategy starts every process again.
    """

    retriable = True


class ChannelRecordError(ChannelError):
    """A record cannot cross to another process with the channel's serializer (no retry helps)."""

    retriable = False


class WorkerError(AiostreamError):
    """A worker process could not build the job, or built a different one (no retry helps)."""


class PartitioningError(AiostreamError):
    """Input declared partitioned by key is not, or cannot be read so at this parallelism.

    Raised before a misrouted record touches keyed state (state is stored by
    key group, so a record at an instance that does not own its key group
    would be counted apart from its key's other records and lost to it after
    a rescale). No retry helps: the input or the declaration must change.
    """

    retriable = False


class RecordError(AiostreamError):
    """One input record could not be processed (malformed, undeserializable)."""


class UserFunctionError(AiostreamError):
    """A user function raised (a map, process_element, on_timer, open...).

    Restartable like the exception it wraps (a restart may get past a
    transient cause); the message names the operator uid and the record,
    ``detail`` holds the traceback of the app's frames.
    """

    retriable = True


class JobFailedError(AiostreamError):
    """The job failed for good: the restart strategy is exhausted or the error is fatal."""

    def __init__(
        self, message: str, cause: BaseException | None = None, *, detail: str | None = None
    ) -> None:
        super().__init__(message, retriable=False, detail=detail)
        self.cause = cause
