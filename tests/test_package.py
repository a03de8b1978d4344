"""The installed package is the library users call: no benchmark, report or model modules, and
nothing in it imports the lab (bench/ runs from a checkout)."""
import pkgutil
import re
from pathlib import Path

import actcodec

LAB = re.compile(r"bench|stepbench|report|models|tuning|regime")


def test_no_lab_modules_in_the_package():
    names = [m.name for m in pkgutil.walk_packages(actcodec.__path__, "actcodec.")]
    assert "actcodec.torch.hooks" in names and "actcodec.choice" in names
    assert [n for n in names if LAB.search(n)] == []


def test_the_package_imports_nothing_from_the_lab():
    root = Path(actcodec.__file__).parent
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*(from|import)\s", line):
                assert not LAB.search(line), f"{path.name}: {line.strip()}"
