"""Per-user FAISS indexes, a per-process cache of the graph's vectors: ``files`` (a base file plus ``log``),
``index`` (one user's vectors in memory), ``keeper`` (keeps each copy in step with the graph), ``sync``
(catch-up by version) and ``erasure`` (a forgotten user's copies leave every host).

Nothing here is needed by another process: any copy may be lost and is rebuilt or caught up from the graph.
"""
