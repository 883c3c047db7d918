"""Mode ``none``: observe only. The stock driver (density prefetcher + eviction of the least
recently migrated chunk on the fault path) is the baseline every policy is measured against."""

from __future__ import annotations

from .base import Controller, register


@register
class NoneController(Controller):
    name = "none"
