"""Docs stay true: generated references match their source, links resolve, and every Python example and
every `engram` command line the docs show exists and (where cheap) runs against a real fleet."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
_SERVICES = ("REDIS_URL", "NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD", "LLM_MODEL", "LLM_API_KEY", "LLM_API_BASE")


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


# ------------------------------------------------------------------ links and the benchmarks page
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(doc: Path) -> str:
    """``doc``'s text without its fenced code blocks (a ``# comment`` there is no heading, a link no link)."""
    return re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)


def heading_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives ``doc``'s headings: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``, a repeated one suffixed ``-1``, ``-2``..."""
    anchors: set[str] = set()
    for title in re.findall(r"^#+ +(.+?) *$", prose(doc), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        repeats = sum(1 for a in anchors if a == slug or re.fullmatch(re.escape(slug) + r"-\d+", a))
        anchors.add(f"{slug}-{repeats}" if repeats else slug)
    return anchors


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file_and_heading(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name}: ({target}): no {linked}"
        if anchor and linked.suffix == ".md":
            assert anchor in heading_anchors(linked), f"{doc.name}: ({target}): no such heading in {linked.name}"


def test_the_benchmarks_page_opens_with_its_summary_table_of_reproducible_figures():
    """The first screen is the table; each row's command names a real script, benchmark and option."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "ops" / "bench" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)  # its parser knows the benchmarks and their options

    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert start < 10, "the summary table must open the page"
    assert lines[start].split("|")[1:-1] == [
        " What is measured ",
        " Figure ",
        " Baseline (same run) ",
        " Machine ",
        " Reproduce ",
    ]
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = lines[start + 2 : end]
    commands = [span for row in rows for span in re.findall(r"`(python ops/bench/[^`]+)`", row)]
    assert len(commands) >= 10
    for command in commands:
        _, script, *args = shlex.split(command)
        assert (ROOT / script).is_file(), command
        if script.endswith("run.py"):
            run.parse_args(args)  # an unknown benchmark or option exits
        else:
            source = (ROOT / script).read_text()
            for option in (a for a in args if a.startswith("--")):
                assert f'"{option}"' in source, f"{command}: {script} has no {option}"


def test_user_docs_speak_of_the_product_not_of_its_development_log():
    """Development steps live in docs/benchmarks/history.md; the rest of the docs say what is, not when."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"\]\([^)]*\)", "]", doc.read_text())  # a link's target may name a history section
        found = re.findall(r"\b(?:stops? \d+|issue \d+|this session|this stop)\b", text, flags=re.IGNORECASE)
        assert not found, f"{doc.name}: {found}"


# ------------------------------------------------------------------ every example and command in the docs
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
# Long-running or fleet-starting commands: checked against the command tree, never run here.
_NOT_RUN = {"up", "worker", "beat", "flower", "demo", "bench", "serve"}


def code_blocks(lang: str) -> list[tuple[str, str]]:
    return [
        (doc.name, body)
        for doc in DOCS
        for kind, body in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), flags=re.DOTALL)
        if kind == lang
    ]


def cli_lines() -> list[tuple[str, str]]:
    """Every `engram ...` line of a bash block and every inline `engram ...` span, with its document."""
    lines = [(doc, line.strip()) for doc, body in code_blocks("bash") for line in body.splitlines()]
    lines += [(doc.name, span) for doc in DOCS for span in re.findall(r"`(engram(?: [^`]*)?)`", doc.read_text())]
    return [(doc, line) for doc, line in lines if line.startswith("engram")]


def _tokens(line: str) -> list[str]:
    return [t for t in shlex.split(line, comments=True) if t != "&"]


def _is_placeholder(token: str) -> bool:
    return any(c in token for c in "[]|") or (token.isupper() and len(token) > 1)


def _resolve(tokens: list[str]) -> tuple[click.Command, list[str]]:
    """The command a documented line names (every alternative of ``a|b`` must exist), and its arguments."""
    from engram_workers import cli

    command: click.Command = cli.main
    rest = tokens[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        names = rest.pop(0).split("|")
        for name in names:
            assert name in command.commands, f"`{' '.join(tokens)}`: no command {name!r}"
        command = command.commands[names[0]]
    return command, rest


def test_every_python_example_in_the_docs_is_a_file_the_suite_runs():
    files = {path.read_text() for path in EXAMPLES}
    shown = [body for _, body in code_blocks("python")]
    for doc, body in code_blocks("python"):
        assert body in files, f"a Python block of {doc} is not one of docs/examples/*.py: put it there"
    for path in EXAMPLES:
        assert path.read_text() in shown, f"{path.name} is not shown in any document"


@pytest.mark.parametrize(("doc", "line"), cli_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_documented_engram_command_exists_with_its_options(doc, line):
    command, args = _resolve(_tokens(line))
    with click.Context(command) as ctx:
        known = {opt for param in command.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}
        helptext = command.get_help(ctx)
    for arg in args:
        option = arg.strip("[]").split("=")[0]
        if option.startswith("-"):
            # `engram bench` hands its arguments to ops/bench/run.py: its help lists them.
            assert option in known or option in helptext, f"{doc}: `{line}`: {command.name} has no {option}"


def test_every_documented_script_exists():
    lines = [line.strip() for _, body in code_blocks("bash") for line in body.splitlines()]
    scripts = [_tokens(line)[1] for line in lines if line.startswith("python ")]
    assert scripts
    for script in scripts:
        assert (ROOT / script).is_file(), script


@pytest.fixture(scope="module")
def fleet(redis_url, tmp_path_factory):
    from tests.support.stack import engram_stack

    with engram_stack(
        redis_url=redis_url, data_dir=tmp_path_factory.mktemp("docs"), neo4j_uri=None, llm_url=None
    ) as stack:
        yield stack


@pytest.mark.timeout(1200)  # a dozen processes that each load the encoder, on a shared 2-core machine
def test_the_documented_examples_and_commands_run_on_a_real_fleet(fleet, tmp_path):
    """Every docs/examples/*.py, then every runnable documented command line (no placeholders, nothing that
    starts a fleet) in document order, as a user would type them, against real workers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k not in _SERVICES}
    env.update({k: v for k, v in fleet.env.items() if v})
    for example in EXAMPLES:
        done = subprocess.run(
            [sys.executable, str(example)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{example.name}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    ran = []
    for doc, body in code_blocks("bash"):
        for line in (line.strip() for line in body.splitlines()):
            tokens = _tokens(line) if line.startswith("engram") else []
            if len(tokens) < 2 or tokens[1] in _NOT_RUN or any(_is_placeholder(t) for t in tokens):
                continue
            done = subprocess.run(
                [sys.executable, "-m", "engram_workers.cli", *tokens[1:]],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, f"{doc}: `{line}`:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            ran.append(tokens[1])
    assert {"enqueue", "recall", "export", "forget-user", "import"} <= set(ran)


def test_engram_bench_help_names_every_benchmark_and_option_of_the_runner():
    import ast

    from click.testing import CliRunner

    from engram_workers.cli import main

    tree = ast.parse((ROOT / "ops" / "bench" / "run.py").read_text())
    benches = next(
        [ast.literal_eval(k) for k in node.value.keys]
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "BENCHES"
    )
    options = {
        ast.literal_eval(call.args[0])
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument"
    }
    shown = CliRunner().invoke(main, ["bench", "--help"]).output
    listed = "".join(shown.split()).split("subsetof")[1].split("--")[0]
    assert set(listed.split(",")) == set(benches)
    assert {o for o in options if o.startswith("--") and o != "--help"} <= set(shown.split())
