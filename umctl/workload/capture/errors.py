"""The capture's one error: what the CLI prints as one line (a missing torch, a bad entry point,
a step that raises, a data-dependent size the capture cannot bound)."""

from __future__ import annotations

from ... import UmctlError


class CaptureError(UmctlError):
    """A capture that cannot be made (one line, never a traceback)."""
