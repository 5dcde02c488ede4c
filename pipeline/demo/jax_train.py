"""A real JAX training job instrumented with the emitter: a small MLP regression on synthetic data.

Everything it records is measured on the wall clock: the job start, device initialization
(the reference's TPU initialization: here whatever devices JAX finds, a CPU is enough),
training preparation (parameters, optimizer state and the compiled update step), data loading,
each step with its metrics (loss, learning rate, gradient norm, step time, samples per second:
``record_metrics``), an evaluation on held-out data every ``--eval-every`` steps (a custom badput
event) and a checkpoint save every ``--checkpoint-every`` steps (the parameters written with numpy
to a temporary directory), then the job end. Its configuration (model sizes, optimizer, batch
size, steps, seed) is recorded once, with ``record_configs``, and the model's size as the
``TOTAL_WEIGHTS`` metric; the emitter adds the software and system configs it collects itself::

    pip install 'jax[cpu]'
    python -m pipeline.demo.jax_train --destination file:demo-output/jax_train.jsonl --steps 300
    python -m pipeline --events=demo-output/jax_train.jsonl --duckdb=demo-output/jax.duckdb

Only JAX process 0 records (``emitter.jax.is_process_zero``). ``--destination`` also takes a
Pub/Sub topic, ``projects/P/topics/T`` (with ``PUBSUB_EMULATOR_HOST`` for a local emulator).

``--clock-speed S --clock-meets T`` dates every event on a clock that runs ``S`` times as fast as
the wall clock and shows the wall clock's time at ``T``: the live demo (``pipeline.demo``) runs it
on its simulated fleet's clock that way, so the run takes its place in the fleet's hours. Every
duration it records (phases, steps, the step time and throughput metrics) is then on that clock,
``S`` times the measured one, as the simulated runs' durations are.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from emitter import GoodputRecorder, metrics
from emitter.jax import is_process_zero

_LOG = logging.getLogger("jax_train")
FEATURES = 32
LEARNING_RATE = 0.01
MOMENTUM = 0.9


class PacedClock:
    """The time events are dated with: the wall clock (UTC), or, at a ``speed`` other than 1, a
    clock running ``speed`` times as fast that shows the wall clock's time at ``meets``. Read
    from ``time.monotonic()`` from the moment it is made, so a step of the system clock moves no
    event."""

    def __init__(self, speed: float = 1.0, meets: datetime.datetime | None = None) -> None:
        self.speed = speed
        self._wall = datetime.datetime.now(datetime.timezone.utc)
        self._monotonic = time.monotonic()
        self._meets = self._wall if meets is None else meets

    def at(self, monotonic: float) -> datetime.datetime:
        """The time when ``time.monotonic()`` is ``monotonic``."""
        wall = self._wall + datetime.timedelta(seconds=monotonic - self._monotonic)
        return self._meets + (wall - self._meets) * self.speed

    def now(self) -> datetime.datetime:
        return self.at(time.monotonic())


def _utc_time(text: str) -> datetime.datetime:
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return parsed.replace(tzinfo=datetime.timezone.utc) if parsed.tzinfo is None else parsed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--destination", default=os.environ.get("GOODPUT_DESTINATION")
                        or "file:demo-output/jax_train.jsonl",
                        help="file:PATH or projects/P/topics/T (default: $GOODPUT_DESTINATION, else "
                             "%(default)s)")
    parser.add_argument("--run-id", default="jax-mlp-regression", help="the run id (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="examples per step (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="width of the hidden layers (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="save a checkpoint every this many steps; 0 for none (default: %(default)s)")
    parser.add_argument("--eval-every", type=int, default=100,
                        help="evaluate every this many steps; 0 for never (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--clock-speed", type=float, default=1.0, metavar="S",
                        help="date events on a clock S times as fast as the wall clock, which shows the "
                             "wall clock's time at --clock-meets (default: %(default)s, the wall clock)")
    parser.add_argument("--clock-meets", type=_utc_time, default=None, metavar="TIME",
                        help="with --clock-speed: when that clock shows the wall clock's time, an ISO 8601 "
                             "time (UTC unless it names its zone)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.hidden < 1:
        parser.error("--steps, --batch-size and --hidden must be positive")
    if not 0 < args.clock_speed < float("inf"):
        parser.error("--clock-speed must be positive")
    if args.clock_speed != 1.0 and args.clock_meets is None:
        parser.error("--clock-speed needs --clock-meets: when the clock shows the wall clock's time")
    return args


def train(args: argparse.Namespace, clock: PacedClock, job_start: datetime.datetime) -> float:
    """Trains, recording every phase on ``clock``; returns the final training loss."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    now = clock.now
    init_start = now()
    devices = jax.devices()
    jnp.zeros(()).block_until_ready()  # the backend is up and runs a computation
    init_end = now()
    if args.destination.startswith("file:"):
        Path(args.destination[len("file:"):]).parent.mkdir(parents=True, exist_ok=True)
    recorder = GoodputRecorder(args.run_id, f"goodput_{args.run_id}", is_process_zero(),
                               destination=args.destination, run_group="examples",
                               accelerator_type=devices[0].platform, chip_count=jax.device_count(),
                               labels={"framework": "jax", "model": "mlp"})
    with recorder:
        recorder.record_job_start_time(job_start)
        recorder.record_tpu_init_start_time(init_start)
        recorder.record_tpu_init_end_time(init_end)

        recorder.record_training_preparation_start_time(now())
        features = FEATURES
        key = jax.random.PRNGKey(args.seed)
        k1, k2, k3 = jax.random.split(key, 3)

        def scale(fan_in: int) -> float:
            return float((2.0 / fan_in) ** 0.5)

        params = {
            "w1": jax.random.normal(k1, (features, args.hidden)) * scale(features),
            "b1": jnp.zeros(args.hidden),
            "w2": jax.random.normal(k2, (args.hidden, args.hidden)) * scale(args.hidden),
            "b2": jnp.zeros(args.hidden),
            "w3": jax.random.normal(k3, (args.hidden, 1)) * scale(args.hidden),
            "b3": jnp.zeros(1),
        }
        velocity = jax.tree_util.tree_map(jnp.zeros_like, params)

        def loss_fn(p: Any, x: Any, y: Any) -> Any:
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            h = jax.nn.relu(h @ p["w2"] + p["b2"])
            return jnp.mean((h @ p["w3"] + p["b3"] - y) ** 2)

        def update(p: Any, v: Any, x: Any, y: Any) -> tuple[Any, Any, Any, Any]:
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            v = jax.tree_util.tree_map(lambda vi, g: MOMENTUM * vi + g, v, grads)
            p = jax.tree_util.tree_map(lambda pi, vi: pi - LEARNING_RATE * vi, p, v)
            grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
            return p, v, loss, grad_norm

        x_spec = jax.ShapeDtypeStruct((args.batch_size, features), jnp.float32)
        y_spec = jax.ShapeDtypeStruct((args.batch_size, 1), jnp.float32)
        step_fn = jax.jit(update).lower(params, velocity, x_spec, y_spec).compile()
        eval_fn = jax.jit(loss_fn)
        recorder.record_training_preparation_end_time(now())

        recorder.record_data_loading_start_time(now())
        rng = np.random.default_rng(args.seed)
        examples = args.batch_size * 64
        true_w = (rng.normal(size=(features, 1)) / features**0.5).astype(np.float32)
        x_all = rng.normal(size=(examples + 1024, features)).astype(np.float32)
        y_all = np.sin(x_all @ true_w) + 0.1 * (x_all[:, :1] ** 2) \
            + 0.05 * rng.normal(size=(len(x_all), 1)).astype(np.float32)
        x_train, y_train = jnp.asarray(x_all[:examples]), jnp.asarray(y_all[:examples])
        x_eval, y_eval = jnp.asarray(x_all[examples:]), jnp.asarray(y_all[examples:])
        loaded = now()
        recorder.record_data_loading_end_time(loaded)
        weights = sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(params))
        recorder.record_configs({
            "model": {"name": "mlp", "features": features, "hidden": args.hidden, "layers": 3,
                      "weights": weights},
            "optimizer": {"name": "sgd_momentum", "learning_rate": LEARNING_RATE, "momentum": MOMENTUM},
            "data": {"batch_size": args.batch_size, "train_examples": examples, "eval_examples": 1024},
            "steps": args.steps, "seed": args.seed, "eval_every": args.eval_every,
            "checkpoint_every": args.checkpoint_every,
        }, time_=loaded)
        recorder.record_metrics({metrics.TOTAL_WEIGHTS: weights}, step=0, time_=loaded)

        checkpoints = Path(tempfile.mkdtemp(prefix="jax-train-ckpt-"))
        batches = examples // args.batch_size
        loss = float("nan")
        for step in range(args.steps):
            start = now()
            recorder.record_step_start_time(step, start)
            first = (step % batches) * args.batch_size
            x = x_train[first:first + args.batch_size]
            y = y_train[first:first + args.batch_size]
            params, velocity, loss_value, norm_value = step_fn(params, velocity, x, y)
            loss, grad_norm = (float(value) for value in jax.device_get((loss_value, norm_value)))  # waits
            end = now()
            seconds = (end - start).total_seconds()
            recorder.record_metrics({metrics.LOSS: loss, metrics.LEARNING_RATE: LEARNING_RATE,
                                     metrics.GRADIENT_NORM: grad_norm, metrics.STEP_TIME: seconds,
                                     metrics.SAMPLE_THROUGHPUT: args.batch_size / max(seconds, 1e-9)},
                                    step=step, time_=end)
            if args.eval_every and (step + 1) % args.eval_every == 0:
                recorder.record_custom_badput_event_start_time(now(), "EVAL_STEP")
                eval_loss = float(eval_fn(params, x_eval, y_eval))
                recorder.record_custom_badput_event_end_time(now(), "EVAL_STEP")
                _LOG.info("step %d: loss %.4f, eval loss %.4f", step, loss, eval_loss)
            if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                save_start = now()
                host: dict[str, Any] = {name: np.asarray(value) for name, value in params.items()}
                np.savez(checkpoints / f"step_{step:08d}.npz", **host)
                recorder.record_checkpoint_save(step, save_start, now())
        recorder.record_job_end_time(now())
        for saved in checkpoints.iterdir():
            saved.unlink()
        checkpoints.rmdir()
        if not recorder.flush(timeout=30):
            _LOG.warning("some events were not delivered yet; they stay in the spool")
    return loss


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()
    args = parse_args(argv)
    clock = PacedClock(args.clock_speed, args.clock_meets)
    job_start = clock.at(began)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        import jax  # noqa: F401
    except ImportError:
        print("jax_train: JAX is not installed (pip install 'jax[cpu]')", file=sys.stderr)
        return 2
    started = time.monotonic()
    loss = train(args, clock, job_start)
    print(f"jax_train: {args.steps} steps of run {args.run_id!r} in {time.monotonic() - started:.1f} s, "
          f"final loss {loss:.4f}; events sent to {args.destination}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
