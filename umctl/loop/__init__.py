"""The control loop that a live session and a replay share (ARCHITECTURE.md): subscription
filtering, the residency estimate, the soft budget and its check, COMMAND/RESULT bookkeeping."""
