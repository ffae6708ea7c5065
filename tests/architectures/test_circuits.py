"""Circuit discovery on every causal family: the graph reaches every receiver, so ablating
every edge to its corrupted output is the corrupted run and keeping every edge the clean
one; EAP-IG with one step is EAP; and the gradients are right: with every sender's
reference moved only a step ``eps`` from its clean output towards its corrupted one,
ablating every edge into one receiver changes the metric by ``eps`` times the sum of that
receiver's edge scores (a finite difference, to first order). A family whose attention
output is normalised before the residual add (Gemma 2 and 3) is taken in, each head's part
of the normed output a sender; one whose queries are normalised over every head together
(OLMo 2) is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.architectures.families import ENCODERS
from tests.architectures.test_matrix import ADAPTERS, SUPPORTED
from workbench.core import heap
from workbench.core.errors import ModelCapabilityError
from workbench.interventions.circuits import attribution, differences, flow
from workbench.interventions.circuits.ablate import circuit_metrics
from workbench.interventions.circuits.attribution import edge_scores
from workbench.interventions.circuits.graph import build_graph
from workbench.interventions.circuits.task import LogitDifference, Task
from workbench.models.norms import output_norm

CAUSAL = [f for f in SUPPORTED if f not in ENCODERS and f not in ("t5", "mamba")]


def _task(n_vocab: int) -> Task:
    gen = torch.Generator().manual_seed(0)
    n, width = 3, 7
    clean = torch.randint(6, n_vocab, (n, width), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2:4] = torch.randint(6, n_vocab, (n, 2), generator=gen)
    return Task(clean, corrupted, LogitDifference(
        torch.randint(6, n_vocab, (n,), generator=gen),
        torch.randint(6, n_vocab, (n,), generator=gen), torch.full((n,), width - 1)))


@pytest.mark.parametrize("family", CAUSAL)
def test_circuit_machinery_on_every_causal_family(families, family, monkeypatch):
    model = families.model(family)
    normed = any(output_norm(model, layer) is not None for layer in range(model.info.n_layers))
    assert ADAPTERS[family].attn_out_norm == normed  # the adapter's fact is the model's
    if ADAPTERS[family].qk_norm == "full_width":
        with pytest.raises(ModelCapabilityError, match="every head together"):
            build_graph(model)
        return
    graph = build_graph(model)
    task = _task(min(model.info.d_vocab, 300))
    got = circuit_metrics(model, graph, task, [graph.edges.clone(),
                                                torch.zeros_like(graph.edges)])
    with torch.no_grad():
        whole = task.metric(model.bridge(task.clean), slice(None)).double().numpy()
        # the passes unembed the metric's positions alone: the whole pass's logits there
        # (the family's soft cap or scale included) up to the matrix product's round-off
        clean = flow.metric_values(model, task.clean, task.metric, slice(None)
                                   ).double().numpy()
        corrupted = task.metric(model.bridge(task.corrupted), slice(None)).double().numpy()
    np.testing.assert_allclose(clean, whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[:, 0], clean)
    scale = float(np.abs(clean - corrupted).max())
    np.testing.assert_allclose(got[:, 1], corrupted, atol=1e-4 * max(scale, 1.0))
    eap = edge_scores(model, graph, task, method="eap")
    ig = edge_scores(model, graph, task, method="eap-ig", steps=1)
    torch.testing.assert_close(ig.values, eap.values, rtol=1e-4,
                               atol=1e-5 * float(eap.values.abs().max()))
    with monkeypatch.context() as patch:
        # each layer's gradients contracted as the backward pass reaches it, each MLP
        # recomputed three positions at a time
        patch.setattr(attribution, "GRADIENT_BYTES", 1)
        patch.setattr(flow, "MLP_POSITIONS", 3)
        layered = edge_scores(model, graph, task, method="eap")
    torch.testing.assert_close(layered.values, eap.values, rtol=1e-5,
                               atol=1e-6 * float(eap.values.abs().max()))
    with monkeypatch.context() as patch:
        # the differences written to files and read back one position at a time: the
        # same float32 numbers, summed in another order (the allocator is left as it is)
        mapped: list[int] = []
        patch.setattr(heap, "map_large", lambda nbytes=1 << 20: mapped.append(nbytes))
        patch.setattr(attribution, "CONTRACT_BYTES", 1)  # one position at a time
        # and every tensor saved outside a checkpointed block (the blocks' inputs) too
        written: list[int] = []
        real = differences._Saved.__init__
        patch.setattr(differences._Saved, "__init__",
                      lambda self, path, t: written.append(t.numel()) or real(self, path, t))
        patch.setattr(differences, "SPILL_BYTES", 1)
        spilled = edge_scores(model, graph, task, method="eap", low_memory="on")
        assert mapped == [1 << 20]
        assert len(written) >= model.info.n_layers
    torch.testing.assert_close(spilled.values, eap.values, rtol=1e-5,
                               atol=1e-6 * float(eap.values.abs().max()))
    with monkeypatch.context() as patch:
        # the ablated passes' references and differences in files, one a sender (each
        # head's normed output its own where the family norms the attention output): the
        # metrics of the stacked tensors in memory, summed in another order
        patch.setattr(heap, "map_large", lambda nbytes=1 << 20: True)
        half = graph.edges & (torch.rand(graph.edges.shape,
                                         generator=torch.Generator().manual_seed(1)) < 0.5)
        for ablation in ("corrupted", "mean"):
            keeps = [torch.zeros_like(graph.edges), half]
            memory = circuit_metrics(model, graph, task, keeps, ablation=ablation)
            files = circuit_metrics(model, graph, task, keeps, ablation=ablation,
                                    low_memory="on")
            np.testing.assert_allclose(files, memory, rtol=1e-5,
                                       atol=1e-5 * max(float(np.abs(memory).max()), 1.0))
    with monkeypatch.context() as patch:
        _first_order(model, graph, task, eap.values, patch)


@pytest.mark.parametrize("family", CAUSAL)
def test_the_metric_read_at_its_positions_is_the_whole_pass_metric(families, family):
    """Unembedding only the metric's positions after the final norm, through the family's
    output transform (Gemma's soft cap, a logit scale), gives the whole pass's metric."""
    model = families.model(family)
    task = _task(min(model.info.d_vocab, 300))
    with torch.no_grad():
        whole = task.metric(model.bridge(task.clean), slice(None))
        got = flow.metric_values(model, task.clean, task.metric, slice(None))
    torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)


EPS = 1e-2


def _first_order(model, graph, task, scores, patch) -> None:
    """Per receiver: (clean - the metric with every edge into it ablated to a reference
    ``eps`` of the way to the corrupted outputs) / eps, against the sum of its scores."""
    own = flow.sender_outputs

    def near(model, ids, weights=None):
        clean = own(model, task.clean, weights)
        return clean + EPS * (own(model, ids, weights) - clean)

    patch.setattr(flow, "sender_outputs", near)
    keeps = [graph.edges.clone()]
    for r in range(len(graph.receivers)):
        keep = graph.edges.clone()
        keep[:, r] = False
        keeps.append(keep)
    got = circuit_metrics(model, graph, task, keeps)
    exact = (got[:, :1] - got[:, 1:]).mean(0) / EPS
    approx = scores.sum(0).numpy()
    assert np.abs(approx).max() > 0
    np.testing.assert_allclose(exact, approx, rtol=0.05, atol=0.05 * np.abs(approx).max())
