"""Terminal views of live sessions (``umctl top``, the ``attach`` status line)."""
