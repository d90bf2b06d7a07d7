"""The model's files: its definition, the weights and exports built from it (and their
table), and the runtimes that load them. Imports nothing from handlers/."""
