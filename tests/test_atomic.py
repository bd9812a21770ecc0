"""dpopt.atomic: every file dpopt writes is whole, owner-only (mode 0600), and leaves no temporary file."""

from __future__ import annotations

import stat

from dpopt import atomic


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_written_file_replaces_the_old_one_whole_owner_only_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "new" / "results.json"  # the folder is made
    atomic.write_text(path, "old")
    atomic.write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert mode(path) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]


def test_a_created_file_is_made_once_and_the_first_one_stays(tmp_path):
    path = tmp_path / "checkpoint.key"
    atomic.create(path, b"first")
    atomic.create(path, b"second")  # as a process that lost the race: it uses the first one's
    assert path.read_bytes() == b"first"
    assert mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.key"]


def test_remove_stale_removes_only_the_temporary_files_of_its_path(tmp_path):
    path = tmp_path / "checkpoint.pt"
    kept = [path, tmp_path / ".other.pt.abc.tmp", tmp_path / ".checkpoint.pt.abc.part"]
    for file in [*kept, tmp_path / ".checkpoint.pt.abc123.tmp", tmp_path / ".checkpoint.pt.x.tmp"]:
        file.write_bytes(b"x")
    atomic.remove_stale(path)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
