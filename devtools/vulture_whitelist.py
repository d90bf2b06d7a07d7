"""Names the dead-code check (vulture, ``make lint``) cannot see used: each is read by a
framework or library, not by our code. One line each, with who reads it."""

# ruff: noqa: B018 - a vulture whitelist is made of bare attribute accesses
from __future__ import annotations

_ = object()

# TorchServe: BaseHandler's contract.
_.initialized  # TorchServe's BaseHandler reads it after initialize()
_.handle  # TorchServe's entry point, called with each batch (handlers/resnet_handler.py)

# Triton's Python backend loads the class by name and calls its methods.
_.TritonPythonModel  # the class Triton instantiates from model.py
_.execute  # Triton calls it with each batch's requests
_.UNAVAILABLE  # pb_utils.TritonError's code, read by name (triton_code; tritonrepo/model.py)

# Attributes set on library objects, read by the library.
_.graph_optimization_level  # onnxruntime.SessionOptions
_.intra_op_num_threads  # onnxruntime.SessionOptions
_.inter_op_num_threads  # onnxruntime.SessionOptions
_.__traceback__  # Python's exception traceback (errors.detached clears it)
_.uname  # tarfile.TarInfo, written into the bundle's tarball
_.gname  # tarfile.TarInfo
_.gid  # tarfile.TarInfo
_.verify  # requests.Session: the CA bundle
_.trust_env  # requests.Session: proxies from the environment or not
_.exit_on_error  # argparse.ArgumentParser: errors raised, not exited (the lint's launcher check)
_._content  # requests.Response's body, set by tests that build responses
_.benchmark  # torch.backends.cudnn: the autotuner switch a GPU backend turns on

# Dataclass fields read by asdict.
_.p95_ms  # bench.stats.RunStats, reported through to_dict()

# pytest and http.server read these by name.
_.pytestmark  # pytest's module-level marks
_.do_GET  # http.server.BaseHTTPRequestHandler's GET hook (tests)
_.do_POST  # ... and its POST hook (tests/test_bench_gpu_served.py)
_.daemon_threads  # socketserver.ThreadingMixIn: handler threads die with the test (tests)
_.log_message  # http.server.BaseHTTPRequestHandler's log hook (tests)
_.intercept_service  # grpc.ServerInterceptor's hook (devtools/milvus.py: Milvus's token check)
_.nprobe  # FAISS reads an IVF index's nprobe when it searches (serveclient/search/faissindex.py)

# The import system calls these (tsclient/__init__.py: the old package name's alias finder).
_.find_spec  # importlib.abc.MetaPathFinder
_.create_module  # importlib.abc.Loader
_.exec_module  # importlib.abc.Loader

# The OpenTelemetry SDK calls these (servecore/otel.py: BoundedProcessor, a SpanProcessor).
_.on_start  # SpanProcessor: a span started
_.on_end  # SpanProcessor: a span ended
_.force_flush  # SpanProcessor: flush asked (never blocks here)
_.timeout_millis  # SpanProcessor.force_flush's parameter, by the SDK's name
