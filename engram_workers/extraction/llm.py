"""One litellm call per message, its JSON answer read tolerantly into ``Extraction`` (``answer.read_answer``).

Errors are classified once, here: transport trouble (timeouts, 5xx, 429, connection) is transient and
trips the circuit breaker; an answer with no usable JSON is retried once at once with the real problem
appended (a model told what was wrong usually fixes it; resending the same prompt at temperature 0 gets
the same answer), then fails the attempt without saying anything about the service's health. An answer
cut off at ``max_tokens`` is asked again once with twice the room; cut off again, its complete items are
kept. At most two calls per attempt, whatever goes wrong.

The call's own CPU (``ops/bench/run.py --only llm`` measures it against a bare httpx POST in the same run):
litellm costs ~5x a bare HTTP call (~10 ms against ~2 ms), spread thin over its request building, response
objects and the success logging it runs in a background thread; none of that can be switched off through
its API. What is avoidable is cut here: litellm is set up once per process, the response format is looked
up once per model, and our own prices are passed with every call (litellm prices each answer for its
logging, and an unknown model name, a self-hosted one, otherwise sends it through a cost-map search).
Calls stay synchronous on the extract worker's thread pool: one event loop with ``litellm.acompletion``
and the same calls in flight measured ~1.1-1.25x the pool's CPU per call, so it would not pay for itself.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engram_api import tracing
from engram_api.errors import LLMError
from engram_api.models import Extraction, Usage
from engram_api.settings import Settings
from engram_workers.extraction.answer import read_answer
from engram_workers.extraction.prompt import RESPONSE_SCHEMA

__all__ = [
    "Completion",
    "LLMAnswer",
    "call_llm",
    "complete",
    "completion_kwargs",
    "is_service_failure",
    "retry_after",
]

log = logging.getLogger(__name__)

Completion = tuple[str, Usage]


@dataclass(frozen=True, slots=True)
class LLMAnswer:
    extraction: Extraction
    usage: Usage
    raw: str
    skipped: list[str] = field(default_factory=list)


class CutOff(LLMError):
    """The model stopped at ``max_tokens``: ``raw`` is the answer as far as it got."""


@functools.cache
def _litellm():  # type: ignore[no-untyped-def]
    """litellm, set up once per process (the import and these settings are not per-call work)."""
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


@functools.lru_cache(maxsize=64)
def response_format(model: str, mode: str = "auto") -> dict[str, Any]:
    """The answer's shape as the request asks for it (``Settings.llm_output_mode``): the extraction's JSON
    Schema (``schema``; litellm maps it to a forced tool for Anthropic, whose API ignores ``json_object``,
    and to a grammar for Ollama), plain JSON mode (``json``), or ``auto``: the schema where litellm says
    the provider takes one. Looked up once per model name and mode (litellm's model-info lookup walks its
    cost map); callers must not mutate the answer."""
    if mode == "auto":
        try:
            mode = "schema" if _litellm().supports_response_schema(model=model) else "json"
        except Exception:  # an unknown model name: litellm raises rather than answer "no"
            mode = "json"
    if mode == "schema":
        return {"type": "json_schema", "json_schema": {"name": "extraction", "schema": RESPONSE_SCHEMA}}
    return {"type": "json_object"}


def cache_marked(model: str, messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The messages, with the fixed system part marked cacheable for Claude: Anthropic caches a prefix only
    where the request says so (OpenAI and others cache long prefixes by themselves), and the ~1,400-token
    system part is the same for every call, so the mark makes it ~10% of its price after the first call."""
    if "claude" not in model.lower():
        return messages
    return [
        {**m, "content": [{"type": "text", "text": m["content"], "cache_control": {"type": "ephemeral"}}]}
        if m["role"] == "system" and isinstance(m["content"], str)
        else m
        for m in messages
    ]


def completion_kwargs(
    settings: Settings, messages: list[dict[str, str]], max_tokens: int | None = None
) -> dict[str, Any]:
    """The arguments of every model call (``litellm.completion`` and ``acompletion`` take the same)."""
    model = settings.llm_model or ""
    return {
        "model": model,
        "messages": cache_marked(model, messages),
        "api_key": settings.llm_api_key,
        "api_base": settings.llm_api_base,
        "timeout": settings.llm_timeout_s,
        "num_retries": 0,  # retries are the task's job: with backoff, the breaker and the DLQ
        "temperature": 0,
        "max_tokens": max_tokens or settings.llm_max_output_tokens,
        "response_format": response_format(model, settings.llm_output_mode),
        # Our own prices: litellm prices every answer itself (for its logging), and an unknown model name
        # (a self-hosted one, the stand-in) sends it through a cost-map search on every call; given the
        # prices, it reads them from here. Its figure then also agrees with ours (Usage.cost_usd).
        "input_cost_per_token": settings.llm_input_cost_per_1k / 1000,
        "output_cost_per_token": settings.llm_output_cost_per_1k / 1000,
        # Provider parameters (num_ctx, top_p, ...): the settings refuse the keys above except temperature.
        **settings.llm_extra_params,
    }


@tracing.traced("engram.llm", lambda settings, *_, **__: {"gen_ai.request.model": settings.llm_model or ""})
def complete(settings: Settings, messages: list[dict[str, str]], max_tokens: int | None = None) -> Completion:
    """One model call: the answer's text and what it cost; ``LLMError`` (classified) when it fails,
    ``CutOff`` (with the text so far) when the model stopped at ``max_tokens``."""
    litellm = _litellm()
    try:
        response = litellm.completion(**completion_kwargs(settings, messages, max_tokens))
    except Exception as exc:
        raise _classify(exc) from exc
    choice = response.choices[0]
    raw = choice.message.content or ""
    usage_in = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage_in, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage_in, "completion_tokens", 0) or 0)
    cost = (
        prompt_tokens / 1000 * settings.llm_input_cost_per_1k
        + completion_tokens / 1000 * settings.llm_output_cost_per_1k
    )
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost, llm_calls=1)
    if getattr(choice, "finish_reason", None) == "length":
        room = max_tokens or settings.llm_max_output_tokens
        err = CutOff(f"model answer cut off at max_tokens={room}", transient=False, raw=raw)
        err.usage = usage  # type: ignore[attr-defined]
        raise err
    return raw, usage


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cost_usd=a.cost_usd + b.cost_usd,
        llm_calls=a.llm_calls + b.llm_calls,
    )


def _direct(call: Callable[[], Completion]) -> Completion:
    return call()


def call_llm(
    settings: Settings,
    messages: list[dict[str, str]],
    *,
    admit: Callable[[Callable[[], Completion]], Completion] = _direct,
    names: Mapping[str, str] | None = None,
) -> LLMAnswer:
    """The model's extraction: one call, and at most one more. An answer cut off at ``max_tokens`` is asked
    again once with twice the room (resent as it was, it would be cut at the same place); cut off again,
    its complete items are kept. An unusable answer is asked again once with the real error appended.
    ``admit`` wraps every model call (the stage passes its rate limit and circuit breaker), so a second
    call is admitted like the first and no call reaches the model while the breaker is open. ``names``:
    the names of the context handles, for statements the model left out."""
    spent = Usage()
    room = settings.llm_max_output_tokens

    def ask(turns: list[dict[str, str]]) -> tuple[str, bool]:
        """The answer's text, and whether it was cut off; every call's tokens are counted in ``spent``."""
        nonlocal spent
        try:
            raw, usage = admit(lambda: complete(settings, turns, room))
        except LLMError as exc:
            spent = _add(spent, getattr(exc, "usage", None) or Usage())
            exc.usage = spent  # type: ignore[attr-defined]  # tokens were spent even on failed calls
            if not isinstance(exc, CutOff):
                raise
            return exc.raw or "", True
        spent = _add(spent, usage)
        return raw, False

    raw, cut = ask(messages)
    if cut:
        room *= 2
        raw, cut = ask(messages)
        tries_left = 0
    else:
        tries_left = 1
    try:
        try:
            extraction, skipped = read_answer(raw, names)
        except LLMError as first:
            if not tries_left:
                raise
            # Once, with the model's own answer and what is wrong with it: models fix what they are told.
            fix = (
                f"Your answer could not be used: {first}. Answer again with only the JSON object "
                'with keys "entities", "facts" and "ends".'
            )
            raw, cut = ask([*messages, {"role": "assistant", "content": raw[:4000]}, {"role": "user", "content": fix}])
            extraction, skipped = read_answer(raw, names)
    except LLMError as exc:
        exc.usage = spent  # type: ignore[attr-defined]
        raise
    if cut:
        skipped.insert(0, f"answer cut off at max_tokens={room}: only its complete items were kept")
    if skipped:
        log.info("extraction: kept %d facts, skipped %s", len(extraction.facts), "; ".join(skipped)[:500])
    return LLMAnswer(extraction=extraction, usage=spent, raw=raw, skipped=skipped)
