"""Development tools: a local TorchServe launcher for tests and the benchmark, the simulated
KServe pod, sample images, the Java check. Nothing here is imported by the handler."""
