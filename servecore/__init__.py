"""The engine-neutral core: one request's path from the bytes an engine received to the answer
it sends back, and nothing that knows which engine that is (no module here imports TorchServe's
``ts`` or Triton's backend utilities; tests/test_layout.py checks).

    service.py     ImageModel: load, prepare -> infer -> answer (one Reply per request: values)
    stages.py      per-request values, each made once: Incoming, Opened (Explaining, Looked),
                   Placed, Failed; boundary.py: the one per-request failure boundary
    cache.py       the content cache, a step between admission and decode; cacheentry.py: its
                   key and entry types
    parse.py       wire formats (plain body, KServe v1, v2) -> ParsedRequest; jsonguard.py
    intake.py      open, admit and decode a batch's requests
    preprocessor.py  one image's bytes -> the model's input (images.py opens and decodes,
                   jpegheader.py reads a plain JPEG's header without PIL): what the
                   transformer, the client and the benchmarks import
    admission.py   the batch budgets, fair across batches
    answers.py     a prediction as values: embedding rows (float32 arrays), tag lists
    classes.py     a tagger's labels and heads: a softmax and a top k per head
    jsonanswers.py the JSON protocols' bodies, for an edge that answers in JSON (TorchServe)
    errors.py      the error kinds, as values (a kind to retry says after how long)
    backends.py    runtimes as Backend (eager, TorchScript, ONNX Runtime, OpenVINO);
                   runtime.py: the Backend type
    precision.py   the ``auto`` precision rule; autoprecision.py measures and remembers
    metrics.py     what the model records, through an engine's MetricsSink
    tracing.py     OpenTelemetry traces, off unless the environment says: the switch, a
                   request's W3C context; otel.py (imported only when on): the spans, the
                   sampler, the bounded export
    config.py      HandlerConfig, the typed ``handler:`` settings
    explain/       explanations, a typed stage: ExplainSpec in, Explained out (the modules
                   that import it say so: stages, intake, service, encode)

The edges and the rest:

    httpedge.py    the HTTP edge: a Reply as the status, headers and body an HTTP engine sends;
                   httperrors.py: each error kind's HTTP status, headers and body
    tensorinput.py the tensor edge's way in: a TensorRequest (Triton's input arrays and
                   parameters, read before the core runs) and its parsing
    tensoroutput.py the tensor edge's way out: named output arrays, Triton's error codes
    tensoredge.py  the tensor edge as one object (decode, encode), as httpedge.py's HttpEdge
    crops.py       the ``crops`` input ([n, 224, 224, 3] uint8)
    gpudecode.py   JPEGs decoded and cropped on the worker's GPU, batched (torchvision's
                   nvJPEG); nvimgdecode.py: nvImageCodec's (hardware JPEG engines, region
                   decoding); gpuchoice.py: which of them a worker takes, chosen at start
    overlap.py     a GPU worker's batch in parts: each part's forward queued before the next
                   part is decoded, the answers copied back once
    priority.py    a request's priority class and deadline; lanes.py: the bulk lane's CPU policy
    restarts.py    how often a worker was started again in its slot
    host.py        what CPU this is, and how many cores this process may use
"""
