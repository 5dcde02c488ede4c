"""One demo at a time in an output directory: the flock on its marker file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.demo import demo
from support import REPO


def test_a_demo_in_a_directory_another_holds_exits_2_in_one_line(tmp_path: Path, capsys, nothing_starts):
    """While a demo holds its directory, another there exits 2 with one line naming the holder's
    pid, and the holder's outputs stay as they are."""
    directory = tmp_path / "demo-output"
    with demo.DirectoryLock() as lock:
        demo.prepare_output_dir(directory, lock)
        (directory / "events.jsonl").write_text("the first demo's\n")
        assert demo.main(["--output-dir", str(directory), "--no-jax"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines() == [
            f"goodput demo: another demo is writing {directory.resolve()} (pid {os.getpid()}): wait for it "
            "to end, or name another --output-dir"]
        assert (directory / "events.jsonl").read_text() == "the first demo's\n"
    assert (directory / demo.MARKER).read_bytes() == demo.MARKER_LINE  # the holder's line goes with it


def test_a_new_directory_another_demo_is_making_is_refused(tmp_path: Path):
    """Two demos on one new directory: the second finds the first's lock, not a foreign file."""
    from pipeline.app.checks import UsageError

    directory = tmp_path / "new"
    with demo.DirectoryLock() as first:
        demo.prepare_output_dir(directory, first)
        with pytest.raises(UsageError, match=r"another demo is writing .* \(pid \d+\)"):
            demo.prepare_output_dir(directory)


def test_the_lock_goes_when_its_process_is_killed(tmp_path: Path):
    """A demo killed with SIGKILL leaves its directory free for the next one."""
    directory = tmp_path / "demo-output"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom pipeline.demo import demo\n"
         "lock = demo.DirectoryLock()\ndemo.prepare_output_dir(Path(sys.argv[1]), lock)\n"
         "print('held', flush=True)\ntime.sleep(60)\n", str(directory)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert f"pid {holder.pid} writes here now".encode() in (directory / demo.MARKER).read_bytes()
        from pipeline.app.checks import UsageError

        with pytest.raises(UsageError, match=f"pid {holder.pid}"):
            demo.prepare_output_dir(directory)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    with demo.DirectoryLock() as lock:  # the kernel dropped the killed process's lock as it exited
        assert demo.prepare_output_dir(directory, lock) == directory.resolve()
        assert f"pid {os.getpid()} writes here now".encode() in (directory / demo.MARKER).read_bytes()
