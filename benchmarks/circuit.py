"""Circuit discovery: EAP-IG time on IOI, and peak memory of edge scores against T.

Each measurement runs in its own subprocess, so that its peak RSS is its own:

- ``ioi``: EAP-IG (``--steps``, default 5) over every edge of ``--model`` on ``--prompts``
  IOI prompts (default 64; the issue's target on smollm2: under 10 minutes on 2 idle
  cores), in ``--threads`` threads;
- ``memory``: EAP edge scores on one induction prompt (``[BOS] A A``) of T tokens for each
  T of ``--lengths``, dense and blocked attention, each in its own process: peak RSS above
  the loaded model, and the exponent of that growth fitted against T on a log-log scale
  (1 is linear, 2 quadratic);
- ``retrieval``: EAP edge scores on one retrieval document (a key-value pair planted at its
  start, asked for at its end: :mod:`workbench.inputs.retrieval`) of T tokens for each T of
  ``--retrieval-lengths``, with ``--retrieval-attention`` (default blocked), each in its own
  process: seconds, peak RSS above the loaded model and in all, the load average at the end,
  and the exponent of the peak's growth against T (as ``memory``'s); ``--low-memory``
  (default auto) is the edge scores' ``low_memory``, and each row says whether it was on;
- ``ablation``: one ablated pass on the same retrieval documents, each in its own process:
  the corrupted references, then the document with every edge outside a fixed circuit (a
  seeded half of the edges) ablated to them, as each point of the faithfulness curve and
  each exact edge patch runs; seconds, peak RSS above the loaded model and in all, with
  ``--low-memory`` as the passes' ``low_memory``.

"Above the loaded model" is the peak RSS of the edge scores less the RSS once the model
and the task are made: on Linux the peak is reset there (``/proc/self/clear_refs``), so a
load's own transient peak (a GGUF's dequantization) does not hide the edge scores' below
it; elsewhere it is measured from the peak of the load.

``--smoke`` runs each at a tiny size on ``--model`` (a local folder), in this process;
``--keys`` and ``--values`` name the retrieval words where the library's lists have no
single token on the model's tokenizer.

Usage:
    python benchmarks/circuit.py --model smollm2 --parts ioi,memory [--json]
    python benchmarks/circuit.py --model smollm2 --parts memory --lengths 512,1024,2048
    python benchmarks/circuit.py --model smollm2 --parts retrieval --retrieval-lengths 2048,4096
    python benchmarks/circuit.py --model gemma3 --parts retrieval --retrieval-lengths 32768
    python benchmarks/circuit.py --model gemma3 --parts ablation --retrieval-lengths 32768
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from experiments.circuit.measure import induction_task, ioi_task, retrieval_task
from workbench.core.options import AttentionPath
from workbench.interventions.circuits import flow
from workbench.interventions.circuits.ablate import circuit_metrics
from workbench.interventions.circuits.attribution import LowMemory, edge_scores, is_low_memory
from workbench.interventions.circuits.graph import Graph, build_graph
from workbench.interventions.circuits.task import Task
from workbench.models.base import Model
from workbench.models.load import load_model


def _rss_gib() -> float:
    """The process's peak RSS since :func:`_reset_peak` (Linux's ``VmHWM``), else since it
    started."""
    status = _status("VmHWM")
    return status if status is not None else (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)  # KiB on Linux


def _loaded_gib() -> float:
    """The RSS now, with the peak reset to it where Linux allows (``clear_refs`` 5), so
    that a model load's transient peak (a GGUF's dequantization) does not hide what
    follows; else the peak so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return _rss_gib()
    now = _status("VmRSS")
    return now if now is not None else _rss_gib()


def _status(field: str) -> float | None:
    """A ``/proc/self/status`` memory field in GiB (``None`` off Linux)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 2**20  # kB
    return None


def ioi(model_name: str, prompts: int, steps: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model = load_model(model_name)
    graph = build_graph(model)
    task = ioi_task(model, prompts, 15, 0)
    start = time.perf_counter()
    edge_scores(model, graph, task, method="eap-ig", steps=steps)
    return {"part": "ioi", "model": model_name, "prompts": prompts, "steps": steps,
            "threads": threads, "edges": graph.n_edges,
            "seconds": round(time.perf_counter() - start, 1), "peak_gib": round(_rss_gib(), 2)}


def memory_one(model_name: str, length: int, attention: AttentionPath) -> dict:
    model = load_model(model_name)
    graph = build_graph(model)
    seq = max(2, (length - 1) // 2)
    task = induction_task(model, 1, seq, 0)
    loaded = _loaded_gib()
    start = time.perf_counter()
    edge_scores(model, graph, task, method="eap", attention=attention, max_batch_tokens=length)
    return {"part": "memory", "T": int(task.clean.shape[1]), "attention": attention,
            "seconds": round(time.perf_counter() - start, 1),
            "above_model_gib": round(_rss_gib() - loaded, 3)}


def memory(model_name: str, lengths: list[int]) -> list[dict]:
    rows = []
    for attention in ("dense", "blocked"):
        for length in lengths:
            out = subprocess.run([sys.executable, __file__, "--one", str(length), attention,
                                  "--model", model_name], capture_output=True, text=True,
                                 check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        mine = [r for r in rows if r.get("attention") == attention and "T" in r]
        if len(mine) > 1:
            rows.append({"part": "memory_exponent", "attention": attention,
                         "exponent": _exponent(mine)})
    return rows


def _document(model_name: str, length: int, keys: list[str] | None,
              values: list[str] | None) -> tuple[Model, Graph, Task, float]:
    """The model, its graph, one retrieval document of ``length`` tokens, and the RSS once
    they are made (:func:`_loaded_gib`)."""
    model = load_model(model_name)
    graph = build_graph(model)
    task = retrieval_task(model, 1, length, 0, keys=keys, values=values)
    return model, graph, task, _loaded_gib()


def _document_row(part: str, model: Model, task: Task, attention: AttentionPath,
                  low_memory: LowMemory, seconds: float, peak: float, loaded: float) -> dict:
    """What the ``retrieval`` and ``ablation`` rows both say."""
    low = is_low_memory(model, task.clean.numel(), low_memory)
    return {"part": part, "T": int(task.clean.shape[1]), "attention": attention,
            "low_memory": "on" if low else "off", "seconds": round(seconds, 1),
            "above_model_gib": round(peak - loaded, 3), "peak_gib": round(peak, 2),
            "load_1min": round(os.getloadavg()[0], 2)}


def retrieval_one(model_name: str, length: int, attention: AttentionPath,
                  keys: list[str] | None = None, values: list[str] | None = None,
                  low_memory: LowMemory = "auto") -> dict:
    model, graph, task, loaded = _document(model_name, length, keys, values)
    start = time.perf_counter()
    edge_scores(model, graph, task, method="eap", attention=attention, max_batch_tokens=length,
                low_memory=low_memory)
    seconds = time.perf_counter() - start
    peak = _rss_gib()  # the edge scores' own peak, before the clean read below
    with torch.no_grad(), flow.attention_run(model, attention):
        clean = float(flow.metric_values(model, task.clean, task.metric, slice(0, 1))[0])
    return {**_document_row("retrieval", model, task, attention, low_memory, seconds, peak,
                            loaded), "metric_clean": round(clean, 3)}


def ablation_one(model_name: str, length: int, attention: AttentionPath,
                 keys: list[str] | None = None, values: list[str] | None = None,
                 low_memory: LowMemory = "auto") -> dict:
    model, graph, task, loaded = _document(model_name, length, keys, values)
    half = graph.edges & (torch.rand(graph.edges.shape,
                                     generator=torch.Generator().manual_seed(0)) < 0.5)
    start = time.perf_counter()
    got = circuit_metrics(model, graph, task, [half], max_batch_tokens=length,
                          attention=attention, low_memory=low_memory)
    seconds = time.perf_counter() - start
    peak = _rss_gib()
    return {**_document_row("ablation", model, task, attention, low_memory, seconds, peak,
                            loaded), "kept_edges": int(half.sum()), "edges": graph.n_edges,
            "metric": round(float(got[0, 0]), 3)}


def retrieval(model_name: str, lengths: list[int], attention: str, words: list[str],
              part: str = "retrieval") -> list[dict]:
    """``part`` (``retrieval`` or ``ablation``) at each length, each in its own process."""
    rows = []
    for length in lengths:
        out = subprocess.run([sys.executable, __file__, f"--one-{part}", str(length),
                              attention, "--model", model_name, *words], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if len(rows) > 1:
        rows.append({"part": f"{part}_exponent", "attention": attention,
                     "exponent": _exponent(rows)})
    return rows


def _exponent(rows: list[dict]) -> float:
    """The slope of log peak memory above the model against log T (1: linear in T)."""
    t = np.log([r["T"] for r in rows])
    m = np.log([max(r["above_model_gib"], 1e-6) for r in rows])
    return round(float(np.polyfit(t, m, 1)[0]), 2)


def _path(name: str) -> AttentionPath:
    return "blocked" if name == "blocked" else "dense"


def _low(name: str) -> LowMemory:
    return "on" if name == "on" else "off" if name == "off" else "auto"


def _words(text: str | None) -> list[str] | None:
    return text.split(",") if text else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--parts", default="ioi,memory")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="256,512,1024,2048")
    parser.add_argument("--retrieval-lengths", default="512,1024,2048")
    parser.add_argument("--retrieval-attention", choices=("blocked", "dense"),
                        default="blocked")
    parser.add_argument("--keys", help="retrieval keys, comma-separated (default: the "
                        "library's)")
    parser.add_argument("--values", help="retrieval values, comma-separated (default: the "
                        "library's)")
    parser.add_argument("--low-memory", choices=("auto", "on", "off"), default="auto",
                        help="retrieval and ablation: the passes' low_memory")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--one-retrieval", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--one-ablation", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    keys, values = _words(args.keys), _words(args.values)
    if args.one:
        print(json.dumps(memory_one(args.model, int(args.one[0]), _path(args.one[1]))))
        return
    if args.one_retrieval:
        print(json.dumps(retrieval_one(args.model, int(args.one_retrieval[0]),
                                       _path(args.one_retrieval[1]), keys, values,
                                       _low(args.low_memory))))
        return
    if args.one_ablation:
        print(json.dumps(ablation_one(args.model, int(args.one_ablation[0]),
                                      _path(args.one_ablation[1]), keys, values,
                                      _low(args.low_memory))))
        return
    if args.smoke:
        rows = [_smoke_ioi(args.model), memory_one(args.model, 24, "dense"),
                memory_one(args.model, 24, "blocked"),
                retrieval_one(args.model, 48, "blocked", keys, values),
                retrieval_one(args.model, 48, "blocked", keys, values, "on"),
                ablation_one(args.model, 48, "blocked", keys, values, "off"),
                ablation_one(args.model, 48, "blocked", keys, values, "on")]
    else:
        parts = args.parts.split(",")
        rows = [ioi(args.model, args.prompts, args.steps, args.threads)] if "ioi" in parts else []
        if "memory" in parts:
            rows += memory(args.model, [int(x) for x in args.lengths.split(",")])
        words = [f"--low-memory={args.low_memory}"] + [
            f"--{k}={v}" for k, v in (("keys", args.keys), ("values", args.values)) if v]
        for part in ("retrieval", "ablation"):
            if part in parts:
                rows += retrieval(args.model,
                                  [int(x) for x in args.retrieval_lengths.split(",")],
                                  args.retrieval_attention, words, part)
    for row in rows:
        print(json.dumps(row) if args.json else "  ".join(f"{k}={v}" for k, v in row.items()))


def _smoke_ioi(model_name: str) -> dict:
    """The ``ioi`` part's passes on induction prompts (a tiny tokenizer has no IOI names)."""
    model = load_model(model_name)
    graph = build_graph(model)
    start = time.perf_counter()
    edge_scores(model, graph, induction_task(model, 2, 4, 0), method="eap-ig", steps=2)
    return {"part": "ioi-smoke", "edges": graph.n_edges,
            "seconds": round(time.perf_counter() - start, 2)}


if __name__ == "__main__":
    main()
