"""The parts of the reference's ``goodput_utils`` a user touches: the bucket and goodput enums
(same names and values) and ``GCPOptions``. See ``emitter.goodput``."""

from emitter.goodput import BadputType, GoodputType
from emitter.monitoring import GCPOptions

__all__ = ["BadputType", "GCPOptions", "GoodputType"]
