"""Scripted end-to-end scenarios run against a live cluster.

What lives here: the preemption day/night scenario that ``make demo`` runs
(:mod:`.preemption`).  A scenario drives the cluster only through the SDK,
as a user would.

May import: :mod:`orchestrator.sdk`, :mod:`orchestrator.deploy` and
:mod:`orchestrator.core`.
"""
