"""Build steps `make` runs: weights, their exported forms, int8 quantisation, config.properties.

weights.py     the served checkpoint (ImageNet, seeded, or yours) and where it came from;
               checkpoint.py reads and checks a user's checkpoint and labels
export.py      TorchScript, ONNX and OpenVINO files from it
quantize.py    the int8 OpenVINO IR, written only when its fidelity gate passes
evaluate.py    every precision an archive can run, on your photos and labels
configgen.py   config.properties from the one source of each setting; archive names
gpu.py         the GPU deployment's configs and archives
stage.py       what a bare, offline GPU host lacks (Java, TorchServe's and Triton's wheels),
               staged here in loads of a call's size, installed there (standard library only)
reference.py   docs/'s reference tables, from their sources in the code
dashboard.py   the Grafana dashboard, as code
"""
