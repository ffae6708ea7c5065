"""The circuit graph, edge scores, edge ablation and faithfulness on the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.interventions.circuits.ablate import circuit_metrics, edge_patching
from workbench.interventions.circuits.attribution import edge_scores
from workbench.interventions.circuits.faithfulness import (
    MIB_FRACTIONS,
    area,
    circuit_size,
    faithfulness,
    faithfulness_curve,
    top_edges,
)
from workbench.interventions.circuits.flow import metric_values
from workbench.interventions.circuits.graph import build_graph
from workbench.interventions.circuits.task import (
    LogitDifference,
    ProbabilityDifference,
    TargetLogProb,
    Task,
    at_positions,
    check_fractions,
    check_lengths,
    check_steps,
)


@pytest.fixture(scope="module")
def task() -> Task:
    torch.manual_seed(0)
    n, width = 6, 8
    clean = torch.randint(6, 300, (n, width))
    corrupted = clean.clone()
    corrupted[:, 2:4] = torch.randint(6, 300, (n, 2))
    return Task(clean, corrupted, LogitDifference(torch.randint(6, 300, (n,)),
                                                  torch.randint(6, 300, (n,)),
                                                  torch.full((n,), width - 1)))


def test_graph_has_every_node_and_per_kv_head_key_and_value_receivers(llama):
    graph = build_graph(llama)
    info = llama.info  # 2 layers, 4 query heads, 2 key-value heads
    assert len(graph.senders) == 1 + info.n_layers * (info.n_heads + 1)
    names = [r.name for r in graph.receivers]
    assert names[:9] == ["L0H0.q", "L0H1.q", "L0H2.q", "L0H3.q", "L0KV0.k", "L0KV1.k",
                         "L0KV0.v", "L0KV1.v", "L0MLP.in"]
    assert names[-1] == "logits"
    # layer 0's q/k/v read the embedding only, its MLP the embedding and layer 0's heads;
    # layer 1's q/k/v read 6 senders, its MLP 10, the logits all 11
    assert graph.n_edges == 8 * 1 + 5 + 8 * 6 + 10 + 11
    assert all(r.layer_type == "global" for r in graph.receivers[:-1])
    assert graph.receivers[-1].layer_type is None
    for s, r in zip(*graph.edge_index(), strict=True):
        sender, receiver = graph.senders[int(s)], graph.receivers[int(r)]
        assert sender.layer < receiver.layer or (
            sender.kind == "head" and receiver.kind == "mlp" and sender.layer == receiver.layer)


def test_encoder_is_refused(bert):
    with pytest.raises(ModelCapabilityError, match="causal"):
        build_graph(bert)


@pytest.mark.parametrize("grid", [[], [0.0], [0.5, 1.5], [-0.1], [float("nan")]])
def test_a_size_grid_outside_zero_one_is_refused(grid):
    with pytest.raises(WorkbenchError, match="circuit size"):
        check_fractions(grid)


def test_refusals_are_one_line():
    for call, args in ((check_steps, (0,)), (check_lengths, ([5, 6], [5, 7])),
                       (check_fractions, ([2.0],))):
        with pytest.raises(WorkbenchError) as err:
            call(*args)
        assert "\n" not in str(err.value)
    with pytest.raises(WorkbenchError, match="prompt 0"):
        Task(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long),
             TargetLogProb(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)))


def test_eap_ig_with_one_step_at_the_clean_end_is_eap(llama, task):
    graph = build_graph(llama)
    eap = edge_scores(llama, graph, task, method="eap")
    ig = edge_scores(llama, graph, task, method="eap-ig", steps=1)
    assert eap.values.abs().max() > 0
    torch.testing.assert_close(ig.values, eap.values, rtol=1e-5,
                               atol=1e-6 * float(eap.values.abs().max()))
    with pytest.raises(WorkbenchError, match="m >= 1"):
        edge_scores(llama, graph, task, method="eap-ig", steps=0)


def test_eap_ig_scores_average_the_path(llama, task):
    graph = build_graph(llama)
    three = edge_scores(llama, graph, task, method="eap-ig", steps=3)
    assert three.steps == 3 and not torch.equal(three.values, edge_scores(
        llama, graph, task, method="eap").values)
    assert torch.all(three.values[~graph.edges] == 0)


@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_full_and_empty_circuits_are_the_clean_and_the_ablated_runs(llama, task, ablation):
    graph = build_graph(llama)
    keeps = [graph.edges.clone(), torch.zeros_like(graph.edges)]
    got = circuit_metrics(llama, graph, task, keeps, ablation=ablation)
    with torch.no_grad():
        # the clean run read as the circuit passes read it (unembedded at the metric's
        # positions alone: the same logits as the whole pass's up to the matrix product's
        # round-off, which depends on its shape), so keeping every edge changes no bit
        clean = metric_values(llama, task.clean, task.metric, slice(None)).double().numpy()
        corrupted = task.metric(llama.bridge(task.corrupted), slice(None)).double().numpy()
    np.testing.assert_array_equal(got[:, 0], clean)
    if ablation == "corrupted":  # every receiver reads its corrupted input
        np.testing.assert_allclose(got[:, 1], corrupted, rtol=1e-4, atol=1e-5)
    f = faithfulness(got, got[:, 0], got[:, 1])
    assert f[0] == 1.0 and f[1] == 0.0


def test_faithfulness_curve_ends_at_one_and_cpr_cmd_follow_mib(llama, task):
    graph = build_graph(llama)
    scores = edge_scores(llama, graph, task, method="eap-ig", steps=2)
    curve = faithfulness_curve(llama, graph, task, scores, n_boot=50)
    assert curve.fractions == MIB_FRACTIONS
    assert curve.sizes[-1] == graph.n_edges and curve.faithfulness[-1] == 1.0
    assert np.all(curve.low <= curve.faithfulness + 1e-12)
    assert np.all(curve.faithfulness <= curve.high + 1e-12)
    assert curve.cpr() == pytest.approx(area(MIB_FRACTIONS, curve.faithfulness))
    x, y = [0.1, 0.5, 1.0], np.array([0.2, 0.6, 1.0])
    assert area(x, y) == pytest.approx(0.4 * 0.4 + 0.5 * 0.8)
    with pytest.raises(WorkbenchError, match="circuit size"):
        faithfulness_curve(llama, graph, task, scores, fractions=[0.5, 1.2])


def test_circuit_sizes_and_top_edges():
    assert [circuit_size(f, 82) for f in (0.001, 0.1, 0.5, 1.0)] == [1, 9, 41, 82]


def test_top_edges_are_those_of_largest_absolute_score(llama, task):
    graph = build_graph(llama)
    scores = edge_scores(llama, graph, task, method="eap")
    keep = top_edges(scores, 5)
    assert int(keep.sum()) == 5 and bool((keep & ~graph.edges).sum() == 0)
    inside = scores.values[keep].abs().min()
    outside = scores.values[graph.edges & ~keep].abs().max()
    assert inside >= outside


def test_exact_edge_patching_tracks_eap(llama, task):
    graph = build_graph(llama)
    eap = edge_scores(llama, graph, task, method="eap").per_edge().numpy()
    top = np.argsort(-np.abs(eap))[:20]
    exact = edge_patching(llama, graph, task, top.tolist())
    # a random tiny model is close to linear in an edge: first order agrees in sign and size
    assert exact.shape == (20,) and np.corrcoef(exact, eap[top])[0, 1] > 0.7


def test_target_log_prob_is_the_negative_loss(llama):
    ids = torch.randint(6, 300, (2, 6))
    targets = torch.roll(ids, -1, 1)
    mask = torch.zeros(2, 6)
    mask[:, 2:5] = 1
    metric = TargetLogProb(targets, mask)
    with torch.no_grad():
        logits = llama.bridge(ids)
    logp = torch.log_softmax(logits, -1)
    want = torch.stack([logp[b, 2:5].gather(1, targets[b, 2:5, None]).mean() for b in range(2)])
    torch.testing.assert_close(metric(logits, slice(None)), want)


def _metrics(n: int, width: int, vocab: int) -> list[tuple[object, object]]:
    """Each metric class on random inputs, with a hand-written reference of it from the
    whole logits ``[n, width, vocab]``."""
    answer, other = torch.randint(0, vocab, (n,)), torch.randint(0, vocab, (n,))
    position = torch.randint(0, width, (n,))

    def difference(logits, rows):
        b = torch.arange(rows.start, rows.stop)
        at = logits[torch.arange(len(b)), position[b]]
        return at[torch.arange(len(b)), answer[b]] - at[torch.arange(len(b)), other[b]]

    candidates = torch.randperm(vocab)[:10]
    thresholds = torch.randint(0, 10, (n,))

    def probability(logits, rows):
        out = []
        for i, b in enumerate(range(rows.start, rows.stop)):
            p = torch.softmax(logits[i, position[b]].float(), -1)[candidates]
            out.append(p[thresholds[b] + 1:].sum() - p[: thresholds[b] + 1].sum())
        return torch.stack(out)

    targets = torch.randint(0, vocab, (n, width))
    mask = (torch.rand(n, width) < 0.4).float()  # rows read different positions
    mask[0] = 0  # and a row reads none

    def log_prob(logits, rows):
        logp = torch.log_softmax(logits.float(), -1)
        out = []
        for i, b in enumerate(range(rows.start, rows.stop)):
            read = mask[b].nonzero()[:, 0]
            got = logp[i, read].gather(1, targets[b, read, None])[:, 0]
            out.append(got.mean() if len(read) else logp.new_zeros(()))
        return torch.stack(out)

    return [(LogitDifference(answer, other, position), difference),
            (ProbabilityDifference(candidates, thresholds, position), probability),
            (TargetLogProb(targets, mask), log_prob)]


@pytest.mark.parametrize("kind", [0, 1, 2], ids=["logit-diff", "prob-diff", "log-prob"])
def test_each_metric_from_its_positions_alone_is_the_one_of_the_whole_logits(kind):
    torch.manual_seed(3)
    n, width, vocab = 6, 9, 50
    metric, reference = _metrics(n, width, vocab)[kind]
    for rows in (slice(0, n), slice(0, 1), slice(2, 5)):
        logits = torch.randn(rows.stop - rows.start, width, vocab)
        positions = metric.read_positions(rows)
        assert positions.shape[0] == rows.stop - rows.start
        want = reference(logits, rows)
        torch.testing.assert_close(metric(logits, rows), want)
        torch.testing.assert_close(metric.at(at_positions(logits, positions), rows), want)


@pytest.mark.parametrize("kind", [0, 1, 2], ids=["logit-diff", "prob-diff", "log-prob"])
def test_a_pass_unembedded_at_the_metric_positions_gives_the_whole_pass_metric(llama, kind):
    """:func:`flow.metric_values` (the pass stopped at the final norm, the unembedding at
    the read positions only) equals the metric of the bridge's own logits, and its
    gradient too."""
    torch.manual_seed(4)
    n, width = 4, 7
    metric, _ = _metrics(n, width, llama.info.d_vocab)[kind]
    ids = torch.randint(6, 300, (n, width))
    rows = slice(0, n)
    with torch.no_grad():
        want = metric(llama.bridge(ids), rows)
        got = metric_values(llama, ids, metric, rows)
    torch.testing.assert_close(got, want)

    def gradient(run):
        kept = []

        def leaf(x, hook):
            x = x.detach().requires_grad_(True)
            kept.append(x)
            return x

        with torch.enable_grad(), llama.bridge.hooks(fwd_hooks=[("ln_final.hook_in", leaf)]):
            total = run().sum()
        return torch.autograd.grad(total, kept[0])[0]

    torch.testing.assert_close(
        gradient(lambda: metric_values(llama, ids, metric, rows)),
        gradient(lambda: metric(llama.bridge(ids), rows)))


def test_spearman_by_hand():
    from workbench.scores.stats import spearman

    assert spearman(np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])) == pytest.approx(1)
    assert spearman(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1)
    # ties share their mean rank: ranks (1.5, 1.5, 3) against (1, 2, 3)
    r = np.corrcoef([1.5, 1.5, 3], [1, 2, 3])[0, 1]
    assert spearman(np.array([5.0, 5, 7]), np.array([1.0, 2, 3])) == pytest.approx(r)
    assert np.isnan(spearman(np.array([1.0]), np.array([2.0])))


def test_blocked_attention_gives_the_dense_scores_and_circuits(llama):
    """Blocked attention, its blocks of query rows recomputed in the backward pass, gives
    the dense path's gradients, edge scores and circuit metrics."""
    from workbench.models.blocked import blocked

    torch.manual_seed(1)
    n, width = 3, 40
    clean = torch.randint(6, 300, (n, width))
    corrupted = clean.clone()
    corrupted[:, 3:6] = torch.randint(6, 300, (n, 3))
    task = Task(clean, corrupted, LogitDifference(torch.randint(6, 300, (n,)),
                                                  torch.randint(6, 300, (n,)),
                                                  torch.tensor([39, 30, 21])))
    graph = build_graph(llama)
    dense = edge_scores(llama, graph, task, method="eap-ig", steps=2, attention="dense")
    with blocked(llama, block=8):  # five blocks of rows
        many = edge_scores(llama, graph, task, method="eap-ig", steps=2, attention="dense")
    auto = edge_scores(llama, graph, task, method="eap-ig", steps=2)
    scale = float(dense.values.abs().max())
    for got in (many, auto):
        torch.testing.assert_close(got.values, dense.values, rtol=1e-5, atol=1e-6 * scale)
    keeps = [top_edges(dense, 10), torch.zeros_like(graph.edges)]
    np.testing.assert_allclose(circuit_metrics(llama, graph, task, keeps),
                               circuit_metrics(llama, graph, task, keeps, attention="dense"),
                               rtol=1e-5, atol=1e-6)


def test_scores_contracted_a_few_positions_at_a_time_are_the_same(llama, task, monkeypatch):
    from workbench.interventions.circuits import attribution

    graph = build_graph(llama)
    whole = edge_scores(llama, graph, task, method="eap-ig", steps=2)
    monkeypatch.setattr(attribution, "CONTRACT_BYTES", 4 * 11 * 6 * 32 * 3)  # 3 positions
    sliced = edge_scores(llama, graph, task, method="eap-ig", steps=2)
    torch.testing.assert_close(sliced.values, whole.values, rtol=1e-5,
                               atol=1e-7 * float(whole.values.abs().max()))


def test_paired_chunks_hold_two_rows_at_least():
    ids = torch.zeros(5, 8, dtype=torch.long)
    zero = torch.zeros(5, dtype=torch.long)
    task = Task(ids, ids, LogitDifference(zero, zero, torch.full((5,), 7)))
    assert task.chunks(16) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    # a resample mask pairs rows of one pass: the last row alone joins the slice before it
    assert task.chunks(16, paired=True) == [slice(0, 2), slice(2, 5)]
    assert task.chunks(8, paired=True) == [slice(0, 2), slice(2, 5)]  # over the budget
    assert task.chunks(8) == [slice(i, i + 1) for i in range(5)]
    assert task.chunks(24, paired=True) == [slice(0, 3), slice(3, 5)]


def test_a_checkpointed_blocked_pass_keeps_no_layer_queries_keys_or_values(llama):
    """In the gradient pass, each block checkpointed (``recomputed_layers``) and its
    attention a checkpoint per block of rows, the forward pass keeps each block's input
    alone: the queries, keys and values are recomputed in the backward pass, not held for
    every layer from the forward pass on."""
    import gc

    from workbench.interventions.circuits import flow
    from workbench.recording import hooks

    info = llama.info
    width = 40
    ids = torch.randint(6, 300, (1, width))
    shapes = {(1, info.n_heads, width, info.d_head), (1, info.n_kv_heads, width, info.d_head)}

    def start(x, hook):
        return x.detach().requires_grad_(True)

    def held() -> int:
        gc.collect()
        return sum(1 for t in gc.get_objects()
                   if isinstance(t, torch.Tensor) and tuple(t.shape) in shapes)

    before = held()
    with flow.attention_run(llama, "blocked") as path, torch.enable_grad(), \
            llama.bridge.hooks(fwd_hooks=[(hooks.resid(0, info.n_layers), start)]), \
            flow.recomputed_layers(llama):
        assert path == "blocked"
        out = llama.bridge(ids, use_cache=False)
        during = held()
        out.sum().backward()
    assert out.requires_grad
    assert during == before


def test_low_memory_auto_writes_the_differences_to_files_from_their_size(llama, task,
                                                                         monkeypatch):
    from workbench.core import heap
    from workbench.interventions.circuits import attribution

    graph = build_graph(llama)
    diff, _ = attribution.sender_differences(llama, task.clean, task.corrupted)
    size = attribution.difference_bytes(llama, task.clean.numel())
    assert diff.nbytes() == size  # one pass over the task: a single chunk
    folders: list = []
    real = attribution.Differences
    monkeypatch.setattr(attribution, "Differences",
                        lambda folder=None: folders.append(folder) or real(folder))
    monkeypatch.setattr(heap, "map_large", lambda nbytes=1 << 20: True)
    runs = {}
    for limit in (size + 1, size):
        monkeypatch.setattr(attribution, "LOW_MEMORY_BYTES", limit)
        runs[limit] = edge_scores(llama, graph, task, method="eap")
    assert folders[0] is None and folders[1] is not None
    assert not folders[1].exists()  # the temporary folder is gone
    torch.testing.assert_close(runs[size].values, runs[size + 1].values, rtol=1e-6,
                               atol=1e-7 * float(runs[size + 1].values.abs().max()))
    with pytest.raises(WorkbenchError, match="low_memory must be auto, on or off, got 'yes'"):
        edge_scores(llama, graph, task, method="eap", low_memory="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("ablation", ["corrupted", "mean"])
def test_ablated_passes_with_references_in_files_give_the_same_metrics(llama, task, ablation,
                                                                       monkeypatch):
    """With ``low_memory`` the references and the differences are files, one a sender,
    and a receiver's change is summed one sender at a time: the same metrics as the
    stacked tensors in memory, up to the order of the sum (and the mean's division)."""
    from workbench.core import heap
    from workbench.interventions.circuits import ablate

    graph = build_graph(llama)
    torch.manual_seed(1)
    half = graph.edges & (torch.rand(graph.edges.shape) < 0.5)
    keeps = [graph.edges.clone(), torch.zeros_like(graph.edges), half]
    memory = circuit_metrics(llama, graph, task, keeps, ablation=ablation, max_batch_tokens=16,
                             low_memory="off")
    written: list[tuple[str, int]] = []
    real = ablate.Outputs.write
    monkeypatch.setattr(ablate.Outputs, "write", lambda self, i, t: written.append(
        (self.prefix, i)) or real(self, i, t))
    monkeypatch.setattr(heap, "map_large", lambda nbytes=1 << 20: True)
    files = circuit_metrics(llama, graph, task, keeps, ablation=ablation, max_batch_tokens=16,
                            low_memory="on")
    senders = len(graph.senders)
    chunks = len(task.chunks(16, llama.paired_batches))
    assert chunks > 1
    prefixes = {prefix for prefix, _ in written}
    assert prefixes == {"difference", "mean" if ablation == "mean" else "reference"}
    # every sender's difference in every pass (three circuits a chunk)
    assert sum(p == "difference" for p, _ in written) == 3 * chunks * senders
    assert {i for _, i in written} == set(range(senders))
    np.testing.assert_array_equal(files[:, 0], memory[:, 0])  # every edge kept: untouched
    np.testing.assert_allclose(files, memory, rtol=1e-5, atol=1e-5)
    assert not np.allclose(memory[:, 2], memory[:, 0])  # the half circuit changes the metric
    with pytest.raises(WorkbenchError, match="low_memory must be auto, on or off, got 'yes'"):
        circuit_metrics(llama, graph, task, keeps, low_memory="yes")  # type: ignore[arg-type]
