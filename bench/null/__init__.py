"""Models that do no work, for measuring the serving engines' own ceilings
(``bench.ceiling``): each takes the requests our models take and answers a fixed embedding of
the right shape.

``fixed`` (the answer), ``core`` (our core with decode and forward made no-ops), and the four
models: ``ts_bare`` / ``ts_core`` (TorchServe handlers), ``triton_bare`` / ``triton_core``
(Triton Python-backend ``model.py`` files). ``package`` archives them at run time.
"""
