"""The graph-store contract suite: every backend must pass all of it."""
