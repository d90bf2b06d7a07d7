"""ResNet50 whose single forward pass yields both the pooled embedding and the logits.

The weights are a plain torchvision ``resnet50`` state dict, so the same file can be loaded by
torchvision (our tests' reference) or by TorchServe's stock handler (the benchmark's peer).
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import ResNet, ResNet50_Weights, resnet50

# Weights whose transform and categories every archive uses, whatever checkpoint fills them.
WEIGHTS = ResNet50_Weights.IMAGENET1K_V2
EMBEDDING_DIM = 2048


class DualResNet50(nn.Module):
    """``forward(x) -> (embedding [N, 2048], logits [N, 1000])`` from one pass.

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


def build_dual(state_dict: dict[str, torch.Tensor] | None = None) -> DualResNet50:
    """A ``DualResNet50`` in eval mode, loaded from a torchvision resnet50 state dict."""
    backbone = resnet50(weights=None)
    if state_dict is not None:
        backbone.load_state_dict(state_dict)
    return DualResNet50(backbone).eval()
