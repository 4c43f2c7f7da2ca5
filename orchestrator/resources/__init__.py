"""Data files the package ships: read them through :mod:`orchestrator.core.datafiles`, never by path arithmetic.

The tree holds no code. Its parts, and where each lives in the repository:

* ``orchestrator.resources.configs`` -- the repository's top-level ``configs/`` (the cluster files, the
  priority classes, the co-location and Kubernetes configs), mapped here by ``[tool.setuptools.package-dir]``;
* ``orchestrator.resources.jobs`` -- the top-level ``jobs/`` (the example workloads Ray runs as scripts),
  mapped the same way;
* ``openb_tiny/`` -- a hand-made three-node openb trace with a known answer (its README derives it), the
  trace the dashboard's schemes' comparison replays unless the user names another.

The two mapped folders keep the project's declared layout and still install with the package: an editable
install resolves them to the checkout's folders, a wheel carries them under ``orchestrator/resources/``.
"""
