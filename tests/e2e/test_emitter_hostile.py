"""The emitter in real processes, second hostile round: a signal handler that records and closes
while the job spills to its spool, and a job end recorded by an exit hook that runs after the
recorder's. Each runs on the compiled lane and on the pure-Python one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emitter.lane import PURE_PYTHON_ENV
from support.emitter import file_events

LANES = [pytest.param({}, id="compiled"), pytest.param({PURE_PYTHON_ENV: "1"}, id="pure-python")]

#: A training loop whose destination is away (a FIFO nobody reads), so that it spills to its spool
#: from its third event on; its SIGTERM handler records the end, closes the recorder and exits.
SPILLING_JOB = """
    import signal, sys
    from emitter import EmitterSettings, GoodputRecorder

    destination, spool = sys.argv[1], sys.argv[2]
    recorder = GoodputRecorder("preempted", logging_enabled=True, destination=destination,
                               settings=EmitterSettings(spool_dir=spool, max_queue_events=20,
                                                        max_batch_events=10, max_latency_s=0.005,
                                                        retry_initial_backoff_s=0.001,
                                                        retry_max_backoff_s=0.01, close_timeout_s=0.5,
                                                        collect_configs=False, discover_workload=False,
                                                        heartbeat_interval_s=None))

    def preempted(signum, frame):
        recorder.record_job_end_time()
        recorder.close()
        stats = recorder.stats
        print(f"recorded={stats.recorded} sent={stats.sent} dropped={stats.dropped} kept={stats.kept}",
              flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, preempted)
    recorder.record_job_start_time()
    print("ready", flush=True)
    step = 0
    while True:
        recorder.record_step_start_time(step)
        step += 1
"""


def spooled(spool: Path) -> dict[int, str]:
    """{seq: kind} of every event in a spool's segments (copies of one event are one)."""
    events: dict[int, str] = {}
    for path in spool.rglob("*.seg"):
        for line in path.read_bytes().splitlines()[1:]:
            seq, _, kind, _ = json.loads(line)
            events[seq] = kind
    return events


@pytest.mark.parametrize("lane", LANES)
def test_sigterm_while_the_job_spills_loses_nothing(tmp_path, lane):
    """Twenty times: SIGTERM lands while the job writes its spool; the handler records the end
    and closes. Every event the job recorded is in the spool, the interrupted one and the end
    among them, and the recorder's counts say so."""
    rng = random.Random(45)
    for attempt in range(20):
        fifo, spool = tmp_path / f"events-{attempt}.fifo", tmp_path / f"spool-{attempt}"
        os.mkfifo(fifo)
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SPILLING_JOB), f"file:{fifo}",
                                  str(spool)], env={**os.environ, **lane},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.05, 0.3))
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        counts = dict(field.split("=") for field in out.split())
        recorded, kept = int(counts["recorded"]), int(counts["kept"])
        events = spooled(spool)
        assert sorted(events) == list(range(recorded)), attempt
        assert events[recorded - 1] == "job_end"
        assert (int(counts["sent"]), int(counts["dropped"])) == (0, 0)
        assert kept >= recorded  # an event a handler's close spooled as the call it interrupted did: twice


#: A job that registers its exit hook (which records the job's end) before it makes the
#: recorder, whose own exit hook therefore runs first; it never calls close().
EXIT_HOOK_JOB = """
    import atexit, sys
    from emitter import EmitterSettings, GoodputRecorder

    atexit.register(lambda: recorder.record_job_end_time())
    recorder = GoodputRecorder("ended", logging_enabled=True, destination=sys.argv[1],
                               settings=EmitterSettings(spool_dir=sys.argv[2], close_timeout_s=1.0,
                                                        collect_configs=False, discover_workload=False))
    recorder.record_job_start_time()
    for step in range(100):
        recorder.record_step_start_time(step)
"""


@pytest.mark.parametrize("lane", LANES)
def test_a_job_end_recorded_by_an_exit_hook_that_runs_after_the_recorders_arrives(tmp_path, lane):
    """The job's end, recorded by an exit hook registered before the recorder was made (so run
    after the recorder's own), is delivered, after every step."""
    events = tmp_path / "events.jsonl"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_HOOK_JOB), f"file:{events}",
                           str(tmp_path / "spool")], env={**os.environ, **lane},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kinds = [kind for *_, kind, _ in file_events(events)]
    assert kinds == ["job_start", *["step_start"] * 100, "job_end"], done.stderr
    assert "closed; dropping" not in done.stderr


def test_a_job_end_at_exit_whose_destination_is_away_is_kept_for_the_next_process(tmp_path):
    """The same, the destination away: the end is in the spool, for the run's next process."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_HOOK_JOB), f"file:{fifo}",
                           str(tmp_path / "spool")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    events = spooled(tmp_path / "spool")
    assert sorted(events) == list(range(102)) and events[101] == "job_end"
