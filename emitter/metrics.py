"""Metric names for ``GoodputRecorder.record_metrics``: those of Google Cloud ML Diagnostics, so
that a run's metrics read the same there and here::

    from emitter import metrics

    recorder.record_metrics({metrics.LOSS: loss, metrics.LEARNING_RATE: lr,
                             metrics.STEP_TIME: seconds}, step=step)

Any other name the job chooses is recorded too (``limits.metrics_problem`` says which names are
valid); an attempt records at most ``MAX_METRIC_NAMES`` distinct names.
"""

#: The training loss.
LOSS = "LOSS"
#: The optimizer's learning rate at the step.
LEARNING_RATE = "LEARNING_RATE"
#: The global norm of the gradients.
GRADIENT_NORM = "GRADIENT_NORM"
#: The number of the model's weights (parameters).
TOTAL_WEIGHTS = "TOTAL_WEIGHTS"
#: Seconds the step took.
STEP_TIME = "STEP_TIME"
#: Tokens per second.
THROUGHPUT = "THROUGHPUT"
#: Seconds of one request or batch, for serving or evaluation.
LATENCY = "LATENCY"
#: Achieved TFLOP/s per device.
TFLOPS = "TFLOPS"
#: Model FLOPs utilization, a fraction between 0 and 1.
MFU = "MFU"
#: Samples per second. ML Diagnostics has no name for it; it is the name the pipeline gives a
#: ``model_metrics`` event's ``samples_per_s``.
SAMPLE_THROUGHPUT = "SAMPLE_THROUGHPUT"

#: ML Diagnostics' names, in its order.
ML_DIAGNOSTICS = (LEARNING_RATE, LOSS, GRADIENT_NORM, TOTAL_WEIGHTS, STEP_TIME, THROUGHPUT, LATENCY, TFLOPS,
                  MFU)
