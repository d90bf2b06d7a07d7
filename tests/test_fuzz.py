"""Property-based fuzzing of the pure layers (issue #8): whatever a client sends, parsing and
decoding end in a valid result or a ``RequestError`` (a 4xx for that request), never another
exception, and in bounded time.

The default run is short (the ``ci`` profile, seconds); a longer one:

    HYPOTHESIS_PROFILE=fuzz .venv/bin/pytest tests/test_fuzz.py
"""

from __future__ import annotations

import base64
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning

from handlers import routing
from servecore.config import HandlerConfig
from servecore.edges import http as httpedge
from servecore.edges import jsonguard
from servecore.edges.bodies import status_of
from servecore.errors import RequestError
from servecore.preprocessor import Preprocessor
from tests import corpus

# deadline: a bound on one example's time that catches a hang, not slowness. An example may
# decode up to 40 MP (about 1 s per thread here, several times that on a loaded machine), and
# Hypothesis fails as "flaky" an example over the deadline once and under it when replayed.
DEADLINE_MS = 30_000
settings.register_profile(
    "ci", max_examples=150, deadline=DEADLINE_MS, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=20_000, deadline=DEADLINE_MS, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# Examples carry base64 images: their reprs are large, which Hypothesis warns about.
pytestmark = pytest.mark.filterwarnings(f"ignore::{HypothesisWarning.__module__}.HypothesisWarning")

CONFIG = HandlerConfig()
PREPROCESS = Preprocessor(HandlerConfig())
SEEDS = [case.data for case in corpus.good_images().values()]
B64 = base64.b64encode(SEEDS[0]).decode()

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
# Documents shaped like ours, with any field replaced by anything.
field_values = json_values | st.just(B64) | st.just([B64]) | st.just([{"data": B64}])
plain_docs = st.fixed_dictionaries(
    {"data": field_values}, optional={"topk": field_values, "extra": field_values}
)
v1_docs = st.fixed_dictionaries(
    {
        "instances": field_values
        | st.lists(
            field_values
            | st.fixed_dictionaries({"data": field_values})
            | st.fixed_dictionaries({"image": st.fixed_dictionaries({"b64": field_values})}),
            max_size=4,
        )
    },
    optional={"parameters": field_values | st.fixed_dictionaries({"topk": field_values})},
)
v2_tensor = st.fixed_dictionaries(
    {
        "name": field_values,
        "shape": field_values | st.lists(st.integers(-2, 5), max_size=3),
        "datatype": st.sampled_from(["BYTES", "FP32"]) | field_values,
        "data": field_values | st.lists(field_values, max_size=4),
    },
    optional={"parameters": field_values | st.fixed_dictionaries({"topk": field_values})},
)
v2_docs = st.fixed_dictionaries(
    {"inputs": field_values | st.lists(v2_tensor, max_size=2)},
    optional={
        "id": field_values,
        "outputs": field_values
        | st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["embedding", "tags", "logits"]) | field_values},
                optional={"parameters": field_values},
            ),
            max_size=3,
        ),
        "parameters": field_values,
    },
)
documents = plain_docs | v1_docs | v2_docs | json_values
# A document reaches the handler parsed (application/json), as text bytes, or truncated bytes.
as_sent = st.one_of(
    documents,
    documents.map(lambda d: json.dumps(d).encode()),
    st.tuples(documents, st.integers(0, 200)).map(lambda t: json.dumps(t[0]).encode()[: t[1]]),
    st.binary(max_size=300),
    st.text(max_size=100),
)
form_values = st.binary(max_size=20) | st.text(max_size=20)
rows = st.one_of(
    st.fixed_dictionaries({"body": as_sent}),
    st.fixed_dictionaries({"data": as_sent}, optional={"topk": form_values}),
    st.dictionaries(st.sampled_from(["body", "data", "topk", "size", ""]), as_sent, max_size=3),
)
headers = st.none() | st.text(max_size=12)


@given(row=rows, header_top_k=headers)
def test_a_torchserve_row_parses_or_is_refused(row, header_top_k):
    try:
        parsed = httpedge.parse_http(routing.http_request(row, header_top_k), config=CONFIG)
    except RequestError as error:
        assert 400 <= int(status_of(error)) < 500 and error.message
        return
    # An empty raw body parses to one empty image: the decoder refuses it (tested elsewhere).
    assert parsed.images and all(isinstance(i, bytes) for i in parsed.images)
    assert len(parsed.images) <= CONFIG.max_images_per_request
    assert parsed.top_k is None or parsed.top_k >= 1


@given(doc=json_values)
def test_json_depth_agrees_with_the_parsed_document(doc):
    text = json.dumps(doc).encode()
    assert jsonguard.json_depth(text) == jsonguard.parsed_depth(doc, stop=10_000)


@given(depth=st.integers(17, 3000), wrapper=st.sampled_from(["[", '{"a":']))
def test_deep_json_is_refused_before_parsing(depth, wrapper):
    closing = "]" if wrapper == "[" else "}"
    text = ('{"data": ' + wrapper * depth + "1" + closing * depth + "}").encode()
    with pytest.raises(RequestError) as caught:
        httpedge.parse_http(httpedge.HttpRequest(text), config=CONFIG)
    assert "handler.max_json_depth" in caught.value.message


@st.composite
def mutated_images(draw):
    """A real image of an accepted format with bytes overwritten, inserted, removed or cut."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["set", "insert", "delete", "cut"]))
        if action == "set":
            data[position] = draw(st.integers(0, 255))
        elif action == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and len(data) > 1:
            del data[position]
        elif action == "cut" and position > 0:
            del data[position:]
    return bytes(data)


@given(data=mutated_images())
def test_mutated_image_decodes_or_is_refused(data):
    try:
        tensor = PREPROCESS(data)
    except RequestError as error:
        assert int(status_of(error)) in (400, 413, 415) and error.message
        return
    assert tuple(tensor.shape) == (3, 224, 224)
