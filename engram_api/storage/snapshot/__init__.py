"""A small user's whole graph held in memory at one stamp (``graph``), its facts and chunks as rows (``rows``)
and its BM25 keyword index (``keywords``): recall's graph step without a round trip to the store.
"""
