"""Vocabulary: the types every other layer speaks, and nothing that acts.

What lives here: the GPU catalogue and MIG rules, inventories, resource
requests, lease and job records with their state machines, allocations and
their one JSON codec, retry ids, priorities, configuration models, decision
cause codes (:mod:`.reasons`), typed errors, the head's API declared once as
a ``Protocol`` (:mod:`.api`), and every environment-variable name
(:mod:`.env`).

May import: the standard library, pydantic and PyYAML only -- never another
``orchestrator`` layer, never Ray or numpy.  Everything here is immutable or a
pure function, so any layer may import it.
"""
