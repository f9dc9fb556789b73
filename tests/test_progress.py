"""The CLI's progress and message lines off a terminal (a log file, a pipe, CI)."""

from __future__ import annotations

from tianji_dask.progress import Progress


def test_a_message_off_a_terminal_stays_on_its_line(capsys):
    ready = "hosts ready (the slowest of each role): " + ", ".join(
        f"actor {i} in 7.2 s (built in 7.2 s, its envs 6.5 s)" for i in range(3)
    )
    progress = Progress(target=18.0)
    progress.event(ready)
    progress.update({"time": 5.0, "env_steps": 1000, "env_fps": 200.0})
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert ready in lines, lines
    assert any(line.startswith("   5.0s  steps     1,000  200 steps/s") for line in lines), lines
