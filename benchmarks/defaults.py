"""Wall time of every registered experiment's default (or demo) config on its default model.

Each experiment runs in its own subprocess, into a temporary run store that is deleted
afterwards, exactly as ``workbench run NAME --model MODEL`` would run it (model loading
included, so the figure is what a user waits). The default model is the first of the
experiment's ``demo_models`` (``smollm2`` for every bundled experiment); experiments that
build their own models get none. The target is 10 minutes per experiment on 2 idle cores;
the load average before and after each run is printed beside it, since a figure taken while
other processes share the cores is not an idle figure.

Usage:
    python benchmarks/defaults.py                          # every experiment, default config
    python benchmarks/defaults.py --config demo            # the demo configs
    python benchmarks/defaults.py --only attention-sinks --set stream_tokens=1024
    python benchmarks/defaults.py --all-models --json      # on each of its demo models
    python benchmarks/defaults.py --config demo --models gemma3   # on another model
    python benchmarks/defaults.py --smoke MODEL_FOLDER     # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

TARGET_S = 600.0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU time of this process: less sensitive than wall time to other
    processes sharing the cores (with 2 torch threads it is about twice the idle wall time)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_one(name: str, model: str | None, config: str, overrides: list[str]) -> dict:
    """Run one experiment in this process and return its timings (the ``--one`` mode)."""
    from workbench.harness.config import split_overrides
    from workbench.harness.experiment import get, run_experiment
    from workbench.models.load import load_model

    settings = {**get(name).named_config(config, model), **split_overrides(overrides)}
    start, cpu_start = time.perf_counter(), cpu_seconds()
    loaded = load_model(model) if model is not None else None
    load_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        run = run_experiment(name, loaded, settings, runs_dir=tmp)
    wall = time.perf_counter() - start
    return {"experiment": name, "model": model, "config": config, "overrides": overrides,
            "status": run.status, "load_s": load_s, "wall_s": wall,
            "cpu_s": cpu_seconds() - cpu_start, "peak_rss_mib": peak_rss_mib()}


def plan(only: list[str], all_models: bool, models: list[str] | None = None
         ) -> list[tuple[str, str | None]]:
    """``(experiment, model)`` pairs to run, in registry order: on ``models`` where given
    (every experiment that takes a model), else on its first or every demo model."""
    from workbench.harness.experiment import all_experiments, get

    experiments = [get(name) for name in only] if only else all_experiments()
    pairs: list[tuple[str, str | None]] = []
    for exp in experiments:
        if not exp.needs_model:
            pairs.append((exp.name, None))
            continue
        chosen = models or (exp.demo_models if all_models else exp.demo_models[:1])
        for model in chosen:
            pairs.append((exp.name, model))
    return pairs


def measure(name: str, model: str | None, args: argparse.Namespace) -> dict:
    """Run one experiment in a fresh subprocess; a crash or timeout is reported, not raised."""
    cmd = [sys.executable, __file__, "--one", name, "--config", args.config]
    cmd += ["--model", model] if model is not None else []
    for item in args.set:
        cmd += ["--set", item]
    before = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"experiment": name, "model": model, "config": args.config,
                "status": f"stopped after {args.timeout:g} s", "wall_s": float("nan"),
                "load_before": before, "load_after": os.getloadavg()[0]}
    out = {"experiment": name, "model": model, "config": args.config,
           "load_before": before, "load_after": os.getloadavg()[0]}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**out, "status": f"error: {tail}", "wall_s": time.perf_counter() - start}
    return {**out, **json.loads(proc.stdout.strip().splitlines()[-1])}


def render(result: dict) -> str:
    wall = result["wall_s"]
    verdict = "n/a" if wall != wall else ("yes" if wall < TARGET_S else "NO")
    cpu = result.get("cpu_s", float("nan"))
    return (f"{result['experiment']:26s} {result['model'] or '-':8s} {result['config']:8s} "
            f"{wall:9.1f} {verdict:>6s} {cpu:9.1f} {result.get('peak_rss_mib', float('nan')):9.0f}"
            f"  load {result['load_before']:.1f}->{result['load_after']:.1f}  {result['status']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--config", choices=("default", "demo"), default="default")
    parser.add_argument("--only", default="", help="comma-separated experiment names")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for every run (e.g. a reduced config)")
    parser.add_argument("--all-models", action="store_true",
                        help="run on each of the experiment's demo models, not only the first")
    parser.add_argument("--models", default="", metavar="M1,M2",
                        help="run on these models (comma-separated MODEL arguments, e.g. "
                        "gemma3) instead of the demo models; one that an experiment refuses "
                        "is reported as an error")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop an experiment after this many seconds")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--smoke", metavar="MODEL", help="head-overview's demo config on "
                        "MODEL (a local folder), in this process: the benchmark still runs")
    args = parser.parse_args()
    if args.smoke:
        print(json.dumps(run_one("head-overview", args.smoke, "demo", ["n_boot=10"])))
        return
    if args.one:
        print(json.dumps(run_one(args.one, args.model, args.config, args.set)))
        return
    results = []
    if not args.json:
        print(f"{'experiment':26s} {'model':8s} {'config':8s} {'wall s':>9s} {'<10min':>6s} "
              f"{'cpu s':>9s} {'peak MiB':>9s}")
    models = [m for m in args.models.split(",") if m] or None
    for name, model in plan([n for n in args.only.split(",") if n], args.all_models, models):
        results.append(measure(name, model, args))
        if not args.json:
            print(render(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
