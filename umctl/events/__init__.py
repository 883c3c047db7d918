"""Event model (numpy structured dtypes per kind) and trace files."""

from .schema import (  # noqa: F401
    DTYPES, SCHEMA_VERSION, Access, Advice, AllocOp, Cause, CopyKind, EventBatch, Kind, Op,
    Status, commands, empty,
)
