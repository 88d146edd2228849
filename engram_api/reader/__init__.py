"""The read side: recall, search, context, history and the rest, straight from the stores."""

from engram_api.reader.reader import Reader
from engram_api.reader.scoring import Weights

__all__ = ["Reader", "Weights"]
