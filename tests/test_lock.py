"""The lock of --out: one run at a time, a refusal naming the holder, a dead holder's lock taken
over, and temporary files removed only under the lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpopt import lock
from dpopt._validate import DpoptError
from dpopt.cli import main

#: A process that takes the lock of the checkpoint argv[1], says so, then waits for its stdin to close
#: (or, with argv[2] == "die", SIGKILLs itself while holding it).
HOLDER = """
import os, signal, sys
from pathlib import Path
from dpopt import lock
from dpopt._validate import DpoptError
with lock.held(Path(sys.argv[1])):
    print("held", flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()
"""


def holder(checkpoint: Path, mode: str = "wait") -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(checkpoint), mode], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    return process


def argv(out: Path) -> list[str]:
    return ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--out", str(out)]


def test_a_second_run_on_the_same_out_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "out"
    live = holder(out / "checkpoint.pt")
    try:
        # a live run's temporary file: a second run must not remove it
        temporary = out / ".checkpoint.pt.abc123.tmp"
        temporary.write_bytes(b"half a checkpoint")
        assert main(argv(out)) == 2
        err = capsys.readouterr().err
        started = json.loads(lock.lock_file(out / "checkpoint.pt").read_text())["started"]
        assert err == (f"dpopt: error: {str(out / 'checkpoint.pt')!r} is held by another run (pid {live.pid} on "
                       f"host {socket.gethostname()}, started {started}): wait for it to end, or use another --out\n")
        assert temporary.read_bytes() == b"half a checkpoint"
        assert sorted(p.name for p in out.iterdir()) == [".checkpoint.pt.abc123.tmp"]
    finally:
        live.stdin.close()
        assert live.wait(timeout=60) == 0
    assert main(argv(out)) == 0  # the holder ended: the lock is free
    assert not temporary.exists()  # stale now, and removed under the lock


def test_two_command_line_runs_on_one_out(tmp_path, capsys):
    """The reproduction: a second `dpopt run` while the first is training is refused, and the
    first's files are left alone."""
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "dpopt.cli", *argv(out)[:-4], "--steps", "1000000",
                              "--checkpoint-every", "1000", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        lock_file, deadline = lock.lock_file(out / "checkpoint.pt"), time.monotonic() + 300
        while first.poll() is None and time.monotonic() < deadline and not (
                lock_file.exists() and str(first.pid) in lock_file.read_text()):
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read()
        assert main(argv(out)) == 2
        assert f"is held by another run (pid {first.pid} on host" in capsys.readouterr().err
        assert not (out / "history.json").exists()
    finally:
        first.kill()
        first.wait()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, capsys):
    out = tmp_path / "out"
    dead = holder(out / "checkpoint.pt", "die")
    assert dead.wait(timeout=60) == -signal.SIGKILL
    held = lock.lock_file(out / "checkpoint.pt")  # in the state folder, not in --out
    assert json.loads(held.read_text())["pid"] == dead.pid  # its holder line is left
    assert main(argv(out)) == 0
    capsys.readouterr()
    assert sorted(path.name for path in out.iterdir()) == ["checkpoint.pt", "curves.png", "history.json",
                                                           "summary.md"]  # the finished run's files alone
    with lock.held(out / "checkpoint.pt"):  # and now ours
        assert json.loads(held.read_text())["pid"] == os.getpid()


def test_the_lock_is_reentrant_within_a_process_and_exclusive_across_processes(tmp_path):
    path = tmp_path / "run" / "checkpoint.pt"
    with lock.held(path), lock.held(path):  # e.g. a caller's work on the folder, then dpopt.run inside it
        other = subprocess.run([sys.executable, "-c", HOLDER, str(path), "wait"], capture_output=True, text=True,
                               timeout=60)
        assert other.returncode == 1 and "is held by another run (pid" in other.stderr
    live = holder(path)  # released: another process takes it
    live.stdin.close()
    assert live.wait(timeout=60) == 0


def test_a_lock_in_an_unusable_directory_is_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(DpoptError, match=r"^out='.*/file' must be a writable directory \(File exists\)$"):
        with lock.held(not_a_dir / "checkpoint.pt"):
            pass
