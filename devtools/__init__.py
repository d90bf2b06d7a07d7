"""Development tools: a local TorchServe launcher for tests and the benchmark, sample images,
the Java and kubectl checks. Nothing here is imported by the handler, nor imports kserve_tools.

    server.py        a real TorchServe on free loopback ports, in its own folder
    transformer.py   the preprocessing server as a local process
    otlp.py          a small OTLP/HTTP trace receiver (the tracing tests, make bench-ceiling)
    milvus.py        a Milvus Lite server process (the Milvus tests, make bench-search)
    prometheus.py    a real Prometheus with config/monitoring's rules
    samples.py       sample photos for the README, the tests and the benchmark
    scenes.py        a labelled set of synthetic scenes (tsctl head train's test, the docs)
    pages_demo.py    the result pages made from an album with every case they must handle
    barehost.py      a bare GPU host played here (a Python seeing only torch, a copy of the
                     tree): make bench-gpu-served-rehearsal
    vulture_whitelist.py  names the dead-code check cannot see used
"""
