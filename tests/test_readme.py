"""Every Python snippet in README.md runs as printed, each in a fresh process. The snippets
that use a model take the names a reader brings (`model`, `x`, `y`, `loss_fn`, `batches`)
from SETUP, a small CNN on random images; the Step snippet builds its own model."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)

SETUP = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 32 * 32, 10))
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
loss_fn = F.cross_entropy
batches = [(x, y)] * 2
"""


def test_the_readme_has_snippets():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_a_readme_snippet_runs_as_printed(index):
    code = BLOCKS[index]
    if "import actcodec.torch as act" not in code and "act." in code:
        code = "import actcodec.torch as act\n" + code
    r = subprocess.run([sys.executable, "-c", SETUP + code], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"README block {index + 1} failed:\n{code}\n{r.stderr[-3000:]}"
