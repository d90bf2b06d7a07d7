"""Triton's engine alone: a Python-backend model that answers every request with ``fixed``'s
embedding, one row per image of its ``images`` input, and a ``precision`` per image (what
our clients ask for beside the embedding), decoding nothing; only the outputs the request names
(Triton passes on no others), as our adapter answers."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from bench.null import fixed


class TritonPythonModel:
    """Fixed answers of the right shape."""

    def initialize(self, args: dict) -> None:
        self.row = fixed.embedding()
        self.answers: dict[int, list] = {}

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            images = len(pb_utils.get_input_tensor_by_name(request, "images").as_numpy())
            if images not in self.answers:
                self.answers[images] = [
                    np.tile(self.row, (images, 1)),
                    np.full((images, 1), fixed.PRECISION, dtype=np.object_),
                ]
            wanted = set(request.requested_output_names()) or {"embedding", "precision"}
            outputs = zip(("embedding", "precision"), self.answers[images])
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(n, a) for n, a in outputs if n in wanted]
                )
            )
        return responses
