"""The example workloads, installed as the package ``orchestrator.resources.jobs`` (pyproject's
``package-dir`` maps this folder there) so that an installed orchestrator can hand Ray their real paths
(:func:`orchestrator.core.datafiles.job_script`). Each is a script run on its own, not a module of a package."""
