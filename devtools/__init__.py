"""Development tools: a local TorchServe launcher for tests and the benchmark, sample images,
the Java and kubectl checks. Nothing here is imported by the handler, nor imports kserve_tools."""
