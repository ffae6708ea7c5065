"""Circuits of heads and MLPs: the graph, edge scores by attribution (EAP, EAP-IG), exact
edge patching, and circuits' faithfulness as MIB scores it.

Examples:
    >>> graph = build_graph(model)                                        # doctest: +SKIP
    >>> scores = edge_scores(model, graph, task, method="eap-ig", steps=5) # doctest: +SKIP
    >>> curve = faithfulness_curve(model, graph, task, scores)            # doctest: +SKIP
"""
