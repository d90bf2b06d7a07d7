"""What every archive carries about the model itself: its input's recipe (``recipe``), its
definition (``resnet_dual``) and the table of files a weights folder holds (``artifacts``;
standard library only, make asks it before the venv exists). The runtimes that load those
files are the core's (``servecore.backends``); the steps that build them live in buildsteps/.

    recipe.py       the served input: the weights' transform up to its crop, without torchvision
    resnet_dual.py  the dual-output ResNet50 and the served model (uint8 crops in)
    artifacts.py    what a weights folder holds and which file each runtime loads
"""
