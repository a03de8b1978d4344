"""Vision-language batches whose images are rows of patches, not a row per sample (Qwen2-VL's
and its successors': `pixel_values` holds every image's patches in order and `image_grid_thw`
a row per image, each image's patches its row's product; videos alike), cut by sample: each
sample's images go with it. Which images are a sample's is read as transformers reads it:
each run of image tokens (1) or video tokens (2) in the sample's row of `mm_token_type_ids`
is one image or video, in order."""
from __future__ import annotations

from collections.abc import Mapping

import torch

# (token type, the patches' key, the grid's key, keys of one item per image or video)
KINDS = ((1, "pixel_values", "image_grid_thw", ()),
         (2, "pixel_values_videos", "video_grid_thw", ("second_per_grid_ts",)))


def applies(batch) -> bool:
    """Whether the batch holds images or videos as rows of patches with a grid each."""
    return isinstance(batch, Mapping) and \
        isinstance(batch.get("mm_token_type_ids"), torch.Tensor) and \
        any(isinstance(batch.get(grid), torch.Tensor) for _, _, grid, _ in KINDS)


def take(batch: Mapping, start: int, stop: int) -> dict:
    """The values of samples start:stop that are cut by image (the patches, the grid and what
    has one item per image; None where those samples have none); ValueError where the grid
    does not hold the images the token types name, or the patches are not the grid's."""
    types = batch["mm_token_type_ids"]
    out = {}
    for kind, pixels, grid, per_item in KINDS:
        thw = batch.get(grid)
        if not isinstance(thw, torch.Tensor):
            continue
        items = _runs(types, kind)
        if sum(items) != thw.shape[0]:
            raise ValueError(f"{grid} has {thw.shape[0]} rows, but mm_token_type_ids has "
                             f"{sum(items)} runs of type {kind}: not one row per image")
        first = sum(items[:start])
        last = first + sum(items[start:stop])
        if last == first:  # none: as a processor gives samples of text only
            out.update({key: None for key in (pixels, grid, *per_item) if key in batch})
            continue
        ends = [0] + thw.prod(-1).cumsum(0).tolist()
        patches = batch.get(pixels)
        if isinstance(patches, torch.Tensor):
            if patches.shape[0] != ends[-1]:
                raise ValueError(f"{pixels} has {patches.shape[0]} rows, but {grid} makes "
                                 f"{ends[-1]} patches")
            out[pixels] = patches[ends[first]:ends[last]]
        out[grid] = thw[first:last]
        for key in per_item:
            if key in batch and batch[key] is not None:
                out[key] = batch[key][first:last]
    return out


def _runs(types: torch.Tensor, kind: int) -> list:
    """Per sample, the runs of `kind` in its row of token types (one read)."""
    of_kind = types == kind
    starts = of_kind[:, :1].sum(1) + (of_kind[:, 1:] & ~of_kind[:, :-1]).sum(1)
    return starts.tolist()
