"""The benchmark that ships with the repo.

    python -m bench          raw model speed, our served tagger and TorchServe's stock
                             image_classifier on the same weights; results/benchmark.{md,json,png}
    python -m bench.sweep    batchSize x maxBatchDelay x workers for the tagger; results/sweep.md
    python -m bench.ceiling  TorchServe's and Triton's own ceilings with null models (``null``);
                             results/ceiling.md
    python -m bench.gpu      the core against a GPU's ceilings; results/gpu.md (on a GPU)
    python -m bench.gpuserved  both engines serving a GPU beside the core; results/gpu-served.md
                             (bench/gpuserved.sh on a bare GPU host, from buildsteps/stage.py)
    python -m bench.gpucheck the GPU path's open questions asked of the device, in seconds;
                             results/gpu-check.md (on a GPU; a CPU rehearses it)

The other tools, each ``python -m bench.<name>`` (bench/README.md says what each measures):
``crops``, ``preprocess``, ``soak``, ``traffic``, ``ingestion``, ``contention``,
``availability``, ``collection``, ``explain_cost``, ``triton``, ``corecost``, ``workerstart``,
``heads``, ``beforeafter``, ``search`` (``searchphotos``: its generated photos, embedded),
``coldstart`` (a KServe pod's start: storage initializer or modelcar);
``gpucore`` (the GPU loop ``gpu`` times) and ``gpureport`` (its report).

Modules every tool shares: ``loadgen`` (the one HTTP loop: every request the tools send, and
their bodies), ``markdown`` (every report's Markdown and JSON), ``layout`` (paths, the tools'
CLI with its one ``--attach``, the server a tool measures), ``stats`` (percentiles, run
summaries), ``memory`` (a server's RSS and CPU), ``batchlog`` (batch sizes from TorchServe's
log), ``raw`` (forward timing without serving), ``stock`` (the stock archive, its config and
server), ``archives`` (reading .mar files, sweep variants), ``serving`` (the load matrix
against one server), ``targets`` (the issue's ratios), ``report`` (``python -m bench``'s
report: Markdown, JSON, PNG), ``machine`` (machine and versions).
"""
