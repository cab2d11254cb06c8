"""The layers are contracts (docs/architecture.md): checked here from the code itself.

- import-linter's contracts (`.importlinter`) hold, and its layers contract names every top-level
  module and subpackage of hexiseq (a new package cannot sit outside the layering);
- no import cycle between modules (imports inside functions included);
- no import inside a function reaches another layer: such an import hides a dependency from the
  reader (and, before the contracts, hid layering breaks). Inside functions only same-layer
  modules and optional third-party packages are imported. One exception, by design: the package
  root `hexiseq/__init__.py` is a facade above every layer, and its `hexiseq.launch` imports
  `hexiseq.runs` when called, so that `import hexiseq` stays free of torch.
"""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hexiseq"


def layer_of(module: str) -> str:
    """The layer of a hexiseq module: its top-level subpackage or top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Absolute names of what an import statement imports (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module or ""]
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    target = ".".join(base + ([node.module] if node.module else []))
    if node.module:
        return [target]
    return [f"{target}.{alias.name}" for alias in node.names]  # `from . import x`


def function_local_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) of every import statement inside a function body."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in imported_modules(node, module, path.name == "__init__.py"):
                        found.append((module, node.lineno, target))
    return sorted(set(found))


def test_function_local_imports_stay_in_their_layer():
    crossing = [
        f"{module}:{line} imports {target}"
        for module, line, target in function_local_imports()
        if target.startswith("hexiseq") and layer_of(target) != layer_of(module) and module != "hexiseq"
    ]
    assert crossing == [], "imports inside functions that reach another layer:\n" + "\n".join(crossing)


def test_import_hexiseq_stays_torch_free():
    # What the facade's one deferred import protects.
    code = "import sys, hexiseq, hexiseq.planner, hexiseq.costmodel; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_scan_sees_function_local_imports():
    # The scan must find the lazy imports that are allowed (optional plotting packages), else the
    # test above would pass on an empty list for the wrong reason.
    targets = {target.split(".")[0] for _, _, target in function_local_imports()}
    assert "matplotlib" in targets or "flash_attn" in targets, sorted(targets)


def test_no_import_cycles():
    graph = grimp.build_graph("hexiseq")
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    # Tarjan's strongly connected components, iterative (the graph has a few hundred modules).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert cycles == [], f"import cycles: {cycles}"


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contracts = [s for s in config.sections() if s.startswith("importlinter:contract:")]
    assert len(contracts) >= 5


def test_the_layers_contract_names_every_package():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"]
    named = {name.strip() for line in layers.split("\n") for name in line.replace(":", "|").split("|") if name.strip()}
    present = {
        f"hexiseq.{p.stem}" if p.is_file() else f"hexiseq.{p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert present - named == set(), f"modules outside the layers contract: {sorted(present - named)}"
    assert named - present == set(), f"layers naming no module: {sorted(named - present)}"


def test_source_citations_point_inside_the_repository():
    # Docstrings and comments cite files of this repository only: a path under data/, docs/,
    # tests/ or benchmarks/ (or a README / design document) must exist here.
    cited = re.compile(r"\b((?:data|docs|tests|benchmarks)/[A-Za-z0-9_./-]+\.(?:md|yaml|json|txt|py)|[A-Z]+\.md)\b")
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for ref in cited.findall(line):
                if ref in ("README.md", "CHANGELOG.md") or "*" in ref:
                    continue
                if not (ROOT / ref).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{lineno}: {ref}")
    assert missing == [], "citations of files that are not in the repository:\n" + "\n".join(missing)
