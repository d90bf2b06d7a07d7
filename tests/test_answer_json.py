"""The JSON answers' text (``servecore.edges.bodies``): written with orjson, they parse to the same
float32 values, labels and probabilities as the standard ``json`` module's text of the same
answer (what the server wrote before), and an answer holding a non-finite value is written as
``json`` writes it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servecore.answers import AnswerSpec, Prediction, Tag
from servecore.classes import Classes
from servecore.config import Output
from servecore.edges.bodies import answer_json
from servecore.request import Protocol

SPEC = AnswerSpec("m", "1.0", Output.EMBEDDING, Classes.of(["a", "b"]), 5, True)


def _embeddings(rows: int, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal((rows, 2048)).astype(np.float32)
    return values / np.linalg.norm(values, axis=1, keepdims=True)


def _reference(prediction: Prediction) -> dict | list:
    """The answer as the json module wrote it before: every float through ``tolist``."""
    tags = [
        [{"label": t.label, "index": t.index, "probability": t.probability} for t in row]
        for row in prediction.tags or []
    ]
    if prediction.protocol is Protocol.V2:
        outputs = []
        if prediction.embeddings is not None:
            outputs.append({"data": prediction.embeddings.reshape(-1).tolist()})
        if prediction.tags is not None:
            outputs.append({"data": [json.dumps(t) for row in tags for t in row]})
        return outputs
    rows = tags if prediction.embeddings is None else prediction.embeddings.tolist()
    return rows


@pytest.mark.parametrize("protocol", list(Protocol))
def test_embeddings_read_back_as_the_same_float32_values(protocol):
    rows = 1 if protocol is Protocol.PLAIN else 3
    embeddings = _embeddings(rows)
    text = answer_json(Prediction(protocol, "id-1", embeddings, None), SPEC)
    document = json.loads(text)
    if protocol is Protocol.V2:
        (output,) = document["outputs"]
        assert output["shape"] == [rows, 2048] and output["datatype"] == "FP32"
        got = np.array(output["data"], dtype=np.float32).reshape(rows, 2048)
        assert document["id"] == "id-1"
    else:
        answers = document["predictions"] if protocol is Protocol.V1 else [document]
        got = np.array([a["embedding"] for a in answers], dtype=np.float32)
    np.testing.assert_array_equal(got, embeddings)  # bit for bit, not approximately
    old = json.dumps(_reference(Prediction(protocol, None, embeddings, None)))
    assert len(text) < len(old)  # the same values in a shorter text


def test_tags_read_back_as_the_same_labels_and_probabilities():
    probabilities = [0.1 + 1e-9, 1 / 3, 2.5e-08]
    tags = [
        [Tag("tabby", 281, probabilities[0]), Tag('ünïcode "q"', 1, probabilities[1])],
        [Tag("b", 0, probabilities[2]), Tag("a", 3, 0.0)],
    ]
    plain = json.loads(answer_json(Prediction(Protocol.V1, None, None, tags), SPEC))
    assert plain["predictions"][0][1] == {"label": 'ünïcode "q"', "index": 1, "probability": 1 / 3}
    assert [t["probability"] for row in plain["predictions"] for t in row] == [
        t.probability for row in tags for t in row
    ]
    v2 = json.loads(answer_json(Prediction(Protocol.V2, None, None, tags), SPEC))
    (output,) = v2["outputs"]
    assert output["shape"] == [2, 2] and output["datatype"] == "BYTES"
    assert [json.loads(t)["probability"] for t in output["data"]] == [
        t.probability for row in tags for t in row
    ]


def test_a_non_finite_value_is_written_as_the_json_module_writes_it():
    embeddings = _embeddings(1)
    embeddings[0, 7] = np.nan
    text = answer_json(Prediction(Protocol.PLAIN, None, embeddings, None), SPEC)
    assert text == json.dumps({"embedding": embeddings[0].tolist()}).encode()
    assert math.isnan(json.loads(text)["embedding"][7])  # not null, as before
    tags = [[Tag("a", 0, math.inf)]]
    text = answer_json(Prediction(Protocol.PLAIN, None, None, tags), SPEC)
    assert json.loads(text)[0]["probability"] == math.inf
