"""Consolidation: how one message's extraction becomes a ``WritePlan`` against the user's graph.

``plan`` (prepare a message once, plan it: dedup, supersession, provenance), ``resolution`` (which stored
entity a mention is: context id, names and aliases, then embedding similarity, always in the user's own
graph) and ``stance`` (what the model's own statement says before its triple is trusted: negation, past,
plans, another person's value).
"""
