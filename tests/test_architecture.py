"""The package tree is the architecture: these tests keep it so.

They read every module under ``zmqrl/`` with ``ast`` (nothing is imported) and check the rules of
docs/architecture.md: no two modules import each other, no import runs up the layer table below,
packages of one layer stay apart, the top level stays small, no module grows past 400 lines and no
config travels as ``Any``. The benchmarks' package ``zmqrl_bench`` (benchmarks/zmqrl_bench/, not
the runtime) keeps the rules it had as ``zmqrl/bench/``, and only the CLI's mount imports it.

What counts as an import: every ``import`` / ``from ... import`` statement anywhere in a module, at
module level or inside a function (a lazy import is still a dependency: it only moves the moment
it runs), and those under ``if TYPE_CHECKING:`` too (an annotation that names a class depends on
that class as much as a call does; a type-only import that closes a circle must be listed in
``TYPE_ONLY_BACK_EDGES`` with its reason). ``from zmqrl.x import y`` is an import of the module
``zmqrl.x.y`` when there is one, else of ``zmqrl.x``; importing a package's child does not count as
importing the package's ``__init__``.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

ZMQRL = Path(__file__).resolve().parent.parent / "zmqrl"
# `zmqrl bench`'s package: tooling, outside the runtime package, installed beside it.
BENCH = ZMQRL.parent / "benchmarks" / "zmqrl_bench"

# Each package or top-level module of zmqrl/ and its layer, lowest first: a module may import only
# from its own layer or below ("" is the package's own __init__, zmqrl's public names).
LAYERS: dict[str, int] = {
    # 0 foundation: what every layer shares (errors, batch types, the contracts, metric logging);
    # moved only maps old module paths to new ones, by name.
    "errors": 0,
    "types": 0,
    "strictjson": 0,
    "metrics": 0,
    "moved": 0,
    "spec": 0,
    "core": 0,
    "code_trust": 0,
    # 1 the algorithms: registry, DQN, SAC, nets; the config sections of each agent.
    "agents": 1,
    # 2 the run config: sections and entry points, parsing, range checks.
    "config": 2,
    "config_parse": 2,
    "config_checks": 2,
    "config_sections": 2,
    # 3 the parts every role is built from: wire and sockets, replay storage, environments.
    "transport": 3,
    "replay": 3,
    "envs": 3,
    # 4 what every role process runs besides its work: the supervisor link, watchdog, health and exit
    # codes, the run fingerprint it computes from its config.
    "runtime": 4,
    # 5 the checkpoint format, replay snapshots, which checkpoint to deploy, load_policy.
    "checkpoints": 5,
    # 6 greedy evaluation of a policy and the evaluator role.
    "evaluator": 6,
    # 7 the two training roles.
    "actor": 7,
    "learner": 7,
    # 8 what runs the roles: the supervisor (processes) and serial mode (threads).
    "supervisor": 8,
    "serial": 8,
    # 9 the Python API and the package's public names.
    "api": 9,
    "": 9,
    # 10 benchmarks (run a training, time parts of it): zmqrl_bench, outside zmqrl/ (BENCH_LAYER);
    # and the tuner (runs trainings, scores them).
    "tune": 10,
    # 11 the command line, which mounts everything (bench's commands included); 12 python -m zmqrl.
    "cli": 11,
    "__main__": 12,
}
# zmqrl_bench's layer in the table above (it is not under zmqrl/): benchmarks run a training and
# time parts of it, so they may import any layer up to the Python API, and not the command line.
BENCH_LAYER = 10
# The one module of zmqrl/ that imports zmqrl_bench: the CLI, where it mounts `zmqrl bench`.
BENCH_MOUNT = "zmqrl.cli.app"

# Packages of one layer do not import each other, except these (importer, imported): reason.
# Top-level modules of one layer (the foundation, the config's three files) may import each other;
# the circle rule keeps them in order.
SAME_LAYER_ALLOWED: dict[tuple[str, str], str] = {
    (
        "metrics",
        "errors",
    ): "a tracker named in logging.backends whose extra is missing is the user's to fix: a ConfigError",
}

# Imports that exist only for annotations (under ``if TYPE_CHECKING:``) and close a circle with an
# import that runs, allowed with their reason: (importer, imported): reason.
TYPE_ONLY_BACK_EDGES: dict[tuple[str, str], str] = {}

# What still breaks a rule, in code another change of issue 24 is rewriting; each entry names that
# change. Each entry matches exactly (a circle that grows by one module is a new one and fails); one
# that no longer occurs is reported as a warning, to be deleted here: the list only ever shrinks.
PENDING_CIRCLES: dict[frozenset[str], str] = {}
PENDING_UP_IMPORTS: dict[tuple[str, str], str] = {}
# Files whose config parameters may still be typed Any (the agent contract change types them).
PENDING_CONFIG_ANY: dict[str, str] = {}

MAX_TOP_LEVEL_MODULES = 13
MAX_LINES = 400
# Modules allowed past MAX_LINES, each with its own ceiling and the reason a split would be worse.
LONG_MODULES: dict[str, tuple[int, str]] = {
    "zmqrl/transport/decoding.py": (
        565,
        "the one samples decoder: everything a message from the network meets on its way from frames "
        "to rows a learner may train on is read in one module (issue 39: one message's decode enters at "
        "most 5 transport modules with at most 2 returns, benchmarks/sample_path.py measures it); what "
        "is checked once per layout is split off already (transport/layouts.py), and so are the rules "
        "of R2D2's windows (transport/sequence_checks.py) and of action masks (transport/mask_checks.py); "
        "the lines over 520 are the sequences kind's dispatch, its shared value checks (obs, actions, "
        "rewards, core state) and the two calls into the mask checks, which must stay beside the "
        "other kinds' so one reader holds each rule; the lines over 540 are Dict observations' (issue 40): "
        "the fold of a message's per-key arrays into records (planned by transport/record_columns.py, once "
        "per layout) and each key's value check against its own bounds",
    ),
}
# Parameter names that hold a config (the whole Config or one section).
CONFIG_PARAMETER = re.compile(r"(cfg|config|.+_cfg)")


# --------------------------------------------------------------------------------------------
# The checker: pure functions of a source tree, so the tests below can run it on a fake one
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of ``importer`` on ``imported`` (dotted module names)."""

    importer: str
    imported: str
    path: str  # the importer's file, relative to the tree's parent
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the package directory ``root``."""
    mods: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING"):
                for stmt in node.body:
                    inside.update(id(n) for n in ast.walk(stmt))
    return inside


def _resolve(name: str, mods: Mapping[str, Path]) -> str | None:
    """The module ``name`` is, or the nearest package above it that exists; None outside the tree."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _statements(root: Path, known: Mapping[str, Path]) -> Iterator[Import]:
    """Every module under ``root`` importing what each of its import statements names, as written
    (relative imports made absolute; ``from m import n`` as ``m.n`` where ``known`` has that module)."""
    for name, path in module_files(root).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        rel = str(path.relative_to(root.parent))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names
                ]
            for target in targets:
                yield Import(name, target, rel, node.lineno, id(node) in type_only)


def imports_of(root: Path) -> list[Import]:
    """Every dependency of a module under ``root`` on another one, with where it is written."""
    mods = module_files(root)
    found: list[Import] = []
    for imp in _statements(root, mods):
        imported = _resolve(imp.imported, mods)
        if imported is not None and imported != imp.importer:
            found.append(replace(imp, imported=imported))
    return found


def imports_into(root: Path, other: Path) -> list[Import]:
    """Every dependency of a module under ``root`` on a module of the package ``other`` (another
    tree), with where it is written."""
    mods = module_files(other)
    found: list[Import] = []
    for imp in _statements(root, {**module_files(root), **mods}):
        if imp.imported.partition(".")[0] == other.name:
            imported = _resolve(imp.imported, mods)
            found.append(replace(imp, imported=imported or imp.imported))
    return found


def circles(imports: Iterable[Import], allowed_back_edges: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan),
    each sorted, leaving out the type-only ``allowed_back_edges``."""
    skip = set(allowed_back_edges)
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if not (imp.type_only and (imp.importer, imp.imported) in skip):
            edges[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def component_of(module: str) -> str:
    """The package or top-level module ``module`` belongs to: ``zmqrl.learner.trainer`` ->
    ``learner``, ``zmqrl.config`` -> ``config``, ``zmqrl`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_problems(
    imports: Iterable[Import],
    layers: Mapping[str, int],
    packages: set[str],
    allowed: Mapping[tuple[str, str], str] = SAME_LAYER_ALLOWED,
) -> list[tuple[Import, str]]:
    """The imports that break the layer table, each with why: one that runs up the table, one
    between two packages of a layer (unless ``allowed``), one from or to a part the table lacks."""
    problems: list[tuple[Import, str]] = []
    for imp in sorted(set(imports), key=lambda i: (i.path, i.line, i.imported)):
        src, dst = component_of(imp.importer), component_of(imp.imported)
        if src == dst:
            continue
        if src not in layers or dst not in layers:
            missing = src if src not in layers else dst
            problems.append((imp, f"{missing or 'zmqrl/__init__'} has no layer in LAYERS"))
        elif layers[dst] > layers[src]:
            problems.append((imp, f"up: layer {layers[src]} {src} imports layer {layers[dst]} {dst}"))
        elif (
            layers[dst] == layers[src] and (src in packages or dst in packages) and (src, dst) not in allowed
        ):
            problems.append((imp, f"sideways: {src} and {dst} are both layer {layers[src]}"))
    return problems


def config_any_parameters(root: Path) -> list[str]:
    """``file:line name`` of each parameter named like a config (cfg, config, *_cfg) that is
    annotated ``Any`` (alone or in a union)."""

    def is_any(node: ast.expr | None) -> bool:
        if isinstance(node, ast.Name | ast.Attribute):
            return (node.id if isinstance(node, ast.Name) else node.attr) == "Any"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return is_any(node.left) or is_any(node.right)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return bool(re.fullmatch(r"\s*(typing\.)?Any(\s*\|.*)?|.*\|\s*Any\s*", node.value))
        return False

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if CONFIG_PARAMETER.fullmatch(arg.arg) and is_any(arg.annotation):
                        found.append(
                            f"{path.relative_to(root.parent)}:{arg.lineno} {node.name}({arg.arg}: Any)"
                        )
    return found


def _report(lines: Iterable[str]) -> str:
    return "\n  " + "\n  ".join(lines)


# --------------------------------------------------------------------------------------------
# The rules, over zmqrl/
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return imports_of(ZMQRL)


def _packages(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}


def _warn_fixed(table: str, fixed: list[str]) -> None:
    if fixed:
        warnings.warn(
            f"fixed, so delete from {table} in tests/test_architecture.py:" + _report(fixed), stacklevel=2
        )


def test_no_two_modules_import_each_other(imports: list[Import]) -> None:
    found = circles(imports, TYPE_ONLY_BACK_EDGES)
    _warn_fixed(
        "PENDING_CIRCLES", [" <-> ".join(sorted(c)) for c in PENDING_CIRCLES if sorted(c) not in found]
    )
    new = [c for c in found if frozenset(c) not in PENDING_CIRCLES]
    lines = []
    for circle in new:
        members = set(circle)
        lines.append("circle: " + " <-> ".join(circle))
        lines += [
            f"    {imp.where()} imports {imp.imported}" + (" (type only)" if imp.type_only else "")
            for imp in sorted(set(imports), key=lambda i: (i.path, i.line, i.imported))
            if imp.importer in members and imp.imported in members
        ]
    assert not new, (
        "modules import each other; move what both need down (or the one-way part up) so the imports "
        "run one way:" + _report(lines)
    )


def test_no_import_runs_up_the_layers_or_across_one(imports: list[Import]) -> None:
    problems = layer_problems(imports, LAYERS, _packages(ZMQRL))
    found = {(imp.importer, imp.imported) for imp, _ in problems}
    _warn_fixed("PENDING_UP_IMPORTS", [f"{a} -> {b}" for a, b in PENDING_UP_IMPORTS if (a, b) not in found])
    new = [(imp, why) for imp, why in problems if (imp.importer, imp.imported) not in PENDING_UP_IMPORTS]
    assert not new, (
        "imports against the layer table (LAYERS in tests/test_architecture.py, docs/architecture.md); "
        "move the shared part down a layer, or the importer up:"
        + _report(f"{imp.where()} imports {imp.imported}: {why}" for imp, why in new)
    )


def test_every_package_and_top_level_module_has_a_layer() -> None:
    parts = {component_of(m) for m in module_files(ZMQRL)}
    missing = sorted(parts - set(LAYERS))
    stale = sorted(set(LAYERS) - parts)
    assert not missing, "add to LAYERS in tests/test_architecture.py (and docs/architecture.md):" + _report(
        missing
    )
    assert not stale, "no longer in zmqrl/, remove from LAYERS:" + _report(stale)


def test_the_top_level_holds_at_most_13_modules() -> None:
    top = sorted(p.stem for p in ZMQRL.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules at the top of zmqrl/ (at most {MAX_TOP_LEVEL_MODULES}: what everyone shares); "
        "put the new one in the package of the role or part that uses it:" + _report(top)
    )


def test_no_module_is_over_400_lines() -> None:
    long = sorted(
        (n, path)
        for p in [*ZMQRL.rglob("*.py"), *BENCH.rglob("*.py")]
        if (n := len(p.read_text().splitlines()))
        > LONG_MODULES.get(path := str(p.relative_to(ZMQRL.parent)), (MAX_LINES,))[0]
    )
    assert not long, (
        f"modules over {MAX_LINES} lines (or their LONG_MODULES ceiling); split them by responsibility:"
        + _report(f"{path}: {n} lines" for n, path in long)
    )
    stale = [
        path
        for path in LONG_MODULES
        if not (ZMQRL.parent / path).is_file()
        or len((ZMQRL.parent / path).read_text().splitlines()) <= MAX_LINES
    ]
    assert not stale, "LONG_MODULES entries no longer needed (gone, or back under the limit):" + _report(
        stale
    )


def test_no_config_parameter_is_annotated_any() -> None:
    found = config_any_parameters(ZMQRL) + config_any_parameters(BENCH)
    _warn_fixed(
        "PENDING_CONFIG_ANY", [f for f in PENDING_CONFIG_ANY if not any(x.startswith(f"{f}:") for x in found)]
    )
    found = [x for x in found if x.partition(":")[0] not in PENDING_CONFIG_ANY]
    assert not found, "config parameters typed Any; use Config or the section's dataclass:" + _report(found)


# --------------------------------------------------------------------------------------------
# The benchmarks: beside the runtime, not in it
# --------------------------------------------------------------------------------------------


def test_nothing_in_zmqrl_imports_the_benchmarks_but_the_cli_mount() -> None:
    found = [imp for imp in imports_into(ZMQRL, BENCH) if imp.importer != BENCH_MOUNT]
    assert not found, (
        f"zmqrl/ imports zmqrl_bench (only {BENCH_MOUNT} may, to mount `zmqrl bench`): the runtime "
        "must work where the benchmarks are not installed; move what both need into zmqrl/:"
        + _report(f"{imp.where()} imports {imp.imported}" for imp in found)
    )


def test_the_benchmarks_import_no_layer_above_theirs() -> None:
    problems = []
    for imp in imports_into(BENCH, ZMQRL):
        part = component_of(imp.imported)
        if part not in LAYERS:
            problems.append(f"{imp.where()} imports {imp.imported}: {part} has no layer in LAYERS")
        elif LAYERS[part] > BENCH_LAYER:
            problems.append(f"{imp.where()} imports {imp.imported}: up, to layer {LAYERS[part]} {part}")
    assert not problems, f"zmqrl_bench (layer {BENCH_LAYER}) imports above its layer:" + _report(problems)


def test_no_two_benchmark_modules_import_each_other() -> None:
    found = circles(imports_of(BENCH))
    assert not found, "zmqrl_bench's modules import each other:" + _report(" <-> ".join(c) for c in found)


# --------------------------------------------------------------------------------------------
# The checker itself, on a fake tree: it must see what it is there to see
# --------------------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_a_circle_through_a_lazy_and_a_relative_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "def f():\n    from pkg.low import b\n",
            "low/b.py": "from . import c\n",
            "low/c.py": "from .a import f\n",
            "low/d.py": "import pkg.low.c\n",
        },
    )
    assert circles(imports_of(root)) == [["pkg.low.a", "pkg.low.b", "pkg.low.c"]]


def test_checker_counts_type_only_imports_unless_allowed(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "a.py": "from pkg.b import g\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import X\ndef g(): ...\n",
        },
    )
    found = imports_of(root)
    assert circles(found) == [["pkg.a", "pkg.b"]]
    assert circles(found, {("pkg.b", "pkg.a")}) == []
    assert circles(found, {("pkg.a", "pkg.b")}) == [["pkg.a", "pkg.b"]]  # a runtime import is never skipped


def test_checker_finds_up_and_sideways_imports_and_names_the_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "base.py": "import os\n\nfrom pkg import top\n",
            "top.py": "",
            "left/__init__.py": "",
            "left/x.py": "x = 1\n",
            "right/__init__.py": "",
            "right/y.py": "from pkg.left.x import x\nfrom pkg import base\n",
            "stray.py": "",
            "other.py": "from pkg import stray\n",
        },
    )
    layers = {"": 3, "base": 0, "top": 2, "left": 1, "right": 1, "other": 0}
    problems = {
        (imp.where(), why) for imp, why in layer_problems(imports_of(root), layers, {"left", "right"})
    }
    assert problems == {
        ("pkg/base.py:3", "up: layer 0 base imports layer 2 top"),
        ("pkg/right/y.py:1", "sideways: right and left are both layer 1"),
        ("pkg/other.py:1", "stray has no layer in LAYERS"),
    }
    allowed = {("right", "left"): "a reason"}
    assert len(layer_problems(imports_of(root), layers, {"left", "right"}, allowed)) == 2


def test_checker_finds_config_parameters_typed_any(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "m.py": (
                "from typing import Any\n"
                "def f(cfg: Any, other: Any, learner_cfg: Any | None = None) -> None: ...\n"
                "class C:\n    def __init__(self, config: 'Any', ok: dict[str, Any], cfg2: int): ...\n"
            )
        },
    )
    assert config_any_parameters(root) == [
        "pkg/m.py:2 f(cfg: Any)",
        "pkg/m.py:2 f(learner_cfg: Any)",
        "pkg/m.py:4 __init__(config: Any)",
    ]


def test_checker_finds_imports_into_another_tree_as_written(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"a.py": "import other.x\nfrom other import y, z\nimport otherwise\n"})
    other = tmp_path / "other"
    for rel in ("__init__.py", "y.py"):
        (other / rel).parent.mkdir(parents=True, exist_ok=True)
        (other / rel).write_text("")
    assert {(i.where(), i.imported) for i in imports_into(root, other)} == {
        ("pkg/a.py:1", "other"),  # other.x is no module of the tree: its package
        ("pkg/a.py:2", "other.y"),
        ("pkg/a.py:2", "other"),  # z is a name in other/__init__.py
    }
