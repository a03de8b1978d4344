"""The demo's digits task (``python -m actcodec demo``, the default): scikit-learn's digits
(8x8 images, 0..16, shipped with it: no download), upsampled, and a small CNN."""
from __future__ import annotations

SEED = 0  # the train/test split; training seeds are 0..--seeds-1
TEST_FRACTION = 0.5  # 899 test images: one image is 0.11 points


def split(path: str) -> None:
    """The fixed split of scikit-learn's digits, saved for the workers: the parent makes it
    once, so no worker pays for importing scikit-learn."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()  # ships with scikit-learn: no download
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images.astype(np.float32), digits.target.astype(np.int64),
        test_size=TEST_FRACTION, random_state=SEED, stratify=digits.target)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def data(path: str, size: int):
    """Train and test tensors: upsampled bilinearly to size x size, normalized with the train
    set's mean and std."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    with np.load(path) as d:
        arrays = {k: torch.from_numpy(d[k]) for k in d.files}

    def images(x):
        x = (x / 16.0).unsqueeze(1)
        return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)

    x_train, x_test = images(arrays["x_train"]), images(arrays["x_test"])
    mean, std = x_train.mean(), x_train.std()
    return (((x_train - mean) / std).contiguous(), arrays["y_train"],
            ((x_test - mean) / std).contiguous(), arrays["y_test"])


def model(width: int, use_checkpoint: bool, seed: int = 0):
    """The demo's CNN, its weights from `seed`; `use_checkpoint`: non-reentrant
    torch.utils.checkpoint around every block while training."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    def unit(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    class DemoCNN(nn.Module):
        """A stem, four blocks of two conv-BN-ReLU units (two at full resolution, then 1/2 and
        1/4 with twice and four times the channels) and a linear head."""

        def __init__(self):
            super().__init__()
            w = width
            self.stem = nn.Sequential(*unit(1, w))
            self.blocks = nn.ModuleList([
                nn.Sequential(*unit(w, w), *unit(w, w)),
                nn.Sequential(*unit(w, w), *unit(w, w)),
                nn.Sequential(*unit(w, 2 * w, 2), *unit(2 * w, 2 * w)),
                nn.Sequential(*unit(2 * w, 4 * w, 2), *unit(4 * w, 4 * w)),
            ])
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10))

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                if use_checkpoint and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(x)

    torch.manual_seed(seed)
    return DemoCNN()
