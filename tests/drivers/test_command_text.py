"""A command in a timeout message: one line, cut in the middle where long, the cut shown."""

from __future__ import annotations

import shlex

from verify.drivers.channel import command_text


def test_a_short_command_is_shown_whole_and_quoted() -> None:
    assert command_text(["sh", "-c", "echo 'a b'\nexit 3"]) == "sh -c 'echo '\"'\"'a b'\"'\"'\\nexit 3'"


def test_a_long_command_keeps_its_start_and_end_around_an_ellipsis() -> None:
    argv = ["/opt/venv/bin/python", "/tmp/work/cache/" + "0" * 64 + ".pyz", "/tmp/work/jobs/7",
            "--case", "2"]
    text = command_text(argv)
    assert len(text) == 120 and "\n" not in text
    head, tail = text.split(" … ")
    whole = shlex.join(argv)
    assert whole.startswith(head) and whole.endswith(tail)
    assert tail.endswith("/tmp/work/jobs/7 --case 2")
