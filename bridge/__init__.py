"""The library an MCP server uses to write its tasks where the taskhub reads them."""

from bridge.bridge import TaskBridge
from bridge.control import CancelHandler, ControlOptions, ControlStats, InputHandler
from bridge.events import FleetEvents
from bridge.states import (
    BridgeEnvelope,
    IllegalTransition,
    InputKeyReused,
    InvalidPayload,
    TerminalStateError,
)
from bridge.store_reads import StoreUnavailable
from bridge.task_store import CreateOutcomeUnknown, TaskExpired, TaskNotFound, WriteConflict
from bridge.wire import DetailedTask, InvalidEnvelope, TaskError, TaskRecord

__all__ = [
    "BridgeEnvelope",
    "CancelHandler",
    "ControlOptions",
    "ControlStats",
    "CreateOutcomeUnknown",
    "DetailedTask",
    "FleetEvents",
    "IllegalTransition",
    "InputHandler",
    "InputKeyReused",
    "InvalidEnvelope",
    "InvalidPayload",
    "StoreUnavailable",
    "TaskBridge",
    "TaskError",
    "TaskExpired",
    "TaskNotFound",
    "TaskRecord",
    "TerminalStateError",
    "WriteConflict",
]
