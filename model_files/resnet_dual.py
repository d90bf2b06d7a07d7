"""ResNet50 whose single forward pass yields both the pooled embedding and the logits, and the
served model around it, which takes the preprocessed crop as uint8 and normalises it itself.

The weights are a plain torchvision ``resnet50`` state dict, so the same file can be loaded by
torchvision (our tests' reference) or by TorchServe's stock handler (the benchmark's peer).

The served input (``INPUT``): ``uint8 [N, 3, 224, 224]``, RGB, channels first: the weights' own
transform up to its crop (shorter side resized to 232, bilinear with antialias, centre crop
224: ``model_files.recipe``), the pixels as PIL gives them. What the transform does after the
crop (to float in [0, 1], ImageNet mean/std: ``model_files.recipe.normalize``) runs inside the
model, on whatever device the model runs on, with torchvision's own arithmetic: answers equal
the float transform's. A uint8 crop is 4x smaller to stack, copy and send than its float
tensor.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import ResNet, ResNet50_Weights, resnet50

from model_files.recipe import MEAN, STD, normalized

# Weights whose transform and categories every archive uses, whatever checkpoint fills them.
WEIGHTS = ResNet50_Weights.IMAGENET1K_V2
EMBEDDING_DIM = 2048


class DualResNet50(nn.Module):
    """``forward(x) -> (embedding [N, 2048], logits [N, classes])`` from one pass, ``x`` the
    normalised float input; ``classes`` is the checkpoint's own (its ``fc``'s rows).

    ``embedding`` is the global-average-pooled output of ``layer4`` (torchvision's
    ``avgpool`` + ``flatten``), before the classifier; ``logits = fc(embedding)``.
    """

    def __init__(self, backbone: ResNet) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.backbone
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        x = b.layer4(b.layer3(b.layer2(b.layer1(x))))
        embedding = torch.flatten(b.avgpool(x), 1)
        return embedding, b.fc(embedding)


class ServedResNet50(nn.Module):
    """``forward(uint8 [N, 3, 224, 224]) -> (embedding, logits)``: ``normalize`` in the dtype
    of the weights, then the dual pass; ``channels_last`` lays the normalised input out as
    the weights are laid out (set by a backend that converted them)."""

    mean: torch.Tensor  # buffers, [3, 1, 1]
    std: torch.Tensor

    def __init__(self, dual: DualResNet50) -> None:
        super().__init__()
        self.dual = dual
        self.channels_last = False
        # The constants live where the model lives (moved and cast with it: ``.to(device)``,
        # ``.half()``), not built and copied to the device at every forward; not persistent,
        # so the state dict stays torchvision's.
        self.register_buffer("mean", torch.tensor(MEAN).view(-1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(STD).view(-1, 1, 1), persistent=False)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = self.dual.backbone.conv1.weight.dtype
        x = normalized(pixels, dtype, self.mean.to(dtype), self.std.to(dtype))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.dual(x)


def build_dual(state_dict: dict[str, torch.Tensor] | None = None) -> DualResNet50:
    """A ``DualResNet50`` in eval mode, loaded from a torchvision resnet50 state dict whose
    ``fc`` has any number of classes (its rows; torchvision's 1,000 when no state is given)."""
    fc = None if state_dict is None else state_dict.get("fc.weight")
    backbone = resnet50(weights=None, **({} if fc is None else {"num_classes": fc.shape[0]}))
    if state_dict is not None:
        backbone.load_state_dict(state_dict)
    return DualResNet50(backbone).eval()


def build_served(state_dict: dict[str, torch.Tensor] | None = None) -> ServedResNet50:
    """The served model (uint8 crops in) around ``build_dual(state_dict)``, in eval mode."""
    return ServedResNet50(build_dual(state_dict)).eval()
