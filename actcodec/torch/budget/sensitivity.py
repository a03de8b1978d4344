"""Importance from backward (GACT, ActNN): how much a save's compression error moves the
parameters' gradients, measured while backward runs.

On a profile step each save the budget plans (or the guard watches) is watched. When backward
first unpacks a save of the step, every node still to run gets two hooks: before it runs, its
incoming gradients are kept; after it has run, if it read watched saves, it is called again on
those same gradients, once with its saves as they are and once per watched save with that save
perturbed by noise shaped as quantization noise (uniform, one step of 2^PROBE_BITS per group of
GROUP elements, zeros and signs kept where the op reads signs). The error each of its outputs
gets goes on through the graph: where it enters a node it is taken relative to everything that
node receives (so an error in a branch is diluted where the branch joins a larger gradient),
and it leaves the node in proportion to each output's energy, until it reaches the parameters.
Per unit of the save's relative noise, the sum over parameters of the relative error energy
each gets is the save's *gain*, the most one gets its *peak* (actcodec.torch.planner.Site).

The node that unpacks the first save has already started, so its incoming gradients cannot be
seen: its saves are not measured (the budget gives them the median gain of their op's kind).
Nothing here changes what backward computes: the calls again run without grad, on copies
where saves are perturbed, and their results are dropped.
"""
from __future__ import annotations

import contextvars
import math
import weakref

import torch

from .noise import squared_norm
from ..save.policy import SIGN_READ

# Profile steps: a context's first (its second for the guard); then, where the caller says
# what its saves look like (the budget: each site's noise at 1 bit), when that has drifted by
# DRIFT (the median over sites of the relative change since the last profile; at most every
# DRIFT_GAP steps), as training changes the model; and every PROFILE_EVERY at the latest.
# One calls each watched save's op once more in backward, which costs one to several steps'
# time.
PROFILE_EVERY = 500
DRIFT, DRIFT_GAP = 0.25, 25
PROBE_BITS = 4  # the perturbation's step: small enough for the op to act linearly on it
GROUP = 64  # elements per group whose range sets the perturbation's step
_KEY = "actcodec_probe"  # where a node's metadata holds the key a probe gave it
# While a node is called again: (the probe, the save to perturb or None).
AGAIN: contextvars.ContextVar = contextvars.ContextVar("actcodec_probe_again", default=None)


class Schedule:
    """A context's steps as the probe sees them: which profile, and each save's site key (its
    op, layer, shape and dtype, and how many such saves came before it in the step)."""

    def __init__(self, first: int = 0):
        self.steps, self.first = 0, first  # the step that profiles first
        self.probe: Probe | None = None
        self._ordinals: dict = {}
        self.last: int | None = None  # the step that profiled last
        self.reference: dict = {}  # the saves' state as the last profile found it
        self.profiles = 0

    def new_step(self, profile: bool = True, state: dict | None = None) -> dict:
        """A step begins: what the last one's probe measured ({site: (gain, peak)}); this
        one profiles if it is due (and `profile`). `state`: {site: a positive number that
        moves with what the model saves there}, for profiling when it drifts."""
        found = self.probe.result() if self.probe is not None else {}
        state = state or {}
        if self.last is not None and not self.reference:
            self.reference = dict(state)  # the first state seen after that profile
        due = profile and self.steps >= self.first and (
            self.last is None or self.steps - self.last >= PROFILE_EVERY or (
                self.steps - self.last >= DRIFT_GAP and drift(self.reference, state) >= DRIFT))
        if due:
            self.last, self.reference, self.profiles = self.steps, dict(state), self.profiles + 1
        self.probe = Probe(seed=self.steps) if due else None
        self.steps += 1
        self._ordinals = {}
        return found

    def site(self, op: str, layer, t: torch.Tensor) -> tuple:
        kind = (op, layer, tuple(t.shape), t.dtype)
        n = self._ordinals.get(kind, 0)
        self._ordinals[kind] = n + 1
        return (*kind, n)


def drift(before: dict, now: dict) -> float:
    """The median relative change from `before` to `now` over the keys both hold (0 if none)."""
    changes = sorted(abs(now[k] - b) / b for k, b in before.items() if b > 0 and k in now)
    if not changes:
        return 0.0
    mid = len(changes) // 2
    return changes[mid] if len(changes) % 2 else (changes[mid - 1] + changes[mid]) / 2


class Probe:
    """One profile step's measurements, per site key: `gains`, the relative error energy per
    unit of the save's relative noise summed over the parameters it reaches, and `peaks`,
    the largest one parameter gets."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.gains: dict = {}
        self.peaks: dict = {}
        self._watched: dict = {}  # id(packed) -> (site key, op, (bits, group) of its noise)
        self._hooked = self._done = False
        # Nodes by the key the walk writes in their metadata, saves by weak reference: a
        # backward that raises leaves nothing of its graph held here (the engine's callback at
        # the end of a backward does not run then).
        self._tag = (object(), 0)  # this probe's keys: (its tag, a number per node)
        self._measured: set = set()  # keys of the nodes hooked
        self._incoming: dict = {}  # node key -> its incoming gradients, until it has run
        self._read: dict = {}  # node key -> weak references to the watched saves it unpacked
        # (node key, input) -> {site: error energy per unit of relative noise} until that node's
        # incoming gradient (everything that flows into that input, summed) is known
        self._pending: dict = {}
        self._carried: dict = {}  # node key -> {site: relative error} in its incoming gradient
        self._draws = 0  # perturbations drawn: each its own noise
        self._noise = 0.0  # the last perturbation's relative noise energy
        self._restored: dict = {}  # id(packed) -> decoded, while one node is measured

    def watch(self, packed, site, op: str, bits: int = PROBE_BITS, group: int = GROUP) -> None:
        """Measure `packed`'s gain as `site`'s when backward reads it, with noise of `bits`
        in groups of `group` (the guard gives a save's own setting: an op that compares its
        save with constants, such as clamp's bounds, is not linear in the noise, and its
        error at 8 bits is many times what 4 bits' would predict)."""
        self._watched[id(packed)] = (site, op, (bits, group))
        packed.probe = self
        weakref.finalize(packed, self._watched.pop, id(packed), None)

    def seen(self, packed) -> None:
        """`packed` is a save of this step too (not watched): its unpacking may be the first."""
        packed.probe = self

    def unpacked(self, packed) -> None:
        """Backward has just unpacked `packed`, a save of this step, in the running node."""
        node = torch._C._current_autograd_node()
        if node is None or not self._watched:
            return
        if not self._hooked:
            self._hooked = True
            self._hook_upstream(node)
            # When this backward is done, nothing of its graph is held here (a graph kept by
            # retain_graph must be freed with its last reference, not with this probe).
            torch.autograd.Variable._execution_engine.queue_callback(self._let_go)
        if _key(node) in self._measured and id(packed) in self._watched:
            self._read.setdefault(_key(node), []).append(weakref.ref(packed))

    def _let_go(self) -> None:
        self._done = True  # a second backward through a retained graph measures nothing
        self._measured, self._incoming, self._read = set(), {}, {}
        self._pending, self._carried, self._restored = {}, {}, {}

    def _hook_upstream(self, start) -> None:
        start.metadata[_KEY] = key = self._tag
        seen, stack = {key}, [start]
        while stack:
            for nxt, _ in stack.pop().next_functions:
                if nxt is not None and nxt.metadata.get(_KEY, (None,))[0] != self._tag[0]:
                    nxt.metadata[_KEY] = key = (self._tag[0], len(seen))
                    seen.add(key)
                    nxt.register_prehook(self._receive)
                    nxt.register_hook(self._after)
                    stack.append(nxt)
        seen.discard(self._tag)
        self._measured = seen

    # The hooks find their node as the one running: a hook that held its node would make a
    # cycle through autograd's C++ objects, which nothing collects.
    def _receive(self, grads):
        if self._done:
            return
        node = torch._C._current_autograd_node()
        self._incoming[_key(node)] = grads
        # Errors in any of its incoming gradients, relative to all of them together (a
        # split's backward joins its pieces' gradients into one).
        waiting = [self._pending.pop((_key(node), i), None) for i in range(len(grads))]
        carried: dict = {}
        if any(waiting):
            energy = sum(squared_norm(g) for g in grads)
            for errors in filter(None, waiting):
                for site, error in errors.items():
                    if energy > 0:
                        carried[site] = carried.get(site, 0.0) + error / energy
        if not carried:
            return
        if not node.next_functions and type(node).__name__ == "AccumulateGrad":
            for site, relative in carried.items():  # a parameter's gradient reached
                self.gains[site] = self.gains.get(site, 0.0) + relative
                self.peaks[site] = max(self.peaks.get(site, 0.0), relative)
        else:
            self._carried[_key(node)] = carried

    def _after(self, grad_inputs, _grad_outputs):
        if self._done:
            return
        node = torch._C._current_autograd_node()
        grads = self._incoming.pop(_key(node), None)
        read = [p for p in (r() for r in self._read.pop(_key(node), ())) if p is not None]
        carried = self._carried.pop(_key(node), None)
        if torch.is_grad_enabled():
            return  # a backward that builds a graph
        if carried:  # relative errors that came in go on in each output's own energy
            for (nxt, i), out in zip(node.next_functions, grad_inputs):
                energy = squared_norm(out) if nxt is not None else 0.0
                if energy > 0:
                    self._add((_key(nxt), i), {s: r * energy for s, r in carried.items()})
        if grads is not None and read:
            self._measure(node, grads, read)

    def _add(self, where, errors: dict) -> None:
        waiting = self._pending.setdefault(where, {})
        for site, error in errors.items():
            waiting[site] = waiting.get(site, 0.0) + error

    def _measure(self, node, grads, read) -> None:
        """Calls `node` again, clean and with each watched save it read perturbed; each
        output's error energy goes on to the node its gradient flows into."""
        unique = list({id(p): p for p in read}.values())
        self._restored = {}  # each save decoded once for all the calls
        try:
            with torch.no_grad():
                self._measure_each(node, grads, unique)
        finally:
            self._restored = {}

    def _measure_each(self, node, grads, unique) -> None:
        clean = self._again(node, grads, None)
        if clean is not None:
            for packed in unique:
                site = self._watched.get(id(packed), (None,))[0]
                moved, noise = self._again(node, grads, packed), self._noise
                if moved is None or noise <= 0 or site is None:
                    continue
                for (nxt, i), a, b in zip(node.next_functions, clean, moved):
                    if nxt is not None and isinstance(a, torch.Tensor) and \
                            isinstance(b, torch.Tensor):
                        self._add((_key(nxt), i), {site: squared_norm(b - a) / noise})

    def _again(self, node, grads, target):
        token = AGAIN.set((self, target))
        self._noise = 0.0
        try:
            out = node(*grads)
        except (RuntimeError, TypeError):  # a node that cannot be called twice: no measure
            return None
        finally:
            AGAIN.reset(token)
        return out if isinstance(out, tuple) else (out,)

    def value(self, packed) -> torch.Tensor:
        """What a save unpacks as while a node is called again: as it is, or perturbed when
        it is the save being measured."""
        t = self._restored.get(id(packed))
        if t is None:
            t = self._restored[id(packed)] = packed.restore()
        if packed is not AGAIN.get()[1]:
            return t
        site_op = self._watched.get(id(packed))
        self._draws += 1
        bits, group = site_op[2] if site_op is not None else (PROBE_BITS, GROUP)
        moved, self._noise = perturbed(t, self.seed * 2**20 + self._draws,
                                       site_op is not None and site_op[1] in SIGN_READ,
                                       bits, group)
        return moved

    def result(self) -> dict:
        """{site key: (gain, peak)}."""
        return {site: (gain, self.peaks[site]) for site, gain in self.gains.items()}


def perturbed(t: torch.Tensor, seed: int, keep_signs: bool, bits: int = PROBE_BITS,
              group: int = GROUP) -> tuple[torch.Tensor, float]:
    """(t plus noise shaped as quantization noise at `bits` in groups of `group` elements,
    the noise's energy relative to t's). keep_signs: zeros stay zero and positives positive
    (what a ReLU output's codec keeps)."""
    flat = t.detach().reshape(-1).float()
    energy = squared_norm(flat)
    whole = flat.numel() // group * group
    if whole == 0 or energy == 0 or not math.isfinite(energy):
        return t, 0.0
    lo, hi = torch.aminmax(flat[:whole].view(-1, group), dim=1)
    step = (hi - lo) / float((1 << bits) - 1)
    gen = torch.Generator(device=flat.device).manual_seed(seed % 2**63)
    u = torch.rand(whole, generator=gen, device=flat.device) - 0.5
    moved = flat.clone()
    moved[:whole] += (u.view(-1, group) * step[:, None]).reshape(-1)
    if keep_signs:
        tiny = torch.finfo(torch.float32).tiny
        moved = torch.where(flat > 0, moved.clamp_min(tiny), flat)
    out = moved.to(t.dtype).reshape(t.shape)
    return out, squared_norm(out.reshape(-1).float() - flat) / energy


def _key(node):
    """The key a probe's walk gave `node` (None: not walked)."""
    return node.metadata.get(_KEY)



