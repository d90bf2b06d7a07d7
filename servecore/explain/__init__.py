"""Explanations (``/explanations``, KServe v1 ``:explain``): a typed stage of the request path.

    options.py   an explanation request's parameters -> ``ExplainSpec`` (400 otherwise)
    compute.py   Captum on the eager model: per image and target, a grid (and a PNG heatmap)
    document.py  the result's types (``Explanation``, ``Explained``) and its JSON document
    explanations.py  ``Explanations``, what the intake and the model call: check a request's
                 parameters, admit the batch's explanation work, compute the batch's results

This package imports nothing from the request path but the values it shares (``stages``,
``request``, ``errors``, ``boundary``, ``admission``, ``images``, ``crops``, ``classes``,
``config``). It is imported by ``stages`` (its types), ``intake`` and ``service`` (the stage
itself), and at the edges ``edges/bodies.py`` (an explanation's JSON document) and
``edges/tensor.py`` (that document as the ``explanations`` output); each says so.
"""
