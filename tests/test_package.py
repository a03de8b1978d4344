"""The installed package is the library users call: no benchmark, report or model modules, and
nothing in it imports the lab (bench/ runs from a checkout)."""
import pkgutil
import re
from pathlib import Path

import actcodec

LAB = re.compile(r"bench|stepbench|report|models|tuning|regime")


def test_no_lab_modules_in_the_package():
    names = [m.name for m in pkgutil.walk_packages(actcodec.__path__, "actcodec.")]
    assert "actcodec.torch.save.hooks" in names and "actcodec.choice" in names
    assert [n for n in names if LAB.search(n)] == []


def test_the_package_imports_nothing_from_the_lab():
    root = Path(actcodec.__file__).parent
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*(from|import)\s", line):
                assert not LAB.search(line), f"{path.name}: {line.strip()}"


def test_the_apps_use_only_the_public_api():
    """actcodec.apps (the demo and memory commands) imports actcodec, actcodec.torch's exported
    names and actcodec.store, and its own modules; never a private module of the library."""
    import ast

    import actcodec.apps

    import types

    public = {"actcodec": {*actcodec.__all__, "store", "torch", "__version__"},
              "actcodec.torch": None, "actcodec.store": None}
    public.update({f"actcodec.{n}": None for n in actcodec.__all__
                   if isinstance(getattr(actcodec, n), types.ModuleType)})
    for path in Path(actcodec.apps.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("actcodec"):
                        assert alias.name in public, f"{path.name}: import {alias.name}"
            elif isinstance(node, ast.ImportFrom):
                where = f"{path.name}: from {'.' * node.level}{node.module or ''} import"
                if node.level:
                    assert node.level == 1, where  # the apps' own modules only
                elif node.module and node.module.startswith("actcodec"):
                    assert node.module in public, where
                    names = public[node.module]
                    if node.module == "actcodec.torch":
                        import actcodec.torch

                        names = set(actcodec.torch.__all__)
                    for alias in node.names:
                        assert names is None or alias.name in names, f"{where} {alias.name}"


def test_info_imports_no_torch():
    """`python -m actcodec info` builds the parser from the apps' command modules, which
    import neither torch nor the apps' workers."""
    import subprocess
    import sys

    code = ("import sys; from actcodec.__main__ import main; main(['info']); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.endswith('_worker') "
            "or m.endswith('demo_train')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
