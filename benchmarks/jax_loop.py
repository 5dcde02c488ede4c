"""A JAX training loop timed with a goodput recorder on and off: the code that both processes of
the ``training_loop`` benchmark run, so that both recorders are timed in the same loop.

It imports the standard library, numpy and JAX, nothing of this project, because it runs in two
environments: in this project's, as ``python -m benchmarks.jax_loop CONFIG OUTPUT`` with this
project's recorder (``emitter.GoodputRecorder``, writing to a file in a temporary directory),
and in the reference's ``.venv-reference``, whose worker (``tools.reference_runner``, operation
``training_loop``) loads this file and calls ``measure`` with the reference's recorder.

The model is ``pipeline/demo/jax_train.py``'s: an MLP regression (32 features, two hidden ReLU
layers of one width, one output, mean squared error) trained by SGD with momentum, its update
step compiled with ``jax.jit`` before anything is timed. A step, as a MaxText-style loop runs it:

    data-loading start | the next batch onto the device | data-loading end, step start
    | the update step, blocked on until ready | loss to the host | model metrics
    [every CHECKPOINT_EVERY steps: checkpoint start | parameters to the host | checkpoint save]

where ``|`` separates the loop's work from the recorder's hooks (``Plan``). With the recorder off
the hooks do nothing; the loop calls them all the same, so both run the same instrumentation.
Each hook is timed in thread CPU time (``time.thread_time``), which gives the caller's CPU of the
record calls.

Short blocks of steps (one checkpoint period each) alternate on and off, in pairs whose order
alternates (on, off; off, on; ...), so that the machine's drift, which is far larger than the
effect over seconds, cancels within each pair. Every block starts after a garbage collection;
the objects alive after the compile are frozen out of the collector (``gc.freeze``) first. The
recorder's background thread wakes when its batch fills (in an on block) and every max latency
(in either): each block reads the thread's CPU clock before its first step and after its last,
and a pair is quiet when the thread ran in neither block, so that the paired differences of
quiet pairs measure the record calls' own effect on the step. The thread's work is read from its
CPU clock over as many on blocks again, run back to back after the pairs, to their final flush,
and counted on its own.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FEATURES = 32
CHECKPOINT_EVERY = 10
#: SGD's learning rate: at the demo's 0.01 the widest size diverges within 20 steps, and a
#: recorder would be timed recording non-finite losses, which a converging run never records.
LEARNING_RATE = 0.001
#: Untimed blocks (one on, one off) after the compile, per size.
WARMUP_PAIRS = 1
#: The background thread of each recorder, by name.
OURS_THREAD = "goodput-emitter"
REFERENCE_THREAD = "google.cloud.logging.Worker"  # google-cloud-logging's BackgroundThreadTransport
_UTC = datetime.timezone.utc


class Plan:
    """The recorder's hooks in a training step; this one records nothing (the recorder off)."""

    #: Events one step records, and one checkpoint.
    EVENTS_PER_STEP = 0
    EVENTS_PER_CHECKPOINT = 0

    def data_loading_start(self) -> None:
        """Before the batch is loaded."""

    def data_loading_end(self, step: int) -> None:
        """After the batch is loaded, before the update step: the step starts."""

    def step_end(self, step: int, loss: float, step_s: float) -> None:
        """After the step's loss reached the host."""

    def checkpoint_start(self) -> Any:
        """Before a checkpoint; returns what ``checkpoint_end`` is given."""
        return None

    def checkpoint_end(self, step: int, started: Any) -> None:
        """After a checkpoint of the parameters after ``step``."""

    def job_start(self) -> None:
        """Once, before the first step."""


class _Recording(Plan):
    """Hooks that call a recorder, which records the job's start."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def job_start(self) -> None:
        self.recorder.record_job_start_time()


class RecorderPlan(_Recording):
    """The hooks both recorders share: the job start, data loading and the step start."""

    def data_loading_start(self) -> None:
        self.recorder.record_data_loading_start_time()

    def data_loading_end(self, step: int) -> None:
        self.recorder.record_data_loading_end_time()
        self.recorder.record_step_start_time(step)

    def checkpoint_start(self) -> Any:
        return datetime.datetime.now(_UTC)


class OursPlan(RecorderPlan):
    """This project's recorder: data loading, step start, model metrics, checkpoint saves."""

    EVENTS_PER_STEP = 4
    EVENTS_PER_CHECKPOINT = 1

    def step_end(self, step: int, loss: float, step_s: float) -> None:
        self.recorder.record_model_metrics(step, loss=loss, step_time_s=step_s)

    def checkpoint_end(self, step: int, started: Any) -> None:
        self.recorder.record_checkpoint_save(step, started, datetime.datetime.now(_UTC))


class OursStepsPlan(_Recording):
    """This project's recorder, step starts and model metrics only."""

    EVENTS_PER_STEP = 2

    def data_loading_end(self, step: int) -> None:
        self.recorder.record_step_start_time(step)

    def step_end(self, step: int, loss: float, step_s: float) -> None:
        self.recorder.record_model_metrics(step, loss=loss, step_time_s=step_s)


class ReferencePlan(RecorderPlan):
    """The reference's recorder: data loading and step start. It has no model metrics, and its
    checkpoint call, ``record_checkpoint_progress``, records nothing (Orbax logs checkpoints
    itself), but it is called as a loop would call it."""

    EVENTS_PER_STEP = 3
    EVENTS_PER_CHECKPOINT = 0

    def checkpoint_end(self, step: int, started: Any) -> None:
        self.recorder.record_checkpoint_progress(step, started)


@dataclasses.dataclass
class Subject:
    """One recorder in the loop: its hooks by name (a size's ``plan``, ``all`` by default), how
    to flush it, its background thread's name, and the events it has recorded and delivered so
    far."""

    plans: dict[str, Plan]
    flush: Callable[[], Any]
    thread_name: str
    recorded: Callable[[], int]
    delivered: Callable[[], int]


class _Model:
    """The MLP, its optimizer state, host batches, and the compiled update step."""

    def __init__(self, hidden: int, batch: int, seed: int = 0) -> None:
        import jax
        import jax.numpy as jnp
        import numpy as np

        self._jax = jax
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)

        def scale(fan_in: int) -> float:
            return float((2.0 / fan_in) ** 0.5)

        params = {
            "w1": jax.random.normal(k1, (FEATURES, hidden)) * scale(FEATURES),
            "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, hidden)) * scale(hidden),
            "b2": jnp.zeros(hidden),
            "w3": jax.random.normal(k3, (hidden, 1)) * scale(hidden),
            "b3": jnp.zeros(1),
        }
        self.state = (params, jax.tree_util.tree_map(jnp.zeros_like, params))

        def loss_fn(p: Any, x: Any, y: Any) -> Any:
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            h = jax.nn.relu(h @ p["w2"] + p["b2"])
            return jnp.mean((h @ p["w3"] + p["b3"] - y) ** 2)

        def update(state: Any, x: Any, y: Any) -> tuple[Any, Any]:
            p, v = state
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            v = jax.tree_util.tree_map(lambda vi, g: 0.9 * vi + g, v, grads)
            p = jax.tree_util.tree_map(lambda pi, vi: pi - LEARNING_RATE * vi, p, v)
            return (p, v), loss

        rng = np.random.default_rng(seed)
        true_w = (rng.normal(size=(FEATURES, 1)) / FEATURES**0.5).astype(np.float32)
        self.batches = []
        for _ in range(16):
            x = rng.normal(size=(batch, FEATURES)).astype(np.float32)
            y = np.sin(x @ true_w) + 0.05 * rng.normal(size=(batch, 1))
            self.batches.append((x, y.astype(np.float32)))
        x_spec = jax.ShapeDtypeStruct((batch, FEATURES), jnp.float32)
        y_spec = jax.ShapeDtypeStruct((batch, 1), jnp.float32)
        self.update = jax.jit(update).lower(self.state, x_spec, y_spec).compile()

    def load(self, step: int) -> Any:
        """The step's batch, put on the device."""
        return self._jax.device_put(self.batches[step % len(self.batches)])

    def checkpoint(self) -> Any:
        """The parameters copied to the host, as a checkpoint save starts (nothing is written to
        disk, whose timings would only add noise)."""
        return self._jax.device_get(self.state[0])


@dataclasses.dataclass
class _Block:
    steps: list[float]  # seconds of each step, hooks included
    hook_cpu_s: float  # thread CPU inside the hooks
    hooks: int
    full_collections: int
    background_s: float  # CPU the recorder's thread spent during the block

    @property
    def per_step_s(self) -> float:
        return sum(self.steps) / len(self.steps)


def _run_block(model: _Model, plan: Plan, background: Callable[[], float], first: int, steps: int) -> _Block:
    gc.collect()
    full_before = gc.get_stats()[2]["collections"]
    background_before = background()
    clock, cpu = time.perf_counter, time.thread_time
    times: list[float] = []
    hook_cpu, hooks = 0.0, 0
    for step in range(first, first + steps):
        started = clock()
        spent = cpu()
        plan.data_loading_start()
        hook_cpu += cpu() - spent
        x, y = model.load(step)
        spent = cpu()
        plan.data_loading_end(step)
        hook_cpu += cpu() - spent
        step_started = clock()
        model.state, loss = model.update(model.state, x, y)
        loss.block_until_ready()
        value = float(loss)
        step_s = clock() - step_started
        if not math.isfinite(value):
            raise RuntimeError(f"step {step}: the loss is {value}: the model diverged")
        spent = cpu()
        plan.step_end(step, value, step_s)
        hook_cpu += cpu() - spent
        hooks += 3
        if (step + 1) % CHECKPOINT_EVERY == 0:
            spent = cpu()
            token = plan.checkpoint_start()
            hook_cpu += cpu() - spent
            model.checkpoint()
            spent = cpu()
            plan.checkpoint_end(step, token)
            hook_cpu += cpu() - spent
            hooks += 2
        times.append(clock() - started)
    return _Block(times, hook_cpu, hooks, gc.get_stats()[2]["collections"] - full_before,
                  background() - background_before)


def _thread_cpu_clock(name: str) -> Callable[[], float]:
    """The CPU seconds so far of the one live thread called ``name``."""
    found = [thread for thread in threading.enumerate() if thread.name == name]
    if len(found) != 1 or found[0].ident is None:
        raise RuntimeError(f"expected one live thread {name!r}, found {len(found)}")
    clock_id = time.pthread_getcpuclockid(found[0].ident)
    return lambda: time.clock_gettime(clock_id)


def measure_size(subject: Subject, size: dict[str, Any], first_step: int = 0) -> dict[str, Any]:
    """Times ``size`` ({name, hidden, batch, pairs, plan}) with the recorder on and off, in blocks
    of one checkpoint period."""
    pairs, on = int(size["pairs"]), subject.plans[size.get("plan", "all")]
    steps = CHECKPOINT_EVERY
    model = _Model(int(size["hidden"]), int(size["batch"]))
    background = _thread_cpu_clock(subject.thread_name)
    # What is alive now (JAX, the recorder's library, the model) stays out of the collections
    # before each block, which would take tens of milliseconds each otherwise.
    gc.collect()
    gc.freeze()
    off, step = Plan(), first_step
    for _ in range(WARMUP_PAIRS):
        for plan in (on, off):
            _run_block(model, plan, background, step, steps)
            step += steps
    subject.flush()
    on_blocks: list[_Block] = []
    off_blocks: list[_Block] = []
    recorded_before = subject.recorded()
    for pair in range(pairs):
        for plan in ((on, off) if pair % 2 == 0 else (off, on)):
            block = _run_block(model, plan, background, step, steps)
            step += steps
            (on_blocks if plan is on else off_blocks).append(block)
    started = time.perf_counter()
    subject.flush()
    flush_s = time.perf_counter() - started
    # The reference counts the entries written, by the end of the flush: the blocks' total.
    expected = pairs * (steps * on.EVENTS_PER_STEP + on.EVENTS_PER_CHECKPOINT)
    events = subject.recorded() - recorded_before
    if events != expected:
        raise RuntimeError(f"{size['name']}: the on blocks recorded {events} events, expected {expected}")
    # The background thread is timed over as many on blocks again, run one after another: between
    # the pairs' on blocks, off blocks would take half of its wakes (it wakes every max latency,
    # whatever is queued) and charge their cost to half the events a loop records.
    background_before = background()
    for _ in range(pairs):
        _run_block(model, on, background, step, steps)
        step += steps
    subject.flush()
    background_cpu_s = background() - background_before
    gc.unfreeze()
    if subject.recorded() - recorded_before != 2 * expected:
        raise RuntimeError(f"{size['name']}: the on blocks recorded {subject.recorded() - recorded_before} "
                           f"events, expected {2 * expected}")
    # The hooks' own timing costs CPU even when they do nothing: the off blocks measure it.
    empty_hook_s = sum(b.hook_cpu_s for b in off_blocks) / sum(b.hooks for b in off_blocks)
    return {
        "name": size["name"], "hidden": size["hidden"], "batch": size["batch"],
        "plan": size.get("plan", "all"), "block_steps": steps,
        "pairs": [[on_.per_step_s, off_.per_step_s] for on_, off_ in zip(on_blocks, off_blocks, strict=True)],
        "quiet": [on_.background_s == 0 and off_.background_s == 0
                  for on_, off_ in zip(on_blocks, off_blocks, strict=True)],
        "on_steps": [s for block in on_blocks for s in block.steps],
        "off_steps": [s for block in off_blocks for s in block.steps],
        "flush_s": flush_s,
        "events": events,
        "caller_cpu_s": sum(b.hook_cpu_s for b in on_blocks) - empty_hook_s * sum(b.hooks for b in on_blocks),
        "background_cpu_s": background_cpu_s,
        "full_collections_on": sum(block.full_collections for block in on_blocks),
        "full_collections_off": sum(block.full_collections for block in off_blocks),
        "last_step": step,
    }


def measure(subject: Subject, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Each size of ``config["sizes"]`` measured in turn, after the job's start is recorded;
    fails unless every event recorded was delivered."""
    subject.plans["all"].job_start()
    subject.flush()
    results, step = [], 0
    for size in config["sizes"]:
        result = measure_size(subject, size, step)
        step = result["last_step"]
        results.append(result)
    subject.flush()
    recorded, delivered = subject.recorded(), subject.delivered()
    if delivered != recorded:
        raise RuntimeError(f"{delivered:,} of {recorded:,} events were delivered")
    return results


def measure_reference(recorder: Any, delivered: Callable[[], int],
                      config: dict[str, Any]) -> list[dict[str, Any]]:
    """``measure`` with the reference's recorder (``ml_goodput_measurement.src.goodput``), its
    entries counted by ``delivered``, the offline Cloud Logging API's counter. The reference
    counts nothing itself, so a size's events are the entries its API received by the end of
    the size's flush, which ``measure_size`` checks against what the plan writes."""
    return measure(Subject({"all": ReferencePlan(recorder)}, recorder.flush, REFERENCE_THREAD,
                           delivered, delivered), config)


def measure_ours(config: dict[str, Any]) -> list[dict[str, Any]]:
    """``measure`` with this project's recorder, default settings, writing to a file in a
    temporary directory."""
    from emitter import EmitterSettings, GoodputRecorder

    with tempfile.TemporaryDirectory() as directory:
        recorder = GoodputRecorder("bench-training-loop", logging_enabled=True,
                                   destination=f"file:{directory}/events.jsonl",
                                   settings=EmitterSettings(spool_dir=Path(directory) / "spool"))
        with recorder:
            plans = {"all": OursPlan(recorder), "steps": OursStepsPlan(recorder)}
            return measure(Subject(plans, recorder.flush, OURS_THREAD,
                                   lambda: recorder.stats.recorded, lambda: recorder.stats.sent),
                           config)


def main(argv: list[str]) -> int:
    """``CONFIG OUTPUT``: measures the sizes of the JSON ``CONFIG`` with this project's recorder
    and writes the results to the file ``OUTPUT`` as JSON."""
    config, output = argv
    Path(output).write_text(json.dumps(measure_ours(json.loads(config))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
