"""Extractors: the LLM one and the offline rule-based fallback; both return engram_api.models.Extraction."""
