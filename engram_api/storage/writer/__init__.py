"""The single writer per user: ``lease`` (a renewed Redis lease, one writer across the fleet) and
``userwrite`` (lease, fenced graph write, FAISS index, published stamp, caches, in that order).
"""
