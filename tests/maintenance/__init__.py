"""Tests of the maintenance jobs, run against the real graph stores (SQLite, and Neo4j when available)."""
