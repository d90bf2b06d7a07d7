"""Build steps `make` runs: weights, their exported forms, int8 quantisation, config.properties."""
