"""The settings package: ``Settings`` is its sections joined in order, each field declared once, and every
section's own checks (and the ones spanning sections) still refuse a bad value with a ``ConfigError`` naming
the variable, read from the environment as from keyword arguments."""

from __future__ import annotations

import pytest

import engram_api.settings as settings_package
from engram_api.errors import ConfigError
from engram_api.settings import Settings, load_settings
from engram_api.settings.core import SECTIONS


def test_settings_fields_are_the_sections_fields_in_section_order() -> None:
    # docs/configuration.md and .env.example list the settings in this order; a section's fields stay together.
    declared = [name for section in SECTIONS for name in section.model_fields]
    assert len(declared) == len(set(declared)), "a field is declared by two sections"
    assert list(Settings.model_fields) == declared
    assert next(iter(Settings.model_fields)) == "neo4j_uri"  # services first, as the docs read


def test_every_exported_name_is_importable_from_the_package() -> None:
    for name in settings_package.__all__:
        assert getattr(settings_package, name) is not None, name
    assert {"Settings", "load_settings", "variable_for", "ApiKeySpec", "Scope"} <= set(settings_package.__all__)


@pytest.mark.parametrize(
    ("overrides", "variable", "says"),
    [
        ({"neo4j_uri": "http://db:7474"}, "NEO4J_URI", "Bolt URI"),  # services
        ({"llm_extra_params": {"max_tokens": 9}}, "ENGRAM_LLM_EXTRA_PARAMS", "sets max_tokens"),  # ingest
        ({"hop_decay": 0}, "ENGRAM_HOP_DECAY", "greater than 0"),  # recall
        ({"log_format": "xml"}, "ENGRAM_LOG_FORMAT", "'json' or 'text'"),  # operations
        ({"cell_count": 2, "cell_index": 2}, "ENGRAM_CELL_INDEX", "below ENGRAM_CELL_COUNT (2)"),  # gateway
        ({"flower_password": "change-me"}, "ENGRAM_FLOWER_PASSWORD", "example password"),  # spans sections
    ],
)
def test_each_sections_checks_name_the_variable(overrides: dict[str, object], variable: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(**overrides)
    assert str(refused.value).startswith(f"{variable}: ") and says in str(refused.value)


def test_the_environment_fills_fields_of_every_section(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in {
        "NEO4J_URI": "bolt://db:7687",
        "ENGRAM_APPLY_BATCH": "3",
        "ENGRAM_MAX_HOPS": "1",
        "ENGRAM_TRACING": "true",
        "ENGRAM_GATEWAY_PORT": "9090",
        "LLM_API_KEY": "",
    }.items():
        monkeypatch.setenv(variable, value)
    got = load_settings()
    assert (got.neo4j_uri, got.apply_batch, got.max_hops, got.tracing, got.gateway_port) == (
        "bolt://db:7687",
        3,
        1,
        True,
        9090,
    )
    assert got.llm_api_key is None and not got.embedded_graph  # a blank credential is unset
    with pytest.raises(Exception, match="frozen"):
        got.max_hops = 2  # type: ignore[misc]
