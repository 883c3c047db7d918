"""The nvidia-uvm driver as umctl reaches it: the ioctl ABI and the tools-API structures
(``abi.py``) and the process helpers (``process.py``: which processes hold UVM, borrowing their
va_space fd through a pidfd, the GPUs). Live sources read events through it and actuators send
commands through it; it imports neither."""
