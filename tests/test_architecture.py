"""The package's import graph: dependencies follow the stage order, and nothing imports in a circle.

The order (a module may import its own stage and the stages above it, never one below):

    foundation  cramlm.constants, cramlm.io, cramlm.progress, cramlm.locks: no cramlm imports but
                each other; torch-free (a config, a record or a report is written without torch)
    config      typed configs, presets, the component registry
    data        sources, tokenizers, packed files, datasets, collators
    models      the model configs and modules (plain nn.Modules)
    train       budget, optimizers, schedules, checkpoints, the Trainer
    run         a run: its config, built from it in one place, its folder, `cramlm pretrain`
    eval        tasks, fine-tuning, held-out loss, metrics
    report      plots and report.html from run folders
    pipeline    whole runs: recipes (data -> pretrain -> eval -> report), sweeps, the planner
    cli         the command line, cramlm/cli/, __main__.py and launch.py (torchrun wrapper): the only
                click code; nothing imports it

A module's stage is its folder (cramlm/<stage>/...); the few top-level modules are named above.

An entry point (a stage's command: ``cramlm pretrain`` is run/pretrain.py) is imported only by the
command line and by the pipeline, which chains the stages' commands; a library module never imports
one (ENTRY_POINTS).

Function-level imports count for the order (a lazy import is still a dependency) and for the
cycle check over every import; module-level imports alone must not form a cycle either (that is an
ImportError waiting for an import order).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cramlm"

STAGES = ["foundation", "config", "data", "models", "train", "run", "eval", "report", "pipeline", "cli"]
FOLDERS = {"config", "data", "models", "train", "run", "eval", "report", "pipeline", "cli"}  # a package per stage
TOP_LEVEL = {"cramlm": "foundation", "cramlm.constants": "foundation", "cramlm.io": "foundation",
             "cramlm.progress": "foundation", "cramlm.locks": "foundation", "cramlm.__main__": "cli", "cramlm.launch": "cli"}
# each stage's command (the module the CLI calls), and the stages allowed to import one
ENTRY_POINTS = {"cramlm.run.pretrain": "cramlm pretrain", "cramlm.eval.evaluate": "cramlm eval",
                "cramlm.pipeline.recipe": "cramlm run", "cramlm.pipeline.sweep": "cramlm sweep",
                "cramlm.pipeline.plan": "cramlm plan"}
CALLERS_OF_ENTRY_POINTS = {"cli", "pipeline"}


def stage(module: str) -> str:
    """The stage of a module: its folder, or for a top-level module the table above."""
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and parts[1] in FOLDERS):
        if parts[1] in FOLDERS:
            return parts[1]
        raise AssertionError(f"{module}: folder {parts[1]}/ has no stage; add it to tests/test_architecture.py (STAGES)")
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    raise AssertionError(f"{module}: a top-level module with no stage; add it to TOP_LEVEL in tests/test_architecture.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, function-level) cramlm modules ``path`` imports; ``from cramlm.x import y``
    counts as ``cramlm.x.y`` when y is a module. ``if TYPE_CHECKING:`` blocks are not imports."""
    top: set[str] = set()
    inner: set[str] = set()

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names]
        return []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for target in targets(child):
                if target.split(".")[0] == "cramlm":
                    (inner if nested else top).add(target)
            visit(child, nested)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return top, inner - top


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_import_names_a_module():
    for module, (top, inner) in GRAPH.items():
        missing = sorted(t for t in top | inner if t not in MODULES)
        assert not missing, f"{module} imports {missing}, which do not exist"


def test_no_module_level_import_cycle():
    cycle = find_cycle({m: top for m, (top, _) in GRAPH.items()})
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_even_through_function_level_imports():
    cycle = find_cycle({m: top | inner for m, (top, inner) in GRAPH.items()})
    assert cycle is None, "import cycle (some imports inside functions): " + " -> ".join(cycle)


def test_imports_follow_the_stage_order():
    wrong = []
    for module, (top, inner) in GRAPH.items():
        for target in sorted(top | inner):
            if STAGES.index(stage(target)) > STAGES.index(stage(module)):
                wrong.append(f"{module} ({stage(module)}) imports {target} ({stage(target)})")
    assert not wrong, "imports against the stage order:\n" + "\n".join(wrong)


def library_imports_of_entry_points(graph: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    return [f"{module} imports {target} (the entry point of `{ENTRY_POINTS[target]}`)"
            for module, (top, inner) in graph.items() for target in sorted(top | inner)
            if target in ENTRY_POINTS and stage(module) not in CALLERS_OF_ENTRY_POINTS]


def test_no_library_module_imports_an_entry_point():
    assert all(m in MODULES for m in ENTRY_POINTS), "ENTRY_POINTS names a module that does not exist"
    wrong = library_imports_of_entry_points(GRAPH)
    assert not wrong, "a library module imports an entry point (import the library module beside it):\n" + "\n".join(wrong)


def test_the_checker_sees_violations():
    """The checks above would fail on what they look for."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert STAGES.index(stage("cramlm.eval.checkpoints")) > STAGES.index(stage("cramlm.run.build"))
    assert library_imports_of_entry_points({"cramlm.pipeline.plan": ({"cramlm.run.pretrain"}, set()),
                                            "cramlm.eval.checkpoints": (set(), {"cramlm.run.pretrain"})}) == [
        "cramlm.eval.checkpoints imports cramlm.run.pretrain (the entry point of `cramlm pretrain`)"]
    assert stage("cramlm.cli.data") == stage("cramlm.cli") == "cli" and stage("cramlm.pipeline.recipe") == "pipeline"
    assert stage("cramlm.eval.evaluate") == "eval" and stage("cramlm.data.prepare") == "data"
    with pytest.raises(AssertionError):
        stage("cramlm.newfolder.module")
    assert stage("cramlm.io") == "foundation" and stage("cramlm.run.config") == "run"


@pytest.mark.parametrize("module", ["cramlm.io", "cramlm.constants", "cramlm.locks", "cramlm.report", "cramlm.run.config",
                                    "cramlm.run.folder"])
def test_torch_free_modules(module):
    """Atomic writes, constants, locks, reports and run configs never pay for importing torch."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_ignore_index_is_one_value():
    """models/model.py restates it (it is copied verbatim into remote-code exports)."""
    from cramlm.constants import IGNORE_INDEX
    from cramlm.models import model

    assert model.IGNORE_INDEX == IGNORE_INDEX == -100
