"""The state an optimizer's next `step()` will create: a limit accepted at the first training
step must still hold at the second, after AdamW has made its two moments. What exists
already is in the process's floor; only the state not yet made is counted here."""
from __future__ import annotations

import torch

# Tensors of a parameter's size each optimizer keeps per parameter (torch.optim's own, by
# class name); one not named here is counted as Adam's two, which covers the common ones.
PER_PARAMETER = {"SGD": 0, "Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2,
                 "Adagrad": 1, "Adadelta": 2, "RMSprop": 1, "ASGD": 1, "Rprop": 2,
                 "SparseAdam": 2, "LBFGS": 2, "Adafactor": 1}
UNKNOWN = 2


def tensors_per_parameter(optimizer, group: dict) -> int:
    name = type(optimizer).__name__
    n = PER_PARAMETER.get(name, UNKNOWN)
    if name == "SGD" and group.get("momentum", 0):
        n = 1
    if name in ("Adam", "AdamW") and group.get("amsgrad", False):
        n += 1
    if name == "RMSprop":
        n += bool(group.get("momentum", 0)) + bool(group.get("centered", False))
    return n


def pending_bytes(optimizer) -> int:
    """Bytes the optimizer's state will add at its next step for the parameters it has no
    state for yet (0 for None, and once every parameter has its state)."""
    if optimizer is None:
        return 0
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    total = 0
    for group in optimizer.param_groups:
        n = tensors_per_parameter(optimizer, group)
        for p in group["params"]:
            if p.requires_grad and not optimizer.state.get(p):
                total += n * p.numel() * p.element_size()
    return total


def step_bytes(optimizer) -> int:
    """Bytes above the floor the optimizer's `step()` needs right after a training step: the
    gradients of the parameters it updates (all there by then) and its temporaries (see
    step_parts). 0 for None: without the optimizer Step cannot see its step."""
    return sum(step_parts(optimizer))


def step_parts(optimizer) -> tuple[int, int]:
    """(gradients not made yet, temporaries) of the optimizer's `step()`, in bytes (a
    gradient that exists is in the floor already). A single-tensor update
    (torch.optim's default on the CPU) makes two of one parameter's size at a time (Adam's
    denominator: a square root, then its quotient), a foreach update one per parameter of a
    group at once (torch.optim's default where every parameter is on a device with foreach
    kernels: CUDA), a fused one none; SGD without momentum none."""
    if optimizer is None:
        return 0, 0
    pending_bytes(optimizer)  # the type check
    grads, temporaries = 0, 0
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in params]
        grads += sum(s for p, s in zip(params, sizes) if p.grad is None)  # the rest: floor
        if not sizes or tensors_per_parameter(optimizer, group) == 0 or group.get("fused"):
            continue
        temporaries = max(temporaries, sum(sizes) if _foreach(group, params) else 2 * max(sizes))
    return grads, temporaries


def _foreach(group: dict, params: list) -> bool:
    """Whether the group's update runs foreach: as set, else (neither foreach nor fused
    set) torch.optim's default: foreach where every parameter is on a device that has its
    kernels, and nothing asks otherwise."""
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    if group.get("fused") is not None:  # torch defaults only where neither is set
        return False
    if group.get("differentiable") or (isinstance(group.get("lr"), torch.Tensor) and
                                       not group.get("capturable")):
        return False
    devices = foreach_devices()
    return all(p.device.type in devices for p in params)


def foreach_devices() -> tuple:
    """The device types torch.optim runs foreach updates on by default."""
    try:
        from torch.optim.optimizer import _get_foreach_kernels_supported_devices
    except ImportError:  # an older or newer torch: its long-standing default
        return ("cuda",)
    return tuple(_get_foreach_kernels_supported_devices())
