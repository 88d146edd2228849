"""The graph store: its contract (``contract``), the policy decided once above the backends (``forgetting``,
``episodes``), and one folder per backend (``neo4j/`` in production, ``sqlite/`` embedded).

The graph is the only durable source of truth for facts, entities, chunks and vectors; everything else in
``engram_api.storage`` is derived from it and may be lost.
"""
