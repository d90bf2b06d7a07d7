"""Model definition and weight building for the ResNet50 embedding/tagging archives."""
