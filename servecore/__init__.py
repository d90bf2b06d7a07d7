"""The engine-neutral core: one request's path from the bytes an engine received to the answer
it sends back, and nothing that knows which engine that is (no module here imports TorchServe's
``ts`` or Triton's backend utilities; tests/test_layout.py checks).

    service.py     ImageModel: load, prepare -> infer -> answer (one Reply per request: values);
                   run, the one call an engine makes per batch, with its edge's encode
    request.py     the core's request values: ParsedRequest (what one request asks for, from
                   any wire format), the Payload an edge hands over (``parse(config)``)
    stages.py      per-request values, each made once: Incoming, Opened (Explaining, Looked),
                   Placed, Failed; boundary.py: the one per-request failure boundary
    intake.py      open, admit and decode a batch's requests
    preprocessor.py  one image's bytes -> the model's input (images.py opens and decodes,
                   jpegheader.py reads a plain JPEG's header without PIL; crops.py: the
                   ``crops`` input, [n, 224, 224, 3] uint8): what the transformer, the client
                   and the benchmarks import
    admission.py   the batch budgets, fair across batches
    cache.py       the content cache, a step between admission and decode; cacheentry.py: its
                   key and entry types
    answers.py     a prediction as values: embedding rows (float32 arrays), tag lists
    classes.py     a tagger's labels and heads: a softmax and a top k per head
    errors.py      the error kinds, as values (a kind to retry says after how long)
    backends.py    runtimes as Backend (eager, TorchScript, ONNX Runtime, OpenVINO);
                   runtime.py: the Backend type
    precision.py   the ``auto`` precision rule; autoprecision.py measures and remembers
    metrics.py     what the model records, through an engine's MetricsSink
    tracing.py     OpenTelemetry traces, off unless the environment says: the switch, a
                   request's W3C context; otel.py (imported only when on): the spans, the
                   sampler, the bounded export
    config.py      HandlerConfig, the typed ``handler:`` settings
    explain/       explanations, a typed stage: ExplainSpec in, Explained out (imported by
                   intake, service and the edges' bodies: its map says); explainvalues.py:
                   those values, below stages, which carry them
    gpudecode.py   JPEGs decoded and cropped on the worker's GPU, batched (torchvision's
                   nvJPEG); nvimgdecode.py: nvImageCodec's (hardware JPEG engines, region
                   decoding); gpuchoice.py: which of them a worker takes, chosen at start
    overlap.py     a GPU worker's batch in parts: each part's forward queued before the next
                   part is decoded, the answers copied back once
    priority.py    a request's priority class and deadline; lanes.py: the bulk lane's CPU policy
    restarts.py    how often a worker was started again in its slot
    host.py        what CPU this is, and how many cores this process may use

    edges/         what only the adapters import (handlers/, tritonrepo/, transformer/): the
                   HTTP edge (http.py) and the tensor edge (tensor.py), each a request in as
                   the core's Incoming and a Reply out as the engine sends it; bodies.py: the
                   JSON bodies and each error kind's HTTP status; jsonguard.py
"""
