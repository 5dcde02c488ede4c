"""The pure core, which imports no Beam: the parser of event messages (``events``), the goodput
engine (``engine``, its ``timeline``, ``stepstats`` and ``state_coder``), what a snapshot holds
(``snapshot``), output rows (``rows``) and the cleaning of user text (``sanitize``)."""
