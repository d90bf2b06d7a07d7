"""Export the dual-output ResNet50 for the faster runtimes.

    python -m buildsteps.export --backend onnx|torchscript|openvino [--weights build/weights]

reads ``resnet50.pt`` from the weights folder and writes next to it
``resnet50_dual.onnx`` (ONNX Runtime; opset 17, dynamic batch),
``resnet50_dual.torchscript.pt`` (traced and frozen) or ``resnet50_dual.xml`` + ``.bin``
(OpenVINO IR converted from the ONNX file, weights kept float32). All take ``input``
[N, 3, 224, 224] uint8, the preprocessed crop, and normalise it in the graph
(``model_files.resnet_dual.ServedResNet50``), and return ``embedding`` [N, 2048] and ``logits``
[N, classes] from one run. An export is redone only when the checkpoint's sha256 or the served
input (``recipe.INPUT``) changed (``<file>.sha256``).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from model_files.artifacts import (
    CHECKPOINT,
    SERIALIZED,
    is_current,
    mark_current,
    model_source,
)

EXPORTED = tuple(b for b in SERIALIZED if SERIALIZED[b] != CHECKPOINT)  # onnx, torchscript


def export(backend: str, weights_dir: Path) -> Path:
    """Write the backend's file for the checkpoint in ``weights_dir``; return its path."""
    target = weights_dir / SERIALIZED[backend]
    if backend not in EXPORTED:
        return target
    sha256 = model_source(weights_dir)
    if is_current(target, sha256):
        return target
    if backend == "openvino":
        _onnx_to_ir(export("onnx", weights_dir), target)
        mark_current(target, sha256)
        print(f"exported {backend}: {target}")
        return target

    import torch

    from model_files.resnet_dual import build_served

    model = build_served(
        torch.load(weights_dir / CHECKPOINT, map_location="cpu", weights_only=True)
    )
    example = torch.randint(0, 256, (2, 3, 224, 224), dtype=torch.uint8)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer/exporter deprecation chatter
        if backend == "onnx":
            torch.onnx.export(
                model,
                (example,),
                str(target),
                input_names=["input"],
                output_names=["embedding", "logits"],
                dynamic_axes={name: {0: "batch"} for name in ("input", "embedding", "logits")},
                opset_version=17,
                dynamo=False,
            )
        else:
            torch.jit.freeze(torch.jit.trace(model, example).eval()).save(str(target))
    mark_current(target, sha256)
    print(f"exported {backend}: {target}")
    return target


def _onnx_to_ir(onnx: Path, xml: Path) -> None:
    """ONNX -> OpenVINO IR. ``read_model`` is the same conversion as ``ov.convert_model`` for
    an ONNX file without the converter's telemetry. ``compress_to_fp16=False``: save_model's
    default stores the weights as float16, which changes float32 results (0.05% embedding
    error)."""
    import openvino as ov

    model = ov.Core().read_model(str(onnx))
    model.reshape({"input": ov.PartialShape([-1, 3, 224, 224])})
    ov.save_model(model, str(xml), compress_to_fp16=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(SERIALIZED), required=True)
    parser.add_argument("--weights", type=Path, default=Path("build/weights"))
    args = parser.parse_args(argv)
    export(args.backend, args.weights)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
