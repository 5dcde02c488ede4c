"""Behaviour of the emitter: batching, latency, spilling, failures, close, fork and exit."""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import threading
import time

import numpy
import pytest

from emitter import EmitterSettings, GoodputRecorder, HostStepTimer
from emitter.testing import capture_events
from support.emitter import FlakyTransport, GatedTransport, line_count, read_events, wait_for
from support.runs import at


def test_full_batch_is_sent_without_waiting_for_latency(make_recorder, make_settings, events_file):
    """A batch that reaches max_batch_events is sent at once, long before max_latency_s."""
    recorder = make_recorder(settings=make_settings(max_batch_events=10, max_latency_s=60))
    for step in range(25):
        recorder.record_step_start_time(step, at(step))
    assert wait_for(lambda: line_count(events_file) >= 2)
    assert all(len(json.loads(line)["events"]) == 10 for line in events_file.read_text().splitlines())
    assert recorder.close()
    sizes = [len(json.loads(line)["events"]) for line in events_file.read_text().splitlines()]
    assert sizes == [10, 10, 5]


def test_partial_batch_is_sent_after_max_latency(make_recorder, make_settings, events_file):
    """Fewer events than a batch are sent within about max_latency_s, without flush."""
    recorder = make_recorder(settings=make_settings(max_batch_events=1000, max_latency_s=0.1))
    for step in range(3):
        recorder.record_step_start_time(step, at(step))
    assert wait_for(lambda: line_count(events_file) == 1, timeout=3)
    assert [e["step_start"]["step"] for e in read_events(events_file)] == [0, 1, 2]


def test_full_queue_spills_to_disk_and_loses_nothing(make_recorder, make_settings, spool_dir):
    """With the sender stuck, calls beyond max_queue_events go to the spool and arrive in order."""
    transport = GatedTransport()
    recorder = make_recorder(destination=transport,
                             settings=make_settings(max_queue_events=50, max_batch_events=20))
    for step in range(500):
        recorder.record_step_start_time(step, at(step))
    assert recorder.stats.spilled >= 400
    assert list(spool_dir.rglob("*.seg"))
    transport.open()
    assert recorder.flush(10)
    assert transport.seqs() == list(range(500))
    stats = recorder.stats
    assert (stats.recorded, stats.sent, stats.dropped) == (500, 500, 0)
    recorder.close()
    assert not list(spool_dir.rglob("*.seg"))


def _record_a_step(recorder: GoodputRecorder, step: int) -> None:
    """What a training loop records every step, at the recorder's own clock."""
    recorder.record_data_loading_start_time()
    recorder.record_data_loading_end_time()
    recorder.record_step_start_time(step)
    recorder.record_model_metrics(step, loss=0.5, step_time_s=0.1)


def test_calls_made_every_step_never_wait_for_the_worker(make_recorder, make_settings):
    """While the worker's lock is held (its thread busy with the spool, say), the calls made every
    step still queue at once; a full batch is sent when the lock is free, and nothing is lost."""
    transport = GatedTransport()
    transport.open()
    recorder = make_recorder(destination=transport, settings=make_settings(max_batch_events=10,
                                                                            max_latency_s=60))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with recorder._worker._lock:  # type: ignore[union-attr]
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    started = time.monotonic()
    for step in range(2):
        _record_a_step(recorder, step)
    assert time.monotonic() - started < 1
    release.set()
    holder.join()
    assert transport.seqs() == []
    for step in range(2, 5):
        _record_a_step(recorder, step)
    assert wait_for(lambda: len(transport.seqs()) >= 10, timeout=5)  # a full batch, unflushed
    assert recorder.flush(5)
    assert transport.seqs() == list(range(20))


def test_calls_made_every_step_spill_a_full_queue_and_count_every_event(
    make_recorder, make_settings, spool_dir
):
    """At the recorder's own clock too, calls beyond max_queue_events go to the spool; what close()
    cannot deliver stays there, and the counters account for every event."""
    transport = GatedTransport()
    recorder = make_recorder(destination=transport,
                             settings=make_settings(max_queue_events=50, max_batch_events=20))
    for step in range(125):
        _record_a_step(recorder, step)
    stats = recorder.stats
    assert (stats.recorded, stats.queued + stats.spilled) == (500, 500)
    assert stats.spilled >= 400
    transport.open()
    assert recorder.flush(10)
    assert transport.seqs() == list(range(500))
    again = make_recorder(destination=FlakyTransport(failures=10**9),
                          settings=make_settings(max_batch_events=1000))
    for step in range(10):
        _record_a_step(again, step)
    assert again.close(timeout=0.2) is False
    assert again.stats.recorded == 40
    assert list(spool_dir.rglob("*.seg"))


def test_steps_and_metrics_recorded_as_a_loop_does_arrive_as_recorded_any_other_way(
    make_recorder, make_settings
):
    """Step starts and plain-float model metrics at the recorder's clock are queued in a compact
    form: they arrive as the same events as the general path writes (an explicit time, a metric
    that is not a float), sent from memory or spilled to the spool first, with non-finite and
    missing metrics."""
    transport = GatedTransport()
    recorder = make_recorder(destination=transport,
                             settings=make_settings(max_queue_events=16, max_batch_events=8))
    metrics = [{"loss": 0.5, "step_time_s": 0.1}, {"loss": math.nan, "mfu": math.inf},
               {"tokens_per_s": -math.inf, "samples_per_s": 3.0, "tflops_per_device": 1e-300}, {}]
    for step in range(24):
        recorder.record_step_start_time(step)
        recorder.record_model_metrics(step, **metrics[step % 4])
    assert recorder.stats.spilled > 0
    for step in range(24):  # the general path: an explicit time, numpy's doubles
        recorder.record_step_start_time(step, at(0))
        recorder.record_model_metrics(step, **{k: numpy.float64(v) for k, v in metrics[step % 4].items()},
                                      time_=at(0))
    transport.open()
    assert recorder.flush(10)
    events = [event for m in transport.messages for event in json.loads(m.data)["events"]]
    bodies = [{k: v for k, v in event.items() if k not in ("seq", "time_us")} for event in events]
    assert [event["seq"] for event in events] == list(range(96))
    assert bodies[:48] == bodies[48:]
    assert bodies[5] == {"model_metrics": {"step": 2, "tokens_per_s": "-Infinity", "samples_per_s": 3.0,
                                           "tflops_per_device": 1e-300}}
    assert bodies[3] == {"model_metrics": {"step": 1, "loss": "NaN", "mfu": "Infinity"}}


def test_burst_of_a_million_calls_loses_nothing(make_recorder, make_settings, events_file):
    """1,000,000 calls in a burst to a file destination all arrive, each once, in order."""
    recorder = make_recorder(settings=make_settings(max_latency_s=2.0))
    when = at(0)
    record = recorder.record_step_start_time
    for step in range(1_000_000):
        record(step, when)
    assert recorder.close(timeout=120)
    seqs = []
    for line in events_file.read_text().splitlines():
        seqs.extend(event["seq"] for event in json.loads(line)["events"])
    assert seqs == list(range(1_000_000))
    assert recorder.stats.dropped == 0


def test_full_spool_drops_oldest_counts_and_logs_once(make_recorder, make_settings, caplog):
    """When memory and spool are both full, spooled events are dropped, counted, logged once."""
    transport = GatedTransport()
    settings = make_settings(max_queue_events=5, max_batch_events=5,
                             max_spool_bytes=4000, spool_segment_bytes=1000)
    recorder = make_recorder(destination=transport, settings=settings)
    with caplog.at_level(logging.WARNING, logger="emitter"):
        for step in range(400):
            recorder.record_step_start_time(step, at(step))
    stats = recorder.stats
    assert stats.dropped > 0
    transport.open()
    recorder.flush(10)
    delivered = transport.seqs()
    assert len(delivered) + recorder.stats.dropped == 400
    assert delivered == sorted(delivered) and delivered[-1] == 399  # the newest survive
    full_logs = [r for r in caplog.records if "is full" in r.getMessage()]
    assert len(full_logs) == 1 and full_logs[0].levelno == logging.ERROR


def test_transport_errors_are_retried_counted_and_logged_once(make_recorder, caplog):
    """A raising transport never reaches the caller: sends are retried until they succeed."""
    transport = FlakyTransport(failures=3)
    recorder = make_recorder(destination=transport)
    with caplog.at_level(logging.WARNING, logger="emitter"):
        recorder.record_job_start_time(at(0))
        recorder.record_step_start_time(0, at(1))
        assert recorder.flush(10)
    assert transport.seqs() == [0, 1]
    assert recorder.stats.send_errors == 3
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1


def test_flush_returns_false_when_nothing_can_be_delivered(make_recorder):
    """flush() honours its timeout and reports failure instead of blocking."""
    transport = FlakyTransport(failures=10**9)
    recorder = make_recorder(destination=transport)
    recorder.record_step_start_time(0, at(0))
    started = time.monotonic()
    assert recorder.flush(timeout=0.3) is False
    assert time.monotonic() - started < 2


def test_undelivered_events_are_spooled_at_close_and_sent_by_the_next_attempt(
    make_recorder, make_settings, events_file, spool_dir
):
    """What a closing attempt could not deliver, the next attempt of the run delivers first."""
    first = make_recorder(destination=FlakyTransport(failures=10**9))
    first.record_job_start_time(at(0))
    first.record_step_start_time(0, at(1))
    assert first.close(timeout=0.3) is False
    assert list(spool_dir.rglob("*.seg"))
    second = make_recorder()
    second.record_job_start_time(at(100))
    assert second.close()
    events = read_events(events_file)
    assert [(e["attempt_id"], e["seq"]) for e in events] == [
        (first.attempt_id, 0), (first.attempt_id, 1), (second.attempt_id, 0)]
    assert not list(spool_dir.rglob("*.seg"))


def test_record_after_close_is_dropped_and_counted(make_recorder, caplog):
    """A call after close() neither raises nor sends; it is counted as dropped."""
    recorder = make_recorder()
    recorder.record_job_start_time(at(0))
    assert recorder.close()
    with caplog.at_level(logging.WARNING, logger="emitter"):
        recorder.record_step_start_time(1, at(1))
    assert recorder.stats.dropped == 1
    assert any("closed" in r.getMessage() for r in caplog.records)
    assert recorder.close() is True  # idempotent


def test_disabled_recorder_is_a_no_op(events_file, make_settings):
    """logging_enabled=False (the reference's default) records nothing and needs no destination."""
    recorder = GoodputRecorder("run-1", "goodput_run-1", settings=make_settings())
    recorder.record_job_start_time()
    recorder.record_step_start_time(0)
    assert recorder.flush() and recorder.close()
    assert recorder.stats.recorded == 0
    assert not events_file.exists()


def test_enabled_recorder_without_destination_records_and_never_raises(monkeypatch, make_settings):
    """With nothing configured, the recorder looks for the fleet's topic in the background
    (tests/e2e/test_destination.py): construction and calls never fail for it."""
    monkeypatch.delenv("GOODPUT_DESTINATION", raising=False)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "some-project")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:9")  # nothing listens: sends fail
    recorder = GoodputRecorder("run-1", "goodput_run-1", True,
                               settings=make_settings(send_timeout_s=0.2, max_latency_s=0.01))
    recorder.record_job_start_time()
    recorder.record_step_start_time(0)
    assert recorder.destination == "discovered"
    assert recorder.close(timeout=0.5) is False
    assert recorder.stats.recorded == 2 and recorder.stats.sent == 0 and recorder.stats.dropped == 0


def test_a_job_end_inside_a_failure_records_the_failure():
    """A job end recorded while an exception propagates (AXLearn's ``finally``) says the attempt
    failed; a clean one says nothing, an explicit ``failed=`` wins, a clean SystemExit is clean."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", "goodput_run-1", True)
        recorder.record_job_start_time(at(0))
        with pytest.raises(RuntimeError):
            try:
                raise RuntimeError("a slice went away")
            finally:
                recorder.record_job_end_time(at(1))
        recorder.record_job_end_time(at(2))
        recorder.record_job_end_time(at(3), failed=True)
        recorder.record_job_end_time(at(4), failed=False)
        with pytest.raises(SystemExit):
            try:
                raise SystemExit(0)
            finally:
                recorder.record_job_end_time(at(5))
        with pytest.raises(SystemExit):
            try:
                raise SystemExit(3)
            finally:
                recorder.record_job_end_time(at(6))
        recorder.close()
    ends = [e.body for e in captured.events if e.kind == "job_end"]
    assert ends == [{"failed": True}, {}, {"failed": True}, {"failed": False}, {}, {"failed": True}]


def test_a_second_job_start_on_one_recorder_starts_a_new_attempt(make_settings):
    """As the reference's own tests record a restart: every event of the new attempt is under
    a new attempt id, numbered from 0, and nothing of either attempt is lost."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", "goodput_run-1", True, settings=make_settings())
        first = recorder.attempt_id
        recorder.record_job_start_time(at(0))
        recorder.record_step_start_time(0, at(1))
        recorder.record_step_start_time(1, at(2))
        recorder.record_job_start_time(at(10))
        recorder.record_step_start_time(1, at(11))
        assert recorder.flush(timeout=10)
        assert recorder.close()
    by_attempt: dict[str, list[tuple[int, str]]] = {}
    for event in captured.events:
        by_attempt.setdefault(event.attempt_id, []).append((event.seq, event.kind))
    assert recorder.attempt_id != first
    assert sorted(by_attempt[first]) == [(0, "job_start"), (1, "step_start"), (2, "step_start")]
    assert sorted(by_attempt[recorder.attempt_id]) == [(0, "job_start"), (1, "step_start")]
    assert recorder.stats.recorded == recorder.stats.sent == 5


def test_many_restarts_on_one_recorder_keep_their_counts_and_little_else(make_settings):
    """Attempts already delivered leave only their counters behind."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", "goodput_run-1", True, settings=make_settings())
        for restart in range(30):
            recorder.record_job_start_time(at(10 * restart))
            recorder.record_step_start_time(restart, at(10 * restart + 1))
            assert recorder.flush(timeout=10)
        assert len(recorder._retired) <= 2
        assert recorder.close()
    assert len({event.attempt_id for event in captured.events}) == 30
    assert recorder.stats.recorded == recorder.stats.sent == 60


def test_destination_comes_from_the_environment(monkeypatch, events_file, make_settings):
    """$GOODPUT_DESTINATION is used when no destination is passed."""
    monkeypatch.setenv("GOODPUT_DESTINATION", f"file:{events_file}")
    recorder = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings())
    recorder.record_job_start_time(at(0))
    assert recorder.close()
    assert [e["seq"] for e in read_events(events_file)] == [0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.record_step_start_time(1, "2026-01-01T00:00:00Z"), "datetime"),
        (lambda r: r.record_step_start_time(-1, at(0)), ">= 0"),
        (lambda r: r.record_step_start_time("1.5", at(0)), "integer"),
        (lambda r: r.record_step_start_time(object(), at(0)), "integer"),
        (lambda r: r.record_checkpoint_save(3, at(10), at(5)), "before start_time"),
        (lambda r: r.record_elastic_slice_counts(-1, 2, 2, at(0)), ">= 0"),
        (lambda r: r.record_model_metrics(1, loss="low"), "number"),
        (lambda r: r.flush(timeout="soon"), "timeout must be a number"),
    ],
)
def test_what_cannot_be_recorded_is_counted_and_logged_once_or_raised_when_strict(
        make_recorder, call, message, caplog):
    """A call that cannot be recorded records nothing and never raises; it is counted and logged
    once per method, and raises ValueError only on a strict recorder."""
    recorder = make_recorder()
    with caplog.at_level(logging.ERROR, logger="emitter"):
        call(recorder)
        call(recorder)
    assert recorder.stats.invalid_calls == 2
    assert recorder.stats.recorded == 0
    assert len([r for r in caplog.records if "recorded nothing" in r.getMessage()]) == 1
    strict = make_recorder(strict=True)
    with pytest.raises((ValueError, TypeError), match=message):
        call(strict)
    assert strict.stats.recorded == 0


def test_arguments_the_reference_accepts_are_recorded_as_it_records_them(
        make_recorder, events_file):
    """A float or numeric-string step is int(step), a naive datetime is local time, and a None
    badput type is the reference's default "unknown", as the reference records them."""
    recorder = make_recorder()
    naive = datetime.datetime(2026, 1, 1, 12)
    recorder.record_step_start_time(5.0, at(0))
    recorder.record_step_start_time("6", at(1))
    recorder.record_step_start_time(True, at(2))
    recorder.record_step_start_time(7, naive)
    recorder.record_custom_badput_event_start_time(at(3), None)
    recorder.record_custom_badput_event_end_time(at(4), 7)
    assert recorder.close()
    events = read_events(events_file)
    assert [e["step_start"]["step"] for e in events[:4]] == [5, 6, 1, 7]
    assert events[3]["time_us"] == int(naive.timestamp() * 1_000_000)
    assert events[4]["custom_badput_start"]["badput_type"] == "unknown"
    assert events[5]["custom_badput_end"]["badput_type"] == "7"
    assert recorder.stats.invalid_calls == 0


def test_constructor_rejects_bad_metadata_only_when_strict(make_settings, caplog):
    """Invalid run metadata raises on a strict recorder; otherwise the invalid field is logged
    and left out (the valid ones kept), invalid settings are replaced by the defaults, and a job
    name the pipeline would refuse disables recording."""
    with pytest.raises(ValueError, match="chip_count"):
        GoodputRecorder("r", chip_count=-8, settings=make_settings(), strict=True)
    with pytest.raises(ValueError, match="configured_ideal_step_time"):
        GoodputRecorder("r", configured_ideal_step_time=0, settings=make_settings(), strict=True)
    with pytest.raises(ValueError, match="job_name"):
        GoodputRecorder("", settings=make_settings(), strict=True)
    with caplog.at_level(logging.ERROR, logger="emitter"):
        lenient = GoodputRecorder("r", chip_count=-8, run_group="llm", settings=make_settings())
        nameless = GoodputRecorder("", logging_enabled=True, settings=make_settings())
        unset = GoodputRecorder("r", settings={"max_latency_s": 1})  # type: ignore[arg-type]
    assert "chip_count" not in lenient._metadata and lenient._metadata["run_group"] == "llm"
    assert unset.settings == EmitterSettings()
    nameless.record_job_start_time(at(0))
    assert nameless.stats.recorded == 0
    assert any("chip_count" in r.getMessage() for r in caplog.records)
    assert any("recording is disabled" in r.getMessage() for r in caplog.records)


def test_heartbeats_run_only_on_the_real_clock(make_recorder, make_settings, events_file):
    """Idle heartbeats are emitted when the caller passes no times, never when it passes its own."""
    quick = dict(heartbeat_interval_s=0.05, max_latency_s=0.02)
    real = make_recorder("real-clock", settings=make_settings(**quick))
    simulated = make_recorder("simulated-clock", settings=make_settings(**quick))
    real.record_job_start_time()
    now = datetime.datetime.now(datetime.timezone.utc)
    real.record_checkpoint_save(0, now - datetime.timedelta(seconds=1), now)  # explicit, by necessity
    simulated.record_job_start_time(at(0))
    assert wait_for(lambda: real.stats.recorded >= 4)
    time.sleep(0.3)  # give the simulated-clock recorder the same chance to (wrongly) heartbeat
    real.close()
    simulated.close()
    kinds: dict[str, list[str]] = {}
    for event in read_events(events_file):
        kinds.setdefault(event["run_id"], []).append(next(iter(set(event) - {
            "run_id", "attempt_id", "seq", "time_us"})))
    assert kinds["real-clock"][0] == "job_start" and "heartbeat" in kinds["real-clock"]
    assert kinds["simulated-clock"] == ["job_start"]


def test_forked_child_records_under_its_own_attempt(make_recorder, make_settings, events_file):
    """After fork the child neither re-sends the parent's queue nor disturbs the parent."""
    recorder = make_recorder(settings=make_settings(max_latency_s=60, max_batch_events=1000))
    recorder.record_job_start_time(at(0))
    recorder.record_step_start_time(0, at(1))  # both still queued in the parent at fork time
    pid = os.fork()
    if pid == 0:  # child: record, deliver, leave without running the parent's exit hooks
        try:
            recorder.record_step_start_time(50, at(50))
            os._exit(0 if recorder.close(timeout=5) else 1)
        except BaseException:  # noqa: BLE001 - a forked child must never return into pytest
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    recorder.record_step_start_time(1, at(2))
    assert recorder.close()
    events = read_events(events_file)
    parent = [(e["seq"]) for e in events if e["attempt_id"] == recorder.attempt_id]
    child = [e for e in events if e["attempt_id"] != recorder.attempt_id]
    assert parent == [0, 1, 2]
    assert len(child) == 1 and child[0]["seq"] == 0 and child[0]["step_start"] == {"step": 50}


def test_settings_are_validated():
    """Nonsensical settings are rejected when the settings object is built."""
    with pytest.raises(ValueError, match="max_batch_events"):
        EmitterSettings(max_batch_events=0)
    with pytest.raises(ValueError, match="max_latency_s"):
        EmitterSettings(max_latency_s=-1)
    with pytest.raises(ValueError, match="segment"):
        EmitterSettings(max_spool_bytes=10, spool_segment_bytes=100)


def test_reference_keywords_map_to_settings(make_settings):
    """The reference's background_* keywords keep working and set the matching settings."""
    recorder = GoodputRecorder("r", settings=make_settings(), background_batch_size=7,
                               background_max_latency_s=0.5, background_grace_period_s=3)
    assert (recorder.settings.max_batch_events, recorder.settings.max_latency_s,
            recorder.settings.close_timeout_s) == (7, 0.5, 3)


def test_a_host_step_timer_records_one_summary_per_interval_from_an_attempt_of_its_own(caplog):
    """Every ``interval_s`` of its clock a summary of the step times since the last one; the rest
    at close; what cannot be a step time is counted, never raised."""
    clock = [0.0]
    with capture_events() as captured:
        timer = HostStepTimer("run-1", host="worker-3", interval_s=60.0, clock=lambda: clock[0])
        for step in range(150):
            with timer.measure():
                clock[0] += 0.5 if step != 10 else 2.0
            clock[0] += 0.5
        timer.record(math.nan)
        timer.record("soon")  # type: ignore[arg-type]
        assert timer.close() and timer.close()
    summaries = [(e.attempt_id, e.body) for e in captured.events]
    assert [body for _, body in summaries] == [
        {"host": "worker-3", "count": 59, "mean_s": pytest.approx((58 * 0.5 + 2.0) / 59), "max_s": 2.0},
        {"host": "worker-3", "count": 60, "mean_s": 0.5, "max_s": 0.5},
        {"host": "worker-3", "count": 31, "mean_s": 0.5, "max_s": 0.5}]
    assert {attempt for attempt, _ in summaries} == {timer.recorder.attempt_id}
    assert timer.stats.invalid_calls == 2
    assert "HostStepTimer.record recorded nothing" in caplog.text


def test_a_disabled_host_step_timer_records_nothing():
    with capture_events() as captured:
        timer = HostStepTimer("run-1", enabled=False)
        timer.record(1.0)
        timer.close()
    assert captured.events == []


@pytest.mark.parametrize(("host", "count", "mean_s", "max_s", "reason"), [
    ("", 3, 1.0, 2.0, "host must not be empty"), ("h", 0, 1.0, 2.0, "count must be >= 1"),
    ("h", 3, 3.0, 2.0, "must be at most max_s")])
def test_a_host_summary_the_pipeline_would_refuse_is_refused_by_the_recorder(host, count, mean_s, max_s,
                                                                             reason):
    """The recorder applies the pipeline's own rule (``limits.host_steps_problem``): nothing it
    records is dead-lettered."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, strict=True)
        with pytest.raises(ValueError, match=reason):
            recorder.record_host_steps(host, count, mean_s, max_s)
        recorder.close()
    assert captured.events == []
