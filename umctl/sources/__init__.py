"""Sources of events and access streams: scenarios, trace files (and, later, the live UVM
tools API and libcuda uprobes)."""
