"""Sweeps on Ray: start-up overhead, 1 against 2 workers, the loop of ``workbench run``, and
peak memory per worker.

- startup: ``ray.init`` of a local Ray, then the first task's round trip (a worker process
  starting), then a second task's (a warm worker);
- sweep at 1 and at 2 workers: the same 8 CPU-bound cells (previous-token-heads on smollm2,
  seeds 0..7), each cell asking for 1 CPU (so 1 torch thread per worker) on a local Ray of
  1 or 2 CPUs, each into a fresh store; wall time with and without the Ray start-up, and
  the ratio;
- loop: the same 8 cells as 8 ``workbench run`` commands, one after another (each its own
  process, torch with its default threads);
- memory: every process under this one is sampled (psutil, every 0.2 s) during each sweep;
  the peak RSS of each Ray worker that ran a cell, and of all workers together.

The machine may be shared: say so next to the figures. Run with ``nice``.

Usage:
    nice -n 10 python benchmarks/sweep.py [--cells 8] [--json] [--no-loop]
    python benchmarks/sweep.py --smoke MODEL_FOLDER   # the tests' tiny run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

CONFIG = {"n_prompts": 8, "n_repeated": 8, "n_tokens": 128, "n_boot": 200}


def spec_text(n_cells: int, model: str = "smollm2", config: dict | None = None) -> str:
    fields = "".join(f"{k} = {v}\n" for k, v in (config or CONFIG).items())
    return (f'experiments = ["previous-token-heads"]\nmodels = [{json.dumps(model)}]\n'
            f"seeds = {list(range(n_cells))}\n[set]\n{fields}")


SMOKE = {"n_prompts": 2, "n_repeated": 2, "n_tokens": 16, "seq_len": 8, "n_boot": 10}
"""``--smoke``: one cell of this config at one worker, on the given model."""


class RssSampler:
    """Peak RSS (MiB) of every descendant process, and of the Ray workers' sum."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peak, self.total_workers = every, {}, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            workers = 0.0
            for proc in me.children(recursive=True):
                try:
                    rss, name = proc.memory_info().rss / 2**20, " ".join(proc.cmdline()[:1])
                except psutil.Error:
                    continue
                self.peak[proc.pid] = max(self.peak.get(proc.pid, 0.0), rss)
                if name.startswith("ray::"):
                    workers += rss
            self.total_workers = max(self.total_workers, workers)
            time.sleep(self.every)

def startup() -> dict:
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    t1 = time.perf_counter()
    ping = ray.remote(lambda: 1)
    ray.get(ping.remote())
    t2 = time.perf_counter()
    ray.get(ping.remote())
    t3 = time.perf_counter()
    ray.shutdown()
    return {"ray_init_s": round(t1 - t0, 2), "first_task_s": round(t2 - t1, 2),
            "warm_task_s": round(t3 - t2, 4)}


def sweep_at(workers: int, n_cells: int, root: Path, model: str = "smollm2",
             config: dict | None = None) -> dict:
    import ray

    from workbench.harness.sweeps import runner
    from workbench.harness.sweeps.spec import expand, parse_text

    store = root / f"store-{workers}"
    spec = parse_text(spec_text(n_cells, model, config), name="bench")
    cells = expand(spec, store)
    with RssSampler() as rss:
        t0 = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        t1 = time.perf_counter()
        run = runner.run_sweep(spec, cells, runs_dir=store, cpus=1)
        t2 = time.perf_counter()
        ray.shutdown()
    table = run.table("cells")
    assert (table.status == "complete").all(), table[["status", "error"]]
    # each cell reports its worker's peak RSS so far (getrusage): the last is the worker's
    per_worker = table.groupby("worker").peak_rss_mib.max().round(1).to_dict()
    return {"workers": workers, "wall_s": round(t2 - t0, 1), "after_start_s": round(t2 - t1, 1),
            "cell_s": [round(s, 1) for s in table.seconds], "worker_peak_rss_mib": per_worker,
            "workers_total_peak_rss_mib": round(rss.total_workers, 1)}


def loop(n_cells: int, root: Path) -> dict:
    store = root / "store-loop"
    sets = [arg for k, v in CONFIG.items() for arg in ("--set", f"{k}={v}")]
    peaks = []
    t0 = time.perf_counter()
    for seed in range(n_cells):
        with RssSampler() as rss:
            subprocess.run([sys.executable, "-m", "workbench", "--quiet", "run",
                            "previous-token-heads", "--model", "smollm2", *sets,
                            "--set", f"seed={seed}", "--out", str(store)], check=True,
                           stdout=subprocess.DEVNULL)
        peaks.append(max(rss.peak.values(), default=0.0))
    return {"wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_mib": round(max(peaks), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-loop", action="store_true", help="skip the `workbench run` loop")
    parser.add_argument("--smoke", metavar="MODEL", help="one tiny cell at one worker on MODEL "
                        "(a local folder): the benchmark still runs")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
            print(json.dumps(sweep_at(1, 1, Path(tmp), args.smoke, SMOKE)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        out = {"startup": startup(), "one": sweep_at(1, args.cells, root),
               "two": sweep_at(2, args.cells, root)}
        if not args.no_loop:
            out["loop"] = loop(args.cells, root)
    out["speedup_2_over_1"] = round(out["one"]["after_start_s"] / out["two"]["after_start_s"], 2)
    if "loop" in out:
        out["loop_over_sweep_1"] = round(out["loop"]["wall_s"] / out["one"]["wall_s"], 2)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    s = out["startup"]
    print(f"local Ray start-up: init {s['ray_init_s']} s, first task {s['first_task_s']} s "
          f"(a worker starts), warm task {s['warm_task_s']} s")
    for key in ("one", "two"):
        r = out[key]
        print(f"{args.cells} cells at {r['workers']} worker(s): {r['wall_s']} s "
              f"({r['after_start_s']} s after ray.init); cells {r['cell_s']}")
        print(f"  peak RSS per worker (MiB): {r['worker_peak_rss_mib']}; all workers "
              f"{r['workers_total_peak_rss_mib']} MiB")
    print(f"2 workers over 1: {out['speedup_2_over_1']}x (after start-up)")
    if "loop" not in out:
        return
    print(f"{args.cells} x `workbench run` in a loop: {out['loop']['wall_s']} s "
          f"(peak RSS {out['loop']['peak_rss_mib']} MiB); loop / sweep at 1 worker: "
          f"{out['loop_over_sweep_1']}")


if __name__ == "__main__":
    main()
