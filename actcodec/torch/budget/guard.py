"""The per-parameter guard of a policy without a budget: a save whose error, at the setting
the policy gives it, would move one parameter's gradient by more than GUARD (relative error
energy, measured in backward: actcodec.torch.sensitivity) is stored lossless from the next
step on. Found from what the probe measures, not from op names: the policy's rules (sensitive
kinds, exact kinds, overrides) still decide first, and the guard only takes bits up.

compress_saved guards policies of 8 bits or more (the default's promise); fewer bits trade
that promise for bytes, which the guard would take back. On the default 8-bit policy the
measured errors of most saves are orders of magnitude under GUARD; what the guard catches is
a save whose op amplifies its error many times, such as a statistic that backward
exponentiates. Several saves feed most parameters' gradients, so GUARD is a tenth of the
relative error energy (0.02) at which a gradient's cosine to the exact one falls to 0.99.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ... import choice
from . import noise
from . import planner
from . import sensitivity

GUARD = 2e-3
GUARDED_BITS = 8  # compress_saved guards policies of this many bits or more unless told


class Guard:
    """A context's guard, kept across its steps: which sites go lossless, and on profile steps
    what each watched save's noise would be at its setting."""

    def __init__(self):
        # From a context's second step: one made afresh for each step (a `with` in the loop)
        # costs nothing and is guarded by nothing; one entered every step is both.
        self.schedule = sensitivity.Schedule(first=1)
        self.lossless: set = set()  # site keys the guard stores lossless
        self.errors: dict = {}  # site key -> measured worst-parameter error at its setting
        self._noise: dict = {}  # site key -> (relative noise at its setting), this profile

    @property
    def probe(self):
        return self.schedule.probe

    def new_step(self) -> None:
        found = self.schedule.new_step()
        for site, (_, peak) in found.items():
            if site in self._noise:
                self.errors[site] = peak * self._noise[site]
                if self.errors[site] > GUARD:
                    self.lossless.add(site)
                else:
                    self.lossless.discard(site)
        self._noise = {}

    def setting_for(self, op: str, layer, t: torch.Tensor, setting):
        """(the setting this save gets, its site key)."""
        site = self.schedule.site(op, layer, t)
        if site in self.lossless:
            codec = "auto" if setting.codec in choice.LOSSY else setting.codec
            setting = replace(setting, bits=None, codec=codec)
        return setting, site

    def admit(self, t: torch.Tensor, packed, op: str, site) -> None:
        """On a profile step, watch a lossy save: its relative noise at the setting it was
        stored with, from its encoding's own group ranges."""
        probe, enc = self.probe, packed.enc
        if probe is None or enc is None or enc.codec not in choice.LOSSY:
            return
        bits, group = enc.params["bits"], enc.params["group_size"]
        noise1 = noise.noise_at_one_bit(t, enc).get(group)
        if noise1 is None:
            return
        self._noise[site] = planner.at_bits(noise1, bits)
        probe.watch(packed, site, op, bits, group)
