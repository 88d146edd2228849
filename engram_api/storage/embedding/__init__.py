"""Sentence embeddings: ``embedder`` (loaded once per process, ONNX Runtime or torch), ``onnx_export`` (the
one-time verified export for the fast encoder) and ``bert_graph`` (the export's graph, built without torch).
"""
