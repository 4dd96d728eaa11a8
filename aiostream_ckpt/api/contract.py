"""What an app states about its output, so that exactly-once can be proven for it.

``aiostream-ckpt validate --app`` (and ``aiostream-ckpt chaos``) prove a job by
running it once more without failures and comparing the committed outputs as
multisets. That is a proof only when the app is deterministic: the same input
gives the same records. The author says so (and where order matters) with a
module-level ``PROOF``::

    PROOF = ProofContract(outputs=("output",), key="app_id")

An app that reads processing time or random numbers is not deterministic; it
is refused unless it names the fields that vary (``ignore_fields``: compared
without them). ``key``: the field whose per-key order is part of the output
contract (a running count's updates must arrive 1, 2, 3); without it only the
multisets are compared. An app with a Kafka mode names its output topics'
params too (``kafka_outputs``): with ``kafka_bootstrap`` set, those topics are
the proven output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Computes the expected records of one output from the app's params, without the engine.
Oracle = Callable[[Mapping[str, Any]], Iterable[dict[str, Any]]]


@dataclass(frozen=True)
class ProofContract:
    """An app's promise about its output; see the module docstring.

    >>> ProofContract(key="user_id").refusal() is None
    True
    >>> ProofContract(deterministic=False).refusal()
    'the app says it is not deterministic and declares no relaxation (ignore_fields)'
    """

    #: app params naming exactly-once file sink directories, the main output first
    outputs: tuple[str, ...] = ("output",)
    #: app params naming the input files (comma-separated paths); ``chaos`` counts their
    #: events and kills at their read positions
    inputs: tuple[str, ...] = ("input",)
    #: per-key order of records is compared for this field (None: multisets only)
    key: str | None = None
    deterministic: bool = True
    #: relaxation for a non-deterministic app: compare records without these fields
    ignore_fields: tuple[str, ...] = ()
    #: dead letters (malformed input) are part of the output and compared too
    dead_letters: bool = True
    #: optional independent recount of the main output from the input (chaos suites)
    oracle: Oracle | None = None
    #: Kafka mode (the app param ``kafka_bootstrap`` set): params naming the output
    #: topics, main first, proven instead of ``outputs`` as a read_committed consumer sees them
    kafka_outputs: tuple[str, ...] = ()
    #: Kafka mode: params naming the input topics (``chaos`` counts their events)
    kafka_inputs: tuple[str, ...] = ()
    #: Kafka mode: the param the oracle reads input files from (comma-separated);
    #: ``chaos --oracle`` writes the input topics' values there (one a line) for it
    kafka_oracle_input: str | None = None
    #: the app param holding the bootstrap servers; set, it selects Kafka mode
    kafka_bootstrap: str = "kafka_bootstrap"
    #: Kafka mode: the app param naming the topics' value format; when it says ``avro``,
    #: the proof decodes values (Confluent wire format) with the schema registry whose
    #: URL the param ``kafka_schema_registry`` names, and compares them as JSON
    kafka_value_format: str | None = None
    kafka_schema_registry: str | None = None
    #: Kafka mode: the app param naming where the proof itself reads and makes topics,
    #: when the app's own listener needs credentials the prover does not use (a TLS/SASL
    #: listener beside an internal one of the same cluster); unset: the app's bootstrap
    kafka_proof_bootstrap: str = "proof_kafka_bootstrap"

    def refusal(self) -> str | None:
        """Why no proof is possible, or None."""
        if not self.outputs:
            return "the app's ProofContract names no outputs"
        if not self.deterministic and not self.ignore_fields:
            return "the app says it is not deterministic and declares no relaxation (ignore_fields)"
        return None
