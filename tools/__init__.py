"""Developer tools: sample images, the benchmark."""
