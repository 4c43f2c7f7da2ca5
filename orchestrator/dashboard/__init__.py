"""The live dashboard: ``orchestrator dashboard`` and the page ``make demo`` serves.

* :mod:`.feed` -- what the page shows, built from the head's ``status``,
  ``job_board``, ``metric_samples`` and ``metric_history`` (pure frames; the curves'
  history is the head's, so a restarted page shows the past);
* :mod:`.app` -- the Starlette app: the page, Plotly's JavaScript from the
  ``plotly`` package, server-sent events, explain, a job's logs (signed-in pages), the schemes' comparison;
* :mod:`.server` -- a poller and uvicorn in threads, with one stop; binding and tokens;
* :mod:`.report` -- the static report (one HTML file with the charts, plus PNGs).

May import :mod:`orchestrator.sdk` and the layers below; never Ray (the head is
reached through a :class:`~orchestrator.core.api.HeadApi` the caller hands in).
See docs/dashboard.md.
"""
