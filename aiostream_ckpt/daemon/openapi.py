"""OpenAPI 3 description of the daemon's REST API, served at ``/openapi.json``.

Kept as data next to the handlers (not generated from them) so it reads as the
contract; a test checks that it names exactly the routes the server has.
"""

from __future__ import annotations

from typing import Any

_JSON = "application/json"


def _ok(description: str, schema: str | dict[str, Any]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"} if isinstance(schema, str) else schema
    return {"description": description, "content": {_JSON: {"schema": ref}}}


_ERROR = _ok("Error", "Error")
_UNAUTHORIZED = {**_ok("Missing or wrong bearer token", "Error")}
_NOT_RUNNING = _ok("The job is not running (restarting, stopping or done)", "Error")
_SAVEPOINT_BODY = {
    "required": False,
    "content": {
        _JSON: {
            "schema": {
                "type": "object",
                "properties": {
                    "directory": {
                        "type": "string",
                        "description": "Parent directory of the savepoint; default savepoint.dir",
                    }
                },
                "additionalProperties": False,
            }
        }
    },
}

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "aiostream-ckpt daemon",
        "version": "1",
        "description": (
            "Status, metrics and control of one running job. Read calls need no token from "
            "loopback; from elsewhere they need `Authorization: Bearer <rest.read_token>` "
            "(or rest.token). Every mutating call needs `Authorization: Bearer <rest.token>`. "
            '`/health` is always open. Errors are JSON: `{"error": ...}`.'
        ),
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"],
            },
            "Health": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["ok", "failing"]},
                    "job": {"type": "string"},
                },
            },
            "Job": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "status": {
                        "type": "string",
                        "enum": [
                            "created",
                            "running",
                            "restarting",
                            "finished",
                            "stopped_with_savepoint",
                            "canceled",
                            "failed",
                        ],
                    },
                    "attempt": {"type": "integer"},
                    "restarts": {"type": "integer"},
                    "last_checkpoint": {"type": "integer", "nullable": True},
                    "stopping": {"type": "boolean"},
                    "workers": {
                        "type": "array",
                        "description": "job.workers > 1: each worker process of the attempt, "
                        "how long since the main process last heard from it (a running "
                        "worker unheard for job.heartbeat_timeout is killed), and the most "
                        "one of its heartbeats came late (the longest its event loop was held)",
                        "items": {
                            "type": "object",
                            "properties": {
                                "worker": {"type": "integer"},
                                "pid": {"type": ["integer", "null"]},
                                "status": {
                                    "type": "string",
                                    "enum": ["running", "failed", "stopped"],
                                },
                                "heartbeat_age_s": {"type": ["number", "null"]},
                                "heartbeat_max_lag_s": {"type": ["number", "null"]},
                                "report_age_s": {"type": ["number", "null"]},
                            },
                        },
                    },
                    "graph": {
                        "type": "object",
                        "properties": {
                            "operators": {"type": "array", "items": {"type": "object"}},
                            "tasks": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
            "Transactions": {
                "type": "object",
                "properties": {
                    "transactions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "task": {"type": "string"},
                                "sink": {"type": "string"},
                                "transactional_id": {"type": "string"},
                                "state": {"type": "string", "enum": ["open", "precommitted"]},
                                "checkpoint_id": {"type": ["integer", "null"]},
                                "producer_id": {"type": ["integer", "null"]},
                                "producer_epoch": {"type": ["integer", "null"]},
                                "age_seconds": {"type": "number"},
                                "timeout_seconds": {"type": "number"},
                            },
                        },
                    }
                },
            },
            "Operators": {
                "type": "object",
                "properties": {
                    "window_seconds": {"type": "number"},
                    "vertices": {
                        "type": "array",
                        "description": "per job vertex (a chain, run as parallelism subtasks): "
                        "records and rates summed over its subtasks in every process, the "
                        "worst subtask's backpressure, then each subtask",
                        "items": {
                            "type": "object",
                            "properties": {
                                "vertex": {"type": "string"},
                                "operators": {"type": "array", "items": {"type": "string"}},
                                "parallelism": {"type": "integer"},
                                "records_in": {"type": "integer"},
                                "records_out": {"type": "integer"},
                                "records_in_per_second": {"type": "number"},
                                "records_out_per_second": {"type": "number"},
                                "operator_records": {
                                    "$ref": "#/components/schemas/OperatorRecords"
                                },
                                "backpressure_ratio": {"type": "number"},
                                "backpressure": {"type": "string", "enum": ["ok", "low", "high"]},
                                "live_subtasks": {"type": "integer"},
                                "workers": {
                                    "type": "array",
                                    "items": {"type": "integer", "nullable": True},
                                },
                                "subtasks": {"type": "array", "items": {"type": "object"}},
                            },
                        },
                    },
                    "tasks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "task": {"type": "string"},
                                "subtask": {"type": "integer"},
                                "parallelism": {"type": "integer"},
                                "operators": {"type": "array", "items": {"type": "string"}},
                                "state": {"type": "string"},
                                "worker": {
                                    "type": "integer",
                                    "nullable": True,
                                    "description": "worker process index (null: the main one)",
                                },
                                "pid": {"type": "integer", "nullable": True},
                                "live": {
                                    "type": "boolean",
                                    "description": "false once its worker died or stopped: "
                                    "counts as last reported, no rates or queue fills",
                                },
                                "source": {"type": "boolean"},
                                "watermark": {"type": "integer", "nullable": True},
                                "last_checkpoint_acked": {"type": "integer", "nullable": True},
                                "last_checkpoint_size_bytes": {"type": "integer"},
                                "records_in": {"type": "integer"},
                                "records_out": {"type": "integer"},
                                "records_in_per_second": {"type": "number"},
                                "records_out_per_second": {"type": "number"},
                                "operator_records": {
                                    "$ref": "#/components/schemas/OperatorRecords"
                                },
                                "input_queue_fill": {"type": "number", "nullable": True},
                                "output_queue_fill": {"type": "number"},
                                "backpressure_ratio": {"type": "number"},
                                "backpressure": {"type": "string", "enum": ["ok", "low", "high"]},
                                "source_lag": {
                                    "type": "object",
                                    "additionalProperties": {"type": "number"},
                                },
                            },
                        },
                    },
                },
            },
            "OperatorRecords": {
                "type": "array",
                "description": "each operator of the chain between its source and sink, in "
                "order (Flink's operator numRecordsIn/numRecordsOut): records_in of the first "
                "is the task's, of the next the previous one's records_out; a vertex's sum "
                "its subtasks', every attempt's",
                "items": {
                    "type": "object",
                    "properties": {
                        "operator": {"type": "string"},
                        "records_in": {"type": "integer"},
                        "records_out": {"type": "integer"},
                    },
                },
            },
            "CheckpointEntry": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "status": {"type": "string", "enum": ["completed", "aborted"]},
                    "savepoint": {"type": "boolean"},
                    "trigger_time": {"type": "number"},
                    "duration_ms": {"type": "number"},
                    "size_bytes": {"type": "integer"},
                    "sync_ms_max": {"type": "number"},
                    "async_ms_max": {"type": "number"},
                    "alignment_ms_max": {"type": "number"},
                    "unaligned": {
                        "type": "boolean",
                        "description": "some task took it unaligned (checkpoint.unaligned)",
                    },
                    "in_flight_records": {
                        "type": "integer",
                        "description": "records in flight its channel state holds",
                    },
                    "in_flight_bytes": {"type": "integer"},
                    "reason": {"type": "string"},
                    "detail": {"type": "string"},
                },
                "required": ["id", "status", "savepoint"],
            },
            "Checkpoints": {
                "type": "object",
                "properties": {
                    "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "in_progress": {"type": "array", "items": {"type": "integer"}},
                    "history": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/CheckpointEntry"},
                    },
                },
            },
            "CompletedCheckpoint": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "path": {"type": "string"},
                    "trigger_time": {"type": "number"},
                    "completion_time": {"type": "number"},
                    "duration_ms": {"type": "number"},
                    "size_bytes": {"type": "integer"},
                    "tasks": {"type": "object"},
                    "operator_parallelism": {"type": "object"},
                },
            },
            "Savepoint": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "path": {"type": "string"},
                    "duration_ms": {"type": "number"},
                    "size_bytes": {"type": "integer"},
                },
                "required": ["id", "path"],
            },
            "StoppedWithSavepoint": {
                "allOf": [
                    {"$ref": "#/components/schemas/Savepoint"},
                    {
                        "type": "object",
                        "properties": {
                            "job": {
                                "type": "string",
                                "enum": [
                                    "stopped_with_savepoint",
                                    "finished",
                                    "canceled",
                                    "failed",
                                    "stopping",
                                ],
                            },
                            "output_committed": {"type": "boolean"},
                        },
                        "required": ["job", "output_committed"],
                    },
                ]
            },
        },
    },
    "paths": {
        "/health": {
            "get": {
                "summary": "Liveness for the container HEALTHCHECK (never needs a token)",
                "responses": {
                    "200": _ok("Daemon up, job not failed", "Health"),
                    "503": _ok("Job failed", "Health"),
                },
            }
        },
        "/job": {
            "get": {
                "summary": "Job status, attempt, restarts, graph (operators, tasks, parallelism)",
                "responses": {"200": _ok("Job", "Job"), "401": _UNAUTHORIZED},
            }
        },
        "/operators": {
            "get": {
                "summary": "Per vertex (summed over subtasks) and per subtask with its worker: "
                "records in/out, rates, queues, backpressure",
                "responses": {"200": _ok("Tasks", "Operators"), "401": _UNAUTHORIZED},
            }
        },
        "/transactions": {
            "get": {
                "summary": "Open and pre-committed transactions of the job's Kafka sinks",
                "responses": {"200": _ok("Transactions", "Transactions"), "401": _UNAUTHORIZED},
            }
        },
        "/checkpoints": {
            "get": {
                "summary": "Checkpoint and savepoint history of this process, newest first",
                "responses": {"200": _ok("History", "Checkpoints"), "401": _UNAUTHORIZED},
            }
        },
        "/checkpoints/latest": {
            "get": {
                "summary": "The newest completed checkpoint (what a restart resumes from)",
                "responses": {
                    "200": _ok("Checkpoint", "CompletedCheckpoint"),
                    "401": _UNAUTHORIZED,
                    "404": _ok("No completed checkpoint yet", "Error"),
                },
            }
        },
        "/savepoints": {
            "post": {
                "summary": "Take a savepoint; answers when it is complete",
                "security": [{"bearer": []}],
                "requestBody": _SAVEPOINT_BODY,
                "responses": {
                    "200": _ok("Savepoint complete", "Savepoint"),
                    "400": _ERROR,
                    "401": _UNAUTHORIZED,
                    "409": _NOT_RUNNING,
                    "500": _ok("Savepoint failed; the job goes on", "Error"),
                },
            }
        },
        "/savepoints/dispose": {
            "post": {
                "summary": "Dispose of a savepoint: remove its directory and the copies of "
                "pre-committed output it holds (Flink's savepoint disposal)",
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "savepoint": {
                                        "type": ["string", "integer"],
                                        "description": "The savepoint's path, or its id (one "
                                        "this daemon took, or found in savepoint.dir)",
                                    }
                                },
                                "required": ["savepoint"],
                                "additionalProperties": False,
                            }
                        }
                    },
                },
                "responses": {
                    "200": _ok(
                        "Disposed of",
                        {
                            "type": "object",
                            "properties": {
                                "id": {"type": "integer"},
                                "path": {"type": "string"},
                                "disposed": {"type": "boolean"},
                                "bytes_freed": {"type": "integer"},
                            },
                        },
                    ),
                    "400": _ok("Not a savepoint, or a bad body; nothing was removed", "Error"),
                    "401": _UNAUTHORIZED,
                    "404": _ok("No such savepoint", "Error"),
                    "409": _ok(
                        "The job depends on it (it would restore it after a failure) or it "
                        "is still being taken; nothing was removed",
                        "Error",
                    ),
                },
            }
        },
        "/job/stop-with-savepoint": {
            "post": {
                "summary": "Take a savepoint, stop the job, answer once it ended (the daemon "
                "exits 0)",
                "security": [{"bearer": []}],
                "requestBody": _SAVEPOINT_BODY,
                "responses": {
                    "200": _ok(
                        "Savepoint complete; how the job ended ('stopping' if it had not "
                        "within 60 s) and whether its output up to the savepoint is committed",
                        "StoppedWithSavepoint",
                    ),
                    "400": _ERROR,
                    "401": _UNAUTHORIZED,
                    "409": _NOT_RUNNING,
                    "500": _ok("Savepoint failed; the job goes on", "Error"),
                },
            }
        },
        "/job/cancel": {
            "post": {
                "summary": "Stop the job now; its checkpoints stay for a later resume",
                "security": [{"bearer": []}],
                "responses": {
                    "202": _ok(
                        "Cancelling",
                        {"type": "object", "properties": {"status": {"type": "string"}}},
                    ),
                    "401": _UNAUTHORIZED,
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": _UNAUTHORIZED,
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This description",
                "responses": {"200": _ok("OpenAPI 3 document", {"type": "object"})},
            }
        },
    },
}
