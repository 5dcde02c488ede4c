"""The pipeline on Apache Beam: the composites (``transforms``), the stream's run tracker
(``live``) and run restore (``restore``), the graph (``graph``), options, the launcher and the
DirectRunner fit for a local stream (``direct_runner``)."""
