"""Neo4j backend of the graph store: ``store`` (the class), ``connection`` (driver, sessions, fence),
``cypher`` (every query as a constant), ``rows`` (model <-> node shaping) and one mixin per concern
(``episodes``, ``edits``, ``deletion``, ``maintenance``, ``vectors``).
"""
