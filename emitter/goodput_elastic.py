"""The reference's ``goodput_elastic`` module: ``from emitter import goodput_elastic`` replaces
``from ml_goodput_measurement import goodput_elastic``. See ``emitter.goodput``."""

from emitter.goodput import ElasticGoodputCalculator
from emitter.recorder import ElasticGoodputRecorder

__all__ = ["ElasticGoodputCalculator", "ElasticGoodputRecorder"]
