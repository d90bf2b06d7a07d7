"""Client-side preprocessing (``tsctl embed/tag --preprocess client``): each photo decoded and
cropped on this machine's cores with the served recipe (``model_files.recipe.crop`` through
the core's own ``Preprocessor``: the same limits, draft decoding as the server is set, the same
errors) and sent as the model's ``crops`` input (``servecore.crops``): 150 KB an image on the
wire instead of the file (a 12 MP photo is several MB), and no decoding on the server.

Refuses, before anything is sent, a server whose describe reports another recipe: crops made
differently would be answered without error but not as the server would answer the files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from serveclient import errors

MODES = ("auto", "client", "server")
# The server's handler settings the client-side crop honours as the server would.
HONOURED = ("draft_decode", "max_image_pixels", "max_image_bytes")


class ClientCrops:
    """Encoded image bytes -> uint8 [224, 224, 3], as the server described by ``entry`` (its
    customized describe entry) would crop them; ``UsageError`` when its recipe is not ours."""

    def __init__(self, entry: dict | None) -> None:
        from model_files.recipe import PREPROCESSING
        from servecore.config import HandlerConfig
        from servecore.preprocessor import Preprocessor

        custom = (entry or {}).get("customizedMetadata")
        served = custom.get("preprocessing") if isinstance(custom, dict) else None
        if served != PREPROCESSING:
            version = served.get("input") if isinstance(served, dict) else None
            raise errors.UsageError(
                f"the server's preprocessing recipe is {version or 'not described'}, this "
                f"client's is {PREPROCESSING['input']}: crops made here would not be the "
                "server's",
                "use --preprocess server, or a tsctl of the server's release",
            )
        handler = (custom if isinstance(custom, dict) else {}).get("handler") or {}
        self.preprocessor = Preprocessor(
            HandlerConfig.from_mapping({k: handler[k] for k in HONOURED if k in handler})
        )

    def __call__(self, data: bytes) -> np.ndarray:
        """The crop, or the server's own ``RequestError`` for a bad image."""
        return self.preprocessor(data).permute(1, 2, 0).numpy()


def client_side(mode: str, entry: dict | None, url: str) -> bool:
    """Whether to preprocess here: ``client``/``server`` as asked; ``auto``: yes unless the
    server is a CPU server on this machine (then both sides decode on the same cores and the
    server's own decode is the one path that every client shares), describe is unreadable, or
    this client cannot crop (the collection job's image holds serveclient without torch). A GPU
    server, or one across a network, gets crops. The recipe (torch beneath it, seconds to
    import) is imported only when crops would be made: a job for a local CPU server skips it."""
    if mode != "auto":
        return mode == "client"
    from serveclient.client import is_loopback

    custom: Any = (entry or {}).get("customizedMetadata")
    if not isinstance(custom, dict) or "preprocessing" not in custom:
        return False
    if not (str(custom.get("device", "cpu")).startswith("cuda") or not is_loopback(url)):
        return False
    try:
        import model_files.recipe  # noqa: F401 - the recipe, and torch beneath it
    except ImportError:
        return False
    return True
