"""The package's structure: layers only point down. No import circle among actcodec's
modules (imports inside functions included), no core module imports the torch layer or the
apps, the core encodes numpy without torch, and a tensor handed to the core finds the torch
backend by name."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import actcodec

ROOT = Path(actcodec.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict:
    """module -> the actcodec modules it imports anywhere in its source."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    compiled = {module_name(p) for p in ROOT.rglob("*.pyx")}  # the extension: imports nothing
    graph = {name: set() for name in compiled}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = node.module or ""
                base = (f"{base}.{mod}" if node.level else mod).strip(".")
                # `from pkg import sub` imports the submodule pkg.sub where one exists
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in graph or
                           f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            found.update(t for t in targets if (t in modules or t in graph) and t != name)
        graph[name] = found
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def is_core(name: str) -> bool:
    return not name.startswith(("actcodec.torch", "actcodec.apps", "actcodec.__main__"))


def test_no_import_circle():
    graph = imports()
    assert "actcodec.encoder" in graph["actcodec.quant"]  # the walk sees relative imports
    assert cycles(graph) == []


def test_the_walk_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_core_module_imports_the_torch_layer_or_the_apps():
    graph = imports()
    for name, targets in graph.items():
        if is_core(name):
            assert not [t for t in targets if not is_core(t)], name


def test_the_codec_core_imports_no_torch():
    """(actcodec.reduce, the Numba reductions, reads a torch tensor it is handed directly.)"""
    for path in ROOT.rglob("*.py"):
        if is_core(module_name(path)) and not module_name(path).startswith("actcodec.reduce"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                    else []
                assert not [n for n in names if n.split(".")[0] == "torch"], path.name


@pytest.mark.parametrize("path", ["budget/planner.py", "limit/limit_plan.py", "limit/planning.py"])
def test_the_planners_are_pure(path):
    """The budget's planner and the limit's solver take numbers and return choices: no torch,
    no locks."""
    source = (ROOT / "torch" / path).read_text()
    tree = ast.parse(source)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and not n.level}
    assert not names & {"torch", "threading", "numpy"}


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_numpy_encoding_imports_no_torch():
    out = run("import sys, numpy as np, actcodec\n"
              "x = np.random.default_rng(0).standard_normal(100000).astype('f4')\n"
              "e = actcodec.encode(x, bits=4)\n"
              "y = actcodec.from_bytes(e.to_bytes()).decode()\n"
              "actcodec.encode(np.maximum(x, 0)).decode()\n"
              "print('torch' in sys.modules, e.codec, y.shape)")
    assert out == "False quant (100000,)"


def test_a_tensor_finds_the_torch_backend_by_name():
    """A tensor handed to the core without `import actcodec.torch`: the core imports the
    backend it knows by the tensor's library name, and the buffers are tensors."""
    out = run("import sys, torch, actcodec\n"
              "assert 'actcodec.torch' not in sys.modules\n"
              "t = torch.relu(torch.randn(5000))\n"
              "e = actcodec.encode(t, bits=8)\n"
              "print('actcodec.torch' in sys.modules, type(e.buffers[0]).__name__,\n"
              "      type(e.decode()).__name__, torch.equal(actcodec.encode(t).decode(), t))")
    assert out == "True Tensor Tensor True"


def test_a_backend_that_cannot_import_names_its_import(monkeypatch):
    from actcodec import backends

    monkeypatch.setitem(backends._IMPORTS, "fakearrays", "actcodec.no_such_backend")
    Fake = type("Array", (), {"__module__": "fakearrays.core"})
    import pytest

    with pytest.raises(ImportError, match="import actcodec.no_such_backend"):
        actcodec.encode(Fake())
