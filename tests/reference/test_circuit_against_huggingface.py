"""EAP edge scores on smollm2 against the plain Hugging Face gradient x difference of
``tests/unit/test_circuit_reference.py`` (transformers modules and torch hooks only: a
zero offset per receiver, one backward pass), on IOI prompts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from experiments.circuit.measure import ioi_task
from tests.unit.test_circuit_reference import reference_receiver_grads, reference_senders
from workbench.interventions.circuits.attribution import edge_scores
from workbench.interventions.circuits.graph import build_graph
from workbench.models.cache import hf_dir
from workbench.models.load import load_model

pytestmark = pytest.mark.integration


def test_smollm2_eap_scores_equal_plain_huggingface():
    model = load_model("smollm2")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir("smollm2"), attn_implementation="eager",
                                              torch_dtype=torch.float32).eval()
    task = ioi_task(model, 4, 2, 0)
    graph = build_graph(model)
    got = edge_scores(model, graph, task, method="eap").values
    metric = task.metric
    n = task.n_prompts
    delta = reference_senders(hf, task.clean) - reference_senders(hf, task.corrupted)
    grads = reference_receiver_grads(hf, task.clean, lambda logits: metric(logits, slice(None)))
    want = torch.einsum("sbtd,rbtd->sr", delta.double(), grads.double()).detach() / n
    want[~graph.edges] = 0
    scale = float(want.abs().max())
    assert scale > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * scale)
