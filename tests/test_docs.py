"""The generated configuration reference is current and complete; README points at docs/ that exist."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym

from tests.scripts import load_script
from zmqrl.config import Config
from zmqrl.envs.masked import register_own_ids

docgen = load_script("docgen")
# An env id of zmqrl's own (zmqrl/CartPoleNoVelocity-v1), which a page may name beside source paths.
ENV_ID = re.compile(r"zmqrl/[A-Z]\w*-v\d+")

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "configuration.md"
# README's length limit (issue 24): quick start, results, one picture, the Python API, links.
README_MAX_LINES = 350


@dataclasses.dataclass
class Base:
    shared: int = 1  # the base's words
    plain: str = "x"  # only in the base


@dataclasses.dataclass
class Derived(Base):
    shared: int = 2  # the subclass's words
    extra: list[int] = dataclasses.field(default_factory=lambda: [3, 4])  # a field of its own
    silent: float | None = None


def test_docs_configuration_md_is_not_stale() -> None:
    """Fails whenever a config field, its default or its comment changed without regenerating."""
    current = REFERENCE.read_text(encoding="utf-8")
    assert docgen.regenerate(current) == current, (
        "docs/configuration.md is stale: run python benchmarks/docgen.py"
    )


def test_the_reference_documents_every_key_of_every_section_and_built_in_agent() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    config = Config()
    keys = [
        row.key
        for section in dataclasses.fields(config)
        if section.name != docgen.AGENT_SECTION
        for row in docgen.section_fields(getattr(config, section.name), section.name)
    ]
    keys += [row.key for _, cls in docgen.builtin_agents() for row in docgen.section_fields(cls(), "agent")]
    assert "env.atari.frame_stack" in keys and "agent.torso" in keys and "agent.autotune" in keys
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert not missing, missing


def test_comments_come_from_the_class_that_declares_the_field() -> None:
    comments = docgen.field_comments(Derived)
    assert comments == {
        "shared": "the subclass's words",
        "plain": "only in the base",
        "extra": "a field of its own",
    }


def test_rows_carry_type_default_and_meaning() -> None:
    rows = {row.key: row for row in docgen.section_fields(Derived(), "demo")}
    assert rows["demo.extra"] == docgen.FieldDoc("demo.extra", "list[int]", "[3, 4]", "a field of its own")
    assert rows["demo.silent"].default == "null"
    table = "\n".join(docgen.render_table(rows.values()))
    assert "(no comment in the source)" in table  # a field without a comment shows, not hides, it


def test_defaults_are_written_as_yaml() -> None:
    assert [docgen.format_default(v) for v in (None, True, 0.5, 1e-6, "", "auto", {}, [64])] == [
        "null",
        "true",
        "0.5",
        "1e-06",
        '""',
        "auto",
        "{}",
        "[64]",
    ]


def test_check_exits_1_on_a_stale_file_and_rewriting_fixes_it(tmp_path: Path) -> None:
    path = tmp_path / "configuration.md"
    path.write_text(f"# Configuration\n\nprose stays\n\n{docgen.BEGIN}\nold table\n{docgen.END}\ntail\n")
    assert docgen.main([str(path), "--check"]) == docgen.STALE
    assert "old table" in path.read_text()  # --check writes nothing
    assert docgen.main([str(path)]) == 0
    text = path.read_text()
    assert text.startswith("# Configuration\n\nprose stays\n") and text.endswith(f"{docgen.END}\ntail\n")
    assert "| `learner.max_updates` |" in text and "old table" not in text
    assert docgen.main([str(path), "--check"]) == 0


def test_a_file_without_the_markers_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "configuration.md"
    path.write_text("no markers here\n")
    assert docgen.main([str(path), "--check"]) == 2


def test_the_module_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/docgen.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_readme_links_to_docs_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert {"docs/configuration.md", "docs/metrics.md", "docs/protocol.md", "docs/performance.md"} <= linked
    assert [name for name in linked if not (REPO / name).is_file()] == []


def test_readme_is_at_most_350_lines() -> None:
    """The overview stays an overview: reference material goes to docs/ (issue 24)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def _section(path: Path, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next heading of that level."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(f"\n{heading}\n") + len(heading) + 2 :]
    end = section.find("\n## ")
    return section if end < 0 else section[:end]


def _code_blocks(path: Path, heading: str) -> list[str]:
    return re.findall(r"```\n(.*?)```", _section(path, heading), re.DOTALL)


def test_readme_draws_the_picture_of_docs_architecture() -> None:
    readme = _code_blocks(REPO / "README.md", "## Architecture")
    architecture = _code_blocks(REPO / "docs" / "architecture.md", "## Processes")
    assert readme and architecture and readme[0] == architecture[0]


def test_every_package_has_its_line_in_readme_and_docs_architecture() -> None:
    """README's module map and docs/architecture.md's package list name each package of zmqrl/ once
    each: a package added without a line, or a line left behind by a removed one, fails here."""
    packages = sorted(p.parent.name for p in (REPO / "zmqrl").glob("*/__init__.py"))
    module_map = _code_blocks(REPO / "README.md", "## Architecture")[1]  # after the picture
    in_readme = re.findall(r"^zmqrl/(\w+)/ ", module_map, re.MULTILINE)
    listed = _section(REPO / "docs" / "architecture.md", "## Packages")
    in_docs = re.findall(r"^\| `zmqrl/(\w+)/` \|", listed, re.MULTILINE)
    assert sorted(in_readme) == packages, "README's module map"
    assert sorted(in_docs) == packages, "docs/architecture.md's Packages"


def test_docs_name_only_source_paths_that_exist() -> None:
    """A module or folder that moved leaves no stale path behind in README.md, docs/ or docker/;
    zmqrl's own env ids (``zmqrl/Name-vN``) are not paths, and must be registered ones."""
    register_own_ids()
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "docker").glob("*.md")]
    stale = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"(?<![\w/.])zmqrl/[\w./-]*[\w/]", text):
            if ENV_ID.fullmatch(match.group(0)):
                known = match.group(0) in gym.registry
            else:
                known = (REPO / match.group(0)).exists()
            if not known:
                line = text.count("\n", 0, match.start()) + 1
                stale.append(f"{page.relative_to(REPO)}:{line}: {match.group(0)}")
    assert stale == []


def test_docs_links_between_pages_resolve() -> None:
    for page in (REPO / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", text):
            linked = (page.parent / target).resolve()
            assert linked.is_file(), f"{page.name} links to missing {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.MULTILINE)
                slugs = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{page.name} links to missing {target}#{anchor}"


def test_the_readmes_python_api_example_runs(tmp_path: Path) -> None:
    """The example as printed, shortened through config variables (file < environment < overrides)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API") :]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None
    script = tmp_path / "example.py"
    script.write_text(example.group(1) + "\nprint('acted', action, result.state)\n")
    env = {
        **os.environ,
        "ZMQRL_RUN__DIR": str(tmp_path / "runs"),
        "ZMQRL_LEARNER__MAX_UPDATES": "200",
        "ZMQRL_LEARNER__MIN_REPLAY_SIZE": "200",
        "ZMQRL_LEARNER__EVAL_EPISODES": "2",
    }
    result = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] in ("acted 0 finished", "acted 1 finished")
