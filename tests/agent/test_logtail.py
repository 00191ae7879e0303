"""The agent's engine-log follower: each engine's new lines, whole and prefixed, once."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from agent.logtail import LogFollower, as_json, follow_in_thread, prefixed, stdout_writer


def follower(tmp_path: Path) -> tuple[LogFollower, list[str]]:
    out: list[str] = []
    return LogFollower(tmp_path, out.append), out


def append(path: Path, text: str) -> None:
    with path.open("a") as file:
        file.write(text)


def test_a_log_that_appears_is_followed_from_its_start_with_the_engines_name(tmp_path):
    follow, out = follower(tmp_path)
    assert follow.poll() == 0
    append(tmp_path / "demo.log", "=== gpushare: starting engine demo\nINFO loading\n")
    assert follow.poll() == 2
    assert out == ["[engine demo] === gpushare: starting engine demo", "[engine demo] INFO loading"]
    assert follow.poll() == 0  # nothing twice


def test_in_a_json_log_an_engine_s_line_is_a_json_line_that_names_the_engine(tmp_path):
    out: list[str] = []
    follow = LogFollower(tmp_path, out.append, as_json)
    follow.poll()
    append(tmp_path / "demo.log", 'INFO "quoted" \\ ü\n')
    follow.poll()

    (line,) = [json.loads(written) for written in out]
    assert (line["logger"], line["level"], line["engine"]) == ("engine", "INFO", "demo")
    assert line["message"] == 'INFO "quoted" \\ ü'
    assert line["time"].endswith("Z")


def test_what_a_log_held_before_the_agent_started_is_not_written_again(tmp_path):
    append(tmp_path / "old.log", "said by the previous agent\n")
    follow, out = follower(tmp_path)
    follow.poll()
    append(tmp_path / "old.log", "new\n")
    follow.poll()
    assert out == [prefixed("old", "new")]


def test_a_line_is_written_once_its_newline_comes(tmp_path):
    follow, out = follower(tmp_path)
    follow.poll()
    log = tmp_path / "e.log"
    append(log, "half a li")
    follow.poll()
    assert out == []
    append(log, "ne\r\nnext")
    follow.poll()
    assert out == ["[engine e] half a line"]


def test_a_truncated_or_replaced_log_is_read_from_its_start(tmp_path):
    follow, out = follower(tmp_path)
    follow.poll()
    log = tmp_path / "e.log"
    append(log, "one\ntwo\n")
    follow.poll()
    log.write_text("x\n")  # truncated: shorter than what was read
    follow.poll()
    replacement = tmp_path / "e.log.new"
    replacement.write_text("fresh\n")
    os.replace(replacement, log)  # another file (inode) under the name
    follow.poll()
    assert out == [prefixed("e", w) for w in ("one", "two", "x", "fresh")]


def test_several_engines_and_undecodable_bytes(tmp_path):
    follow, out = follower(tmp_path)
    follow.poll()
    append(tmp_path / "a.log", "from a\n")
    (tmp_path / "b.log").write_bytes(b"bad \xff byte\n")
    (tmp_path / "notes.txt").write_text("not a log\n")
    assert follow.poll() == 2
    assert out == ["[engine a] from a", "[engine b] bad \ufffd byte"]


def test_a_missing_folder_is_no_error(tmp_path):
    follow, _ = follower(tmp_path / "engines")
    assert follow.poll() == 0
    (tmp_path / "engines").mkdir()
    append(tmp_path / "engines" / "e.log", "up\n")
    assert follow.poll() == 1


def test_the_thread_writes_whole_lines_to_a_file_descriptor_and_polls_once_more_at_stop(
    tmp_path,
):
    read_end, write_end = os.pipe()
    try:
        follow = LogFollower(tmp_path, stdout_writer(write_end))
        follow.poll()  # the agent's start: the folder as it is now is history
        stop = threading.Event()
        thread = follow_in_thread(follow, stop, every_s=0.05)
        append(tmp_path / "e.log", "hello\n")
        stop.set()
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert os.read(read_end, 1000) == b"[engine e] hello\n"
    finally:
        os.close(read_end)
        os.close(write_end)
