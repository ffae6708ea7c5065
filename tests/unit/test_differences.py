"""The senders' differences kept in memory and in files: the same numbers either way."""

from __future__ import annotations

import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.interventions.circuits import differences
from workbench.interventions.circuits.differences import Differences, Outputs, spilled


def _filled(folder) -> tuple[Differences, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    clean = {"embed": torch.randn(2, 7, 5), "z": torch.randn(2, 7, 3, 4)}
    corrupted = {name: torch.randn_like(t) for name, t in clean.items()}
    diff = Differences(folder)
    for name, t in clean.items():
        diff.put(name, t)
    for name, t in corrupted.items():
        diff.subtract(name, t)
    return diff, {name: clean[name] - corrupted[name] for name in clean}


@pytest.mark.parametrize("where", ["memory", "folder"])
def test_differences_read_whole_and_by_positions(tmp_path, where):
    diff, expected = _filled(tmp_path if where == "folder" else None)
    assert diff.names == ["embed", "z"]
    assert diff.shape("z") == (2, 7, 3, 4)
    assert diff.nbytes() == 4 * (2 * 7 * 5 + 2 * 7 * 12)
    for name, t in expected.items():
        torch.testing.assert_close(diff.whole(name), t, rtol=0, atol=0)
    for at in (slice(0, 3), slice(3, 7), slice(6, 7), slice(5, 5)):
        got = diff.positions(at, ["z", "embed"])
        assert list(got) == ["z", "embed"]
        for name, t in got.items():
            torch.testing.assert_close(t, expected[name][:, at], rtol=0, atol=0)
    if where == "folder":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["0.f32", "1.f32"]


def test_the_clean_tensor_is_copied_not_changed(tmp_path):
    for folder in (None, tmp_path):
        t = torch.ones(1, 2, 3)
        diff = Differences(folder)
        diff.put("a", t)
        diff.subtract("a", torch.ones(1, 2, 3))
        assert torch.equal(t, torch.ones(1, 2, 3))
        assert torch.equal(diff.whole("a"), torch.zeros(1, 2, 3))


def test_bad_uses_are_one_line_errors(tmp_path):
    diff = Differences(tmp_path)
    diff.put("a", torch.zeros(1, 4, 2))
    with pytest.raises(WorkbenchError, match="already kept"):
        diff.put("a", torch.zeros(1, 4, 2))
    with pytest.raises(WorkbenchError, match=r"no difference is kept for b; kept: a"):
        diff.whole("b")
    with pytest.raises(WorkbenchError, match=r"shape \(1, 3, 2\) cannot be taken"):
        diff.subtract("a", torch.zeros(1, 3, 2))
    with pytest.raises(WorkbenchError, match="steps of 1"):
        diff.positions(slice(0, 4, 2), ["a"])
    (tmp_path / "0.f32").write_bytes(b"\0" * 12)  # cut short
    with pytest.raises(WorkbenchError, match="shorter than a's difference"):
        diff.positions(slice(0, 4), ["a"])


def test_outputs_in_files_read_back_what_was_written_and_added(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    out = Outputs(tmp_path, "ref", (2, 5, 3))
    assert torch.equal(out.read(4), torch.zeros(2, 5, 3))  # never written: zeros
    out.write(0, a)
    out.add(1, a)
    out.add(1, b)
    kept = out.read(0).clone()
    assert torch.equal(kept, a)
    assert torch.equal(out.read(1), a + b)
    assert out.read(0) is out.read(1)  # one buffer, overwritten by the next read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref-0.f32", "ref-1.f32"]
    assert out.path(1).stat().st_size == 4 * a.numel()


def test_outputs_refuse_a_wrong_shape_and_a_file_of_another_size(tmp_path):
    out = Outputs(tmp_path, "ref", (1, 4, 2))
    with pytest.raises(WorkbenchError, match=r"sender 3: a tensor of shape \(1, 3, 2\) in a "
                                             r"store of \(1, 4, 2\)"):
        out.write(3, torch.zeros(1, 3, 2))
    for size in (12, 36):  # cut short, and too long
        out.path(0).write_bytes(b"\0" * size)
        with pytest.raises(WorkbenchError, match=r"ref-0.f32: not one tensor of shape"):
            out.read(0)


def test_spilled_tensors_go_through_files_and_give_the_same_gradient(tmp_path, monkeypatch):
    """What autograd saves outside a checkpoint is written to the folder while the graph
    holds it and read back for the backward pass: the same gradient as in memory, every
    file gone once the graph is; a parameter is never written, nor anything without a
    folder."""
    from torch.utils.checkpoint import checkpoint

    monkeypatch.setattr(differences, "SPILL_BYTES", 1)
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 5)

    def loss(x):
        y = checkpoint(lambda h: net(h).tanh(), x.sin(), use_reentrant=False)
        return (y * x).pow(2).sum()

    x = torch.randn(3, 5, requires_grad=True)
    want = torch.autograd.grad(loss(x), x)[0]
    written: list = []
    real = differences._Saved.__init__
    monkeypatch.setattr(differences._Saved, "__init__",
                        lambda self, path, tensor: written.append(tensor) or real(self, path,
                                                                                 tensor))
    with spilled(tmp_path, net):
        total = loss(x)
    assert written and {p.name for p in tmp_path.iterdir()} == {
        f"saved-{i}.pt" for i in range(len(written))}
    assert not any(t.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                   for t in written for p in net.parameters())
    got = torch.autograd.grad(total, x)[0]
    del total
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert list(tmp_path.iterdir()) == []
    written.clear()
    with spilled(None, net):
        torch.autograd.grad(loss(x), x)
    assert written == []
