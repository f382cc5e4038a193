"""The package's import graph (every module, every import statement, also those inside
functions; not those under ``if TYPE_CHECKING:``, which never run): no import cycles, and no arrow from a layer up to a layer above it, in the order
``docs/architecture.md`` draws (its "Layers" figure names every module; checked here too)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hfcompress"
DOC = ROOT / "docs" / "architecture.md"

#: top first; a module may import its own layer (no cycles) and the layers below it
LAYERS = [
    ("entry points", ("hfcompress", "hfcompress.cli", "hfcompress.commands",
                      "hfcompress.demo")),
    ("evaluation", ("hfcompress.eval",)),
    ("trainer", ("hfcompress.trainer",)),
    ("apply", ("hfcompress.api",)),
    ("auto", ("hfcompress.auto",)),
    ("integrations", ("hfcompress.integrations",)),
    ("cost", ("hfcompress.cost",)),
    ("config", ("hfcompress.config",)),
    ("comm", ("hfcompress.comm",)),
    ("compressors", ("hfcompress.compressors",)),
    ("kernels", ("hfcompress.kernels",)),
    ("standalone", ("hfcompress.optim", "hfcompress.testing", "hfcompress.compare_runs",
                    "hfcompress.data", "hfcompress.models")),
]


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The package's modules ``name`` imports. ``from X import y`` imports the submodule X.y
    when there is one, else X; a package importing itself or its ancestors for a submodule
    (``from . import x``) is not an edge."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                sub = f"{base}.{a.name}"
                targets.append(sub if sub in known else base)
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def layer_of(module: str) -> int:
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            covers = module == p or (p != "hfcompress" and module.startswith(p + "."))
            if covers and len(p) > len(best):
                best, index = p, i
    assert index is not None, f"{module} is in no layer: add it to LAYERS and the docs"
    return index


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def test_graph_sees_the_imports():
    g = graph()
    assert "hfcompress.compressors.base" in g["hfcompress.compressors.bucketed"]
    assert "hfcompress.auto.choose" in g["hfcompress.api"]
    assert len(g) > 80


def test_no_import_goes_up_a_layer():
    g = graph()
    up = [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
          for a, targets in sorted(g.items()) for b in sorted(targets)
          if layer_of(b) < layer_of(a)]
    assert not up, "imports pointing up a layer:\n" + "\n".join(up)


def test_cost_model_is_below_the_runtime():
    """The cost model is arithmetic: it sits below, so imports nothing of, what runs
    training (FSDP2, the Trainer, ``auto``'s controller, ``apply``), which build on its facts
    (``test_no_import_goes_up_a_layer`` enforces it)."""
    names = [n for n, _ in LAYERS]
    runtime = ("integrations", "trainer", "auto", "apply")
    assert all(names.index("cost") > names.index(n) for n in runtime)


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(g[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_architecture_doc_draws_every_module_in_its_layer():
    """Every module's file appears in the doc's layer figure, in its layer's block, and the
    figure's layer names are the test's, in the same order."""
    doc = DOC.read_text()
    figure = doc.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    names = [n for n, _ in LAYERS]
    heads = [line.split("│")[0].strip() for line in figure.splitlines() if "│" in line]
    assert [h for h in heads if h] == names
    blocks = {}
    current = None
    for line in figure.splitlines():
        if "│" in line:
            head = line.split("│")[0].strip()
            current = head or current
            blocks.setdefault(current, "")
            blocks[current] += " " + line.split("│", 1)[1]
    missing = []
    for m, path in sorted(modules().items()):
        rel = str(path.relative_to(PACKAGE))
        if path.name == "__init__.py" and m != "hfcompress":
            continue
        if rel not in blocks.get(LAYERS[layer_of(m)][0], ""):
            missing.append(f"{rel} (layer {LAYERS[layer_of(m)][0]})")
    assert not missing, "not drawn in docs/architecture.md:\n" + "\n".join(missing)
