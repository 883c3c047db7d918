"""Reports people look at: terminal tables, PNG figures, Perfetto timelines."""
