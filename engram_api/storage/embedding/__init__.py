"""Sentence embeddings: ``embedder`` (loaded once per process, ONNX Runtime or torch) and ``onnx_export``
(the one-time verified export for the fast encoder).
"""
