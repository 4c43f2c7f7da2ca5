"""The project's config files, installed as the package ``orchestrator.resources.configs`` (pyproject's
``package-dir`` maps this folder there). Read them with :mod:`orchestrator.core.datafiles`."""
