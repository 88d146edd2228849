"""Embedded SQLite backend of the graph store: ``store`` (the class), ``connection`` (per-thread connections,
snapshots, fence), ``sql`` (schema and queries), ``rows`` (value encodings, row -> model) and one mixin per
concern (``episodes``, ``edits``, ``deletion``, ``maintenance``, ``vectors``).
"""
