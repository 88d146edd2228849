"""Engram's worker side: the Celery app, the pipeline stages, maintenance jobs, the CLI and the service
launchers used for local runs and tests. Importing it starts nothing."""
