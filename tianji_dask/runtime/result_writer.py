"""Writes a run's ``metrics.nc`` and ``episodes.nc`` into its directory: interim files while it
goes on, then the files with its outcome."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tianji_dask.results.recorder import MetricsRecorder


class ResultWriter:
    def __init__(self, recorder: MetricsRecorder, run_dir: Path, on_event: Callable[[str], None]):
        self.recorder = recorder
        self.run_dir = run_dir
        self._on_event = on_event

    def write_interim(self) -> None:
        # The files are replaced atomically, so a reader (or a crash) sees the previous or the new.
        try:
            self.recorder.write(self.run_dir)
        except Exception as exc:  # noqa: BLE001 - a full disk must not end a healthy run
            self._on_event(f"writing interim results to {self.run_dir} failed: {exc!r}")

    def write_outcome(self, status: str, error: str | None) -> tuple[str, str | None]:
        """Write the files with the run's outcome and return the outcome, which is ``failed``
        if the write failed; the files then say so too, if a second write gets through."""
        self.recorder.set_outcome(status, error)
        try:
            self.recorder.write(self.run_dir)
            return status, error
        except Exception as exc:  # noqa: BLE001 - the run has ended: report it, do not raise
            error = _append(error, f"writing results to {self.run_dir} failed: {exc!r}")
        self.recorder.set_outcome("failed", error)
        try:
            self.recorder.write(self.run_dir)
        except Exception as exc:  # noqa: BLE001
            error = _append(error, f"the second write, with status failed, failed too: {exc!r}")
        return "failed", error


def _append(error: str | None, line: str) -> str:
    return f"{error}\n{line}" if error else line
