"""What the extract stage leaves in Redis for the apply stage (``keys.extraction``): one ``HandOver``.

It holds the validated extraction, the LLM spend and, optionally, vectors extract already encoded, so
apply does not encode the same text again (a message's chunk is usually the slim-context query text, and
the longest text of apply's batch: the one the whole batch is padded to).

Invariants:
- Carried vectors are a cache, never the truth: apply uses one only for a text whose digest matches and
  only when the carrying worker's embedder has the same model name and dimension as its own; anything else
  (no vectors: an older producer, a trivial or rules message, a user's first message; another model) is
  encoded as before. The same texts therefore end in the same graph and index either way.
- The record is written once per extraction and read as is by every apply attempt, so a redelivered apply
  plans with the same vectors; a message sent back to extract gets a new record.
- Unknown fields are ignored and unreadable vectors count as none, so a newer producer's record still
  loads here; records from before vectors were carried (``{"extraction", "usage"}``) load unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from engram_api.models import Extraction, Usage
from engram_api.storage.embedding.embedder import Embedder

__all__ = ["CarriedVectors", "HandOver", "text_key"]


def text_key(text: str) -> str:
    """The digest a carried vector is filed under (the text itself never travels twice)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class CarriedVectors(BaseModel):
    """Vectors of some texts as little-endian float32 rows (base64 in JSON, 2 KiB a MiniLM vector);
    ``keys[i]`` is the ``text_key`` of row ``i``."""

    model_config = ConfigDict(extra="ignore", ser_json_bytes="base64", val_json_bytes="base64")
    model: str = Field(description="the encoder's model name (Embedder.model_name)")
    dim: int = Field(gt=0)
    keys: list[str]
    data: bytes

    @model_validator(mode="after")
    def _sized(self) -> CarriedVectors:
        if len(self.data) != len(self.keys) * self.dim * 4:
            raise ValueError(f"{len(self.data)} bytes do not hold {len(self.keys)} vectors of {self.dim} floats")
        return self

    @classmethod
    def pack(cls, embedder: Embedder, vectors: Mapping[str, np.ndarray]) -> CarriedVectors:
        rows = np.asarray(list(vectors.values()), dtype="<f4").reshape(len(vectors), embedder.dim)
        return cls(
            model=embedder.model_name, dim=embedder.dim, keys=[text_key(t) for t in vectors], data=rows.tobytes()
        )

    def for_texts(self, embedder: Embedder, texts: Iterable[str]) -> dict[str, np.ndarray]:
        """The carried vector of each of ``texts`` that has one, if ``embedder`` is the model that made them."""
        if (self.model, self.dim) != (embedder.model_name, embedder.dim):
            return {}
        rows = np.frombuffer(self.data, dtype="<f4").reshape(len(self.keys), self.dim)
        by_key = dict(zip(self.keys, rows, strict=True))
        return {t: by_key[k] for t in texts if (k := text_key(t)) in by_key}


class HandOver(BaseModel):
    model_config = ConfigDict(extra="ignore")
    extraction: Extraction
    usage: Usage
    vectors: CarriedVectors | None = None

    @classmethod
    def carrying(
        cls, extraction: Extraction, usage: Usage, embedder: Embedder, vectors: Mapping[str, np.ndarray]
    ) -> HandOver:
        """The record of an extraction, with the vectors (by text) ``embedder`` made that apply will need."""
        carried = CarriedVectors.pack(embedder, vectors) if vectors else None
        return cls(extraction=extraction, usage=usage, vectors=carried)

    @field_validator("vectors", mode="wrap")
    @classmethod
    def _unreadable_is_absent(cls, value: object, handler: ValidatorFunctionWrapHandler) -> CarriedVectors | None:
        # A cache must not fail the message: vectors this worker cannot read (a newer format) are encoded.
        try:
            return handler(value)
        except ValidationError:
            return None
