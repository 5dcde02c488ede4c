"""The reference's ``monitoring_elastic`` module: ``from emitter import monitoring_elastic`` replaces
``from ml_goodput_measurement import monitoring_elastic``. See ``emitter.monitoring``."""

from emitter.monitoring import ElasticGoodputMonitor, GCPOptions

__all__ = ["ElasticGoodputMonitor", "GCPOptions"]
