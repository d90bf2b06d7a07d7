"""What every archive carries besides the handler: the model's definition, the table of files
a weights folder holds, and the runtimes that load them (archive.sh packs this folder whole).
Imports nothing from handlers/; the steps that build these files live in buildsteps/."""
