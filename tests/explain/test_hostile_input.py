"""Hostile or huge input to `extforge explain`: only a bounded tail of a log is read (a 1 GiB log,
/dev/zero, a pipe). That every signature matches in linear time on a long line is a speed
verdict: bench/explain_patterns_bench.py measures it."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from cli_run import run_extforge
from extforge.doctor.explain import TAIL_BYTES, explain_text


def test_the_fixed_patterns_still_find_module_and_compiler_error() -> None:
    found = explain_text("ImportError: /x/ext.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN3c104impl3fooEv").diagnoses
    assert found[0].values["module"] == "/x/ext.cpython-311-x86_64-linux-gnu.so"
    log = "FAILED: a.o\n/src/k.cu(12): error: identifier \"x\" is undefined\nninja: build stopped: subcommand failed\n"
    stopped = [d for d in explain_text(log).diagnoses if d.id == "ninja-build-stopped"]
    assert stopped and stopped[0].values["compiler_error"].startswith("/src/k.cu(12): error:")


def explain(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_extforge("explain", *args, timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_1_gib_log_is_read_from_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with log.open("wb") as fh:
        fh.truncate(2**30)  # sparse: 1 GiB of NULs without using the disk
        fh.seek(2**30)
        fh.write(b"\nRuntimeError: CUDA error: no kernel image is available for execution on the device\n")
    out = explain("--file", str(log))
    assert out.returncode == 0 and out.stderr.startswith("no-kernel-image:")


def test_dev_zero_is_refused_at_once() -> None:
    out = explain("--json", "--file", "/dev/zero", timeout=20)
    assert out.returncode == 2 and "/dev/zero is not a log file" in out.stdout


def test_a_pipe_is_read_to_its_end_keeping_the_tail(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with fifo.open("wb") as fh:
            fh.write(b"x" * (3 * TAIL_BYTES) + b"\nNo space left on device\n")

    t = threading.Thread(target=writer)
    t.start()
    out = explain("--file", str(fifo))
    t.join()
    assert out.returncode == 0 and out.stderr.startswith("disk-full:")


def test_only_the_tail_is_matched() -> None:
    early = "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    assert explain_text(early + "x" * TAIL_BYTES).recognised is False
    assert explain_text("x" * TAIL_BYTES + early).recognised is True


# A log line that a known signature matches, wrapped in what a hostile log carries: a window
# title, a clipboard write (OSC 52), a clear-screen and a cursor move that erases the line above.
ESCAPES = "\x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J\x1b[1A\x1b[2K\u202e"


def test_terminal_escapes_from_a_log_are_shown_not_obeyed(tmp_path: Path) -> None:
    """explain echoed the log's matching line as it was: its escape sequences retitled the
    terminal, wrote the clipboard and cleared the screen of whoever ran it."""
    log = tmp_path / "build.log"
    log.write_text(f"{ESCAPES}ImportError: /x/ext.so: undefined symbol: _ZN3c104impl3fooEv{ESCAPES}\n")
    out = explain("--file", str(log))
    assert out.returncode == 0 and out.stderr.startswith("undefined-symbol"), out.stderr
    assert not any(c in out.stderr for c in "\x1b\x07\u202e"), repr(out.stderr)
    assert r"seen:  \x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J\x1b[1A\x1b[2K\u202eImportError" in out.stderr
    # From a pipe, in JSON: escaped by JSON itself.
    piped = run_extforge("explain", "--json", input=log.read_text(), timeout=60)
    assert "\x1b" not in piped.stdout and "\\u001b]0;owned" in piped.stdout


def test_every_line_extforge_prints_shows_control_characters() -> None:
    """The console is the one place: errors, warnings and step lines naming what others wrote (a
    package's file name in a channel, a path) pass through it as well as explain's evidence."""
    from extforge import ui
    from extforge.errors import ExtforgeError

    ui.setup_logging(0)
    ui.console.begin_capture()
    try:
        ui.log.warning("not served: %s", f"noarch/{ESCAPES}x.conda")
        ui.console.print(ExtforgeError(f"cannot read {ESCAPES}", "why", "fix").render(), markup=False)
        with ui.step(f"publish {ESCAPES}"):
            pass
    finally:
        text = ui.console.end_capture()
    assert not any(c in text for c in "\x1b\x07\u202e"), repr(text)
    assert text.count(r"\x1b]0;owned\x07") == 4 and "[2J" in text
    assert ui.printable("a\tb\nc\r\nd\x1b[1;31me\x1b[0m") == "a\tb\nc\nde"  # tabs, newlines kept; colours dropped
