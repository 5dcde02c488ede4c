"""The reference's ``goodput_elastic`` module: the elastic recorder and calculator. See
``ml_goodput_measurement.src.goodput``."""

from emitter.recorder import ElasticGoodputRecorder
from ml_goodput_measurement.src.goodput import ElasticGoodputCalculator

__all__ = ["ElasticGoodputCalculator", "ElasticGoodputRecorder"]
