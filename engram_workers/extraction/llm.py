"""One litellm call per message, its JSON answer validated into ``Extraction``.

Errors are classified once, here: transport trouble (timeouts, 5xx, 429, connection) is transient and
trips the circuit breaker; an answer that is not valid JSON or breaks the schema is retried too (models
are not deterministic) but says nothing about the service's health.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from pydantic import ValidationError

from engram_api.errors import LLMError
from engram_api.models import Extraction, Usage
from engram_api.settings import Settings

__all__ = ["LLMAnswer", "call_llm", "is_service_failure", "parse_extraction", "retry_after"]

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class LLMAnswer:
    extraction: Extraction
    usage: Usage
    raw: str


def parse_extraction(raw: str) -> Extraction:
    text = _FENCE.sub("", raw.strip())
    try:
        data = json.loads(text)
    except (RecursionError, ValueError) as exc:
        if not isinstance(exc, json.JSONDecodeError):
            # Nesting too deep, or a number too long to convert: unusable all the same.
            raise LLMError(f"model answer is not usable JSON: {type(exc).__name__}", transient=False, raw=raw) from None
        raise LLMError(f"model answer is not JSON: {exc.msg} at {exc.pos}", transient=False, raw=raw) from None
    try:
        return Extraction.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LLMError(f"model answer breaks the schema at {where}: {first['msg']}", transient=False, raw=raw) from None


def _litellm():  # type: ignore[no-untyped-def]
    # litellm fetches a price list at import unless told to use its bundled copy: stay offline.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    # litellm logs every call at INFO through its own handler as well: once, at WARNING, is enough.
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    return litellm


def is_service_failure(exc: BaseException) -> bool:
    """True for failures that say the LLM service is unhealthy (these trip the breaker)."""
    return isinstance(exc, LLMError) and exc.transient


def retry_after(exc: BaseException) -> float | None:
    return getattr(exc, "retry_after", None)


def _classify(exc: Exception) -> LLMError:
    litellm = _litellm()
    transient_types = (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.RateLimitError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
    )
    status = getattr(exc, "status_code", None)
    transient = isinstance(exc, transient_types) or (isinstance(status, int) and (status >= 500 or status == 429))
    err = LLMError(f"{type(exc).__name__}: {str(exc)[:300]}", transient=transient)
    response = getattr(exc, "response", None)
    header = getattr(response, "headers", {}).get("retry-after") if response is not None else None
    try:
        err.retry_after = float(header) if header else None  # type: ignore[attr-defined]
    except ValueError:
        err.retry_after = None  # type: ignore[attr-defined]
    return err


def call_llm(settings: Settings, messages: list[dict[str, str]]) -> LLMAnswer:
    litellm = _litellm()
    try:
        response = litellm.completion(
            model=settings.llm_model,
            messages=messages,
            api_key=settings.llm_api_key,
            api_base=settings.llm_api_base,
            timeout=settings.llm_timeout_s,
            num_retries=0,  # retries are the task's job: with backoff, the breaker and the DLQ
            temperature=0,
            response_format={"type": "json_object"},
        )
    except Exception as exc:
        raise _classify(exc) from exc
    raw = response.choices[0].message.content or ""
    usage_in = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage_in, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage_in, "completion_tokens", 0) or 0)
    cost = (
        prompt_tokens / 1000 * settings.llm_input_cost_per_1k
        + completion_tokens / 1000 * settings.llm_output_cost_per_1k
    )
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost, llm_calls=1)
    try:
        return LLMAnswer(extraction=parse_extraction(raw), usage=usage, raw=raw)
    except LLMError as exc:
        exc.usage = usage  # type: ignore[attr-defined]  # tokens were spent even on a bad answer
        raise
