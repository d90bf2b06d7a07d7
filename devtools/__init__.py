"""Development tools: the config generator, a local TorchServe launcher for tests and the
benchmark, sample images, the Java check. Nothing here is imported by the handler."""
