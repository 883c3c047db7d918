"""Outputs of umctl's results: terminal tables and summaries, JSON, PNG figures, Perfetto
timelines, Prometheus text. Each is a :class:`~umctl.report.base.Reporter` that a command picks
by name (:func:`~umctl.report.base.get_reporter`) and calls once."""
