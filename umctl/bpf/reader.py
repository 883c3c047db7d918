"""One reader for the BPF ring buffers of the fault-path source (sources/kprobes.py) and the
launch probe (sources/uprobes.py): a thread polls the ring and keeps its records until the
source's ``drain()`` takes them on the caller's thread.

Records are kept raw and decoded in one vectorised pass at ``take`` time (a Python callback per
record is the expensive part); a source that must act on some records at once (the launch probe
reads kernel names while the target still holds the strings) passes ``keep``, which runs on
the poll thread under the reader's lock and says whether to keep the record."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from .. import UmctlError

T = TypeVar("T")


class RingReader:
    """The ring of BPF map ``map_fd`` drained by a thread named ``name`` every ``poll_ms``."""

    def __init__(self, map_fd: int, *, name: str, poll_ms: int = 50, what: str = "BPF source",
                 keep: Callable[[bytes], bool] | None = None) -> None:
        from . import libbpf

        self.what = what
        self._keep = keep
        self._lock = threading.Lock()
        self._records: list[bytes] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._ring = libbpf.RingBuffer(map_fd, self._on_record)
        self._poll_ms = poll_ms
        self._thread: threading.Thread | None = threading.Thread(target=self._poll, name=name, daemon=True)

    def start(self) -> "RingReader":
        assert self._thread is not None
        self._thread.start()
        return self

    def _on_record(self, data: bytes) -> None:
        with self._lock:
            if self._keep is None or self._keep(data):
                self._records.append(data)

    def _poll(self) -> None:
        self._error = self._ring.poll_until(self._stop, self._poll_ms)  # reported by the next take()

    @property
    def callback_errors(self) -> int:
        return self._ring.callback_errors

    def take(self, then: Callable[[list[bytes]], T] = lambda chunks: chunks) -> T:  # type: ignore[assignment]
        """The records kept since the last call, passed through ``then`` under the reader's lock
        (so a ``keep`` callback and the decoding see one order). A failure of the poll thread is
        raised here, once, on the caller's thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err if isinstance(err, UmctlError) else UmctlError(f"{self.what} failed: {err}")
        with self._lock:
            chunks, self._records = self._records, []
            return then(chunks)

    def stop(self) -> None:
        """End the poll thread after consuming what the ring holds (take() once more for it)."""
        self._ring.finish(self._stop, self._thread if self._thread is not None and self._thread.is_alive() else None)
        self._thread = None

    def free(self) -> None:
        """Release the ring (idempotent); records already taken off it stay for take()."""
        self._ring.free()
