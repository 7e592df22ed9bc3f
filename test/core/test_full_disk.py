"""A full disk met by the engine, on a real one: a 3 MB tmpfs in a private mount namespace
(test/disk_support.py), filled by a file, then grown back while the engine stays open.

What a user notices: every save answers either ok with an id, or `unavailable` with a message
that starts with "disk full" (never `internal`, never ok without an id); searches are answered
while the disk is full; a note the answer said was kept in its Markdown file is stored and
searchable by itself once there is space, without a restart; nothing acknowledged is lost and
the store passes integrity_check. Plus the pieces: free space read at most once a second, a
recurring problem said once a minute.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from disk_support import run_scenario

from memory_node.core.disk import DiskReserve, FreeSpace, RateLimitedLog, is_disk_full


def test_saves_on_a_full_disk_answer_disk_full_and_kept_notes_come_back_by_themselves(
        tmp_path):
    r = run_scenario("saves", tmp_path, timeout=120, size="3m")
    answers, notes = r["answers"], r["notes"]
    assert answers[0]["ok"] and isinstance(answers[0]["id"], int), answers[0]
    failed = answers[1:]
    for a in failed:
        if a["ok"]:
            assert isinstance(a["id"], int), a  # never ok with no id
            continue
        assert a["error"]["code"] == "unavailable", a
        assert a["error"]["message"].startswith("disk full"), a
    messages = [a["error"]["message"] for a in failed if not a["ok"]]
    kept = [n for n, a in zip(notes, answers, strict=True)
            if not a["ok"] and "kept in notes/" in a["error"]["message"]]
    lost = [n for n, a in zip(notes, answers, strict=True)
            if not a["ok"] and "not saved" in a["error"]["message"]]
    # Both ways a save meets a full disk: the Markdown file had room and memory.db not, and
    # then neither.
    assert kept and lost, messages[:3]
    assert r["free_when_full"] < 64 * 1024
    assert r["io_error_is_full"]  # SQLite's "disk I/O error" on this full disk is one
    # Searches are answered while the disk is full.
    assert r["search_full"]["ok"], r["search_full"]
    assert r["search_full"]["results"][0]["text"] == notes[0]
    # Once there is space, every kept note is searchable: nobody saved it again, no restart.
    assert r["kept_found"] and all(r["kept_found"].values()), r["kept_found"]
    assert r["after"]["ok"] and r["after"]["indexed"], r["after"]
    end = r["end"]
    assert end["integrity"] == ["ok"]
    stored = set(end["notes"].values())
    acknowledged = [n for n, a in zip(notes, answers, strict=True) if a["ok"]]
    assert set(acknowledged) <= stored and set(kept) <= stored
    # A note answered "not saved" is nowhere: not in memory.db, not in the Markdown file.
    assert not set(lost) & stored
    assert not any(n in r["markdown"] for n in lost)
    assert len(end["notes"]) == len(acknowledged) + len(kept) + 1  # + the note after


def test_free_space_is_read_at_most_once_per_interval(tmp_path):
    now = [100.0]
    free = FreeSpace(tmp_path, interval_s=1.0, clock=lambda: now[0])
    first = free.bytes()
    assert first is not None and first > 0
    # 8 MiB more used on the filesystem: not seen until the interval passed.
    with open(tmp_path / "big", "wb") as fh:
        fh.write(os.urandom(8 * 1024 * 1024))
        fh.flush()
        os.fsync(fh.fileno())
    now[0] += 0.5
    assert free.bytes() == first
    now[0] += 0.6
    assert free.bytes() != first


def test_a_recurring_problem_is_said_once_a_minute_with_its_count():
    said: list[str] = []
    now = [0.0]
    limit = RateLimitedLog(said.append, period_s=60.0, clock=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.5  # 50 s of failures
        limit("disk_full", "disk full: rows not stored")
    assert said == ["disk full: rows not stored"]
    now[0] = 61.0
    limit("disk_full", "disk full: rows not stored")
    assert said[-1] == "disk full: rows not stored (100 times since last said)"
    # Its end is said once, however often the disk fills and frees after that.
    limit.recovered("disk_full", "storing again")
    for i in range(10):
        now[0] = 62.0 + i
        limit("disk_full", "disk full: rows not stored")
        limit.recovered("disk_full", "storing again")
    assert said.count("storing again") == 1 and len(said) == 3


def test_a_full_disk_is_told_apart_from_other_failures():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("storing failed") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))


def test_a_writer_killed_while_the_disk_is_full_loses_nothing_acknowledged(tmp_path):
    """The crash matrix's question on a full disk: a process saving notes is SIGKILLed while
    its disk is full; once grown back, the store opened again holds every acknowledged note
    and every note an answer said was kept, searchable, and passes integrity_check."""
    r = run_scenario("crash", tmp_path, timeout=120, size="3m")
    acks = r["acks"]
    ok = [a["text"] for a in acks if a["answer"]["ok"]]
    kept = [a["text"] for a in acks if not a["answer"]["ok"]
            and "kept in notes/" in a["answer"]["error"]["message"]]
    assert len(ok) >= 5 and kept, acks[-3:]
    for a in acks:
        assert a["answer"]["ok"] or a["answer"]["error"]["message"].startswith("disk full"), a
    assert r["end"]["integrity"] == ["ok"]
    stored = set(r["end"]["notes"].values())
    assert set(ok) | set(kept) <= stored
    assert all(r["found"][t] for t in ok + kept), r["found"]
    not_saved = {a["text"] for a in acks if not a["answer"]["ok"]} - set(kept)
    assert not not_saved & stored


def test_an_io_error_counts_as_a_full_disk_only_where_the_disk_is_full(tmp_path):
    """SQLite says "disk I/O error" when it cannot grow its wal-index: a full disk there, an
    I/O error anywhere with room."""
    io = sqlite3.OperationalError("disk I/O error")
    assert not is_disk_full(io)
    assert not is_disk_full(io, tmp_path)  # this filesystem has room


def test_the_disk_reserve_is_reached_only_below_it(tmp_path):
    free = FreeSpace(tmp_path).bytes()
    assert free is not None
    assert not DiskReserve(tmp_path, 0).reached()  # no reserve
    assert not DiskReserve(tmp_path, free / 2**20 / 2).reached()
    assert DiskReserve(tmp_path, free / 2**20 * 2).reached()
    assert DiskReserve(tmp_path / "not" / "yet", free / 2**20 * 2).reached()  # a new store
