"""KServe tooling beside the manifests of kserve/: the storage bundle, the offline lint, the
manifests rendered by ``kubectl kustomize``, and the simulated pod the tests start.

    bundle.py      the storage bundle the runtimes read from ``storageUri``
    render.py      the manifests' objects, as ``kubectl apply -k`` sends them
    lint/          the offline lint of the manifests, one module per kind of object (job.py:
                   the collection job; milvus.py: Milvus and its index Job; monitoring.py: the
                   Prometheus Operator objects, and the PrometheusRule it generates)
    engine.py      podman or docker, and the flags every call needs
    image.py       the runtime image (``make kserve-image``)
    modelcar.py    the bundle as an OCI image, for ``storageUri: oci://`` (``make kserve-modelcar``)
    container.py   the runtime image run as a pod runs it
    pod.py         TorchServe started as our ClusterServingRuntime starts it
"""
