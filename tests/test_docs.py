"""Docs that are generated or linked stay true."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_up_to_date():
    sys.path.insert(0, str(ROOT / "ops"))
    from gen_config_docs import render

    assert (ROOT / "docs" / "configuration.md").read_text() == render(), "run: python ops/gen_config_docs.py"


def test_api_reference_model_tables_are_up_to_date():
    sys.path.insert(0, str(ROOT / "ops"))
    from gen_api_docs import API_DOC, render

    assert API_DOC.read_text() == render(API_DOC.read_text()), "run: python ops/gen_api_docs.py"


def test_readme_links_point_at_existing_files():
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert links
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
