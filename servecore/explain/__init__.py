"""Explanations (``/explanations``, KServe v1 ``:explain``): a typed stage of the request path.

    options.py   ``ExplainRules``: what a request may ask of this model, its parameters ->
                 ``ExplainSpec`` (4xx otherwise) and its passes' cost (the intake's)
    compute.py   Captum on the eager model: per image and target, a grid (and a PNG heatmap)
    document.py  the result (``Explained``) as its JSON document
    explanations.py  ``Explanations``, the stage: entered once per batch by ``ImageModel.run``
                 after the forward, it computes the admitted explanations

The values it makes (``ExplainSpec``, ``Explanation``, ``Explained``) are not here but in
``servecore/explainvalues.py``, below ``stages``, which carries them: so this package stands
above the stages it reads. It imports nothing from the request path but the values it shares
(``explainvalues``, ``stages``, ``request``, ``errors``, ``boundary``, ``admission``,
``images``, ``crops``, ``classes``, ``config``). It is imported by ``intake`` (``options``:
the rules), ``service`` (the stage itself) and at the edge by ``edges/bodies.py`` (an
explanation's JSON document); each says so.
"""
