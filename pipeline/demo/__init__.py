"""The live local demo (``python -m pipeline.demo``, ``goodput demo``): the stand-ins, the stream and
a fleet of training jobs that publish through the real emitter: simulated ones
(``simulated_job``) on a paced clock (``fleet``), and a real JAX training script (``jax_train``)."""
