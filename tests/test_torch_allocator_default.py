"""compress_saved installs actcodec's torch allocator on first use (the default path must lower
the process's peak, not raise it); allocator=False keeps torch's. A build says what it does;
where it cannot be built, one warning and the plain path. Fresh processes: the allocator is
one per process."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

STEP = ("import torch, actcodec.torch as act\n"
        "x = torch.randn(512, 1024, requires_grad=True)\n"
        "def step(**kw):\n"
        "    with act.compress_saved(**kw) as c:\n"
        "        loss = (x * 1.0).exp().sum()\n"
        "    loss.backward()\n"
        "    return c\n")


def run(code: str, env=None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-W", "always", "-c", STEP + code], capture_output=True,
                       text=True, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                    reason="no C++ compiler or ninja: the allocator cannot be built here "
                           "(test_without_a_build_one_warning_and_the_plain_path covers that)")
def test_compress_saved_installs_the_allocator_unless_told_not_to():
    out = run("step(allocator=False); a = act.allocator.installed()\n"
              "step(store=None); b = act.allocator.installed()\n"
              "step(); c = act.allocator.installed()\n"
              "print(a, b, c)").stdout.split()
    assert out == ["False", "False", "True"]


def test_without_a_build_one_warning_and_the_plain_path():
    r = run("def fail():\n"
            "    raise OSError('no C++ compiler here')\n"
            "act.allocator._build = fail\n"
            "for _ in range(3):\n"
            "    c = step()\n"
            "print(act.allocator.installed(), c.stats.tensors, bool(torch.isfinite(x.grad).all()))")
    assert r.stdout.split() == ["False", "1", "True"]
    assert r.stderr.count("actcodec could not build its torch allocator") == 1
    assert "no C++ compiler here" in r.stderr and "allocator=False" in r.stderr


def test_a_build_says_what_it_does(tmp_path):
    """An uncached build prints what it builds and why before it starts (the real build, about
    a minute, is replaced by a stand-in)."""
    r = run("import torch.utils.cpp_extension as ext\n"
            "class Fake:\n"
            "    def install(self, *a): self.on = True\n"
            "    def installed(self): return getattr(self, 'on', False)\n"
            "ext.load = lambda **kw: Fake()\n"
            "step(); step()\n"
            "print(act.allocator.installed())",
            env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert r.stdout.split() == ["True"]
    assert r.stderr.count("actcodec: compiling its torch allocator") == 1
    assert str(tmp_path) in r.stderr and "allocator built in" in r.stderr


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                    reason="no C++ compiler or ninja: the allocator cannot be built here")
def test_a_build_made_before_is_loaded_as_it_is():
    """A process after the first loads the build for its torch and source directly: torch's
    build tools are not imported, nothing is compiled or checked (0.15 s of a first step)."""
    run("step()")  # built here if no process before built it
    r = run("import sys\n"
            "step()\n"
            "print(act.allocator.installed(), 'torch.utils.cpp_extension' in sys.modules)")
    assert r.stdout.split() == ["True", "False"]
    assert "compiling" not in r.stderr


def test_a_model_off_the_host_installs_nothing(tmp_path):
    """A model whose parameters all live on another device keeps its activations there: the
    host allocator would only cost its build."""
    r = run("import torch.utils.cpp_extension as ext\n"
            "class Fake:\n"
            "    def install(self, *a): self.on = True\n"
            "    def installed(self): return getattr(self, 'on', False)\n"
            "ext.load = lambda **kw: Fake()\n"
            "with act.compress_saved(model=torch.nn.Linear(4, 4, device='meta')): pass\n"
            "off_host = act.allocator.installed()\n"
            "with act.compress_saved(model=torch.nn.Linear(4, 4)): pass\n"
            "print(off_host, act.allocator.installed())",
            env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert r.stdout.split() == ["False", "True"]
    assert r.stderr.count("actcodec: compiling its torch allocator") == 1
