"""Controllers: consume event batches, keep a policy's tables, emit command batches."""

from .base import Controller, ControllerContext, available_modes, make_controller, register  # noqa: F401
