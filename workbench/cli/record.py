"""``workbench record``: residual streams and attention patterns to disk, and the reading of
its inputs (``--text``, ``--file``, ``--prompt-set``, ``--heads-mask``), all checked before the
model loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.cli.render import _cell, _out
from workbench.core import paths
from workbench.core.devices import chosen_device
from workbench.core.errors import WorkbenchError


def _prompt_source(args: argparse.Namespace) -> tuple[Callable[[Any, int | None], list[Any]],
                                                      str]:
    """The prompts of ``record`` as a function of the model and ``--limit``, and their
    source; text, files and prompt-set parameters are read and checked here, before the
    model loads, and a generated set stops after ``--limit`` prompts."""
    from workbench.harness.config import split_overrides
    from workbench.inputs.prompts import (
        check_prompt_params,
        load_prompt_set,
        prompts_from_text,
        read_prompt_file,
    )

    if args.whole and args.file is None:
        raise WorkbenchError("--whole reads a --file as one prompt; it needs --file PATH")
    if args.set and args.prompt_set is None:
        raise WorkbenchError("--set sets parameters of a generated prompt set; it needs "
                             "--prompt-set NAME")
    if args.text is not None:
        if not args.text.strip():
            raise WorkbenchError("--text is empty")
        prompts = prompts_from_text(args.text, label="text")
        return lambda model, limit: prompts[:limit], "text"
    if args.file is not None:
        # paragraphs whatever the file's name: a regular UTF-8 file of bounded size
        prompts = read_prompt_file(Path(args.file), pairs=False, whole=args.whole)
        split = "the whole file" if args.whole else "blank lines separate prompts; --whole " \
            "reads the file as one"
        _out(_cell(f"{len(prompts)} prompt{'' if len(prompts) == 1 else 's'} from "
                   f"{args.file} ({split})"))
        return (lambda model, limit: prompts[:limit],
                f"file:{args.file}" + (" (whole)" if args.whole else ""))
    name = args.prompt_set
    params = check_prompt_params(name, split_overrides(args.set or []))
    return (lambda model, limit: load_prompt_set(name, model, limit=limit, **params),
            f"prompt-set:{name}")


def _check_topk(topk: int, model: Any) -> None:
    """Refuse a ``--topk`` larger than the model's context before anything is allocated:
    a row never has more keys, and the stored arrays grow with k."""
    n_ctx = model.info.n_ctx
    if topk > n_ctx:
        raise WorkbenchError(f"--topk {topk}: expected at most the context of "
                             f"{model.info.name} ({n_ctx} tokens)")


def _heads_mask(args: argparse.Namespace) -> Any:
    """The head mask of ``--heads-mask FILE`` or ``--ablate HEADS`` (with ``--ablation``,
    ``--ablation-seed`` and ``--from``), read and checked before any model loads, or
    ``None``."""
    ablate = getattr(args, "ablate", None)
    if ablate is None:
        for given, option in ((getattr(args, "ablation", None), "--ablation"),
                              (getattr(args, "ablation_seed", None), "--ablation-seed"),
                              (getattr(args, "from_run", None), "--from")):
            if given is not None:
                raise WorkbenchError(f"{option} goes with --ablate HEADS")
    if ablate is not None:
        from workbench.harness.ablate import ablation_mask, parse_ablate

        return ablation_mask(parse_ablate(ablate), args.ablation or "zero", model=args.model,
                             from_run=args.from_run, runs_dir=args.out,
                             seed=args.ablation_seed)
    if not getattr(args, "heads_mask", None):
        return None
    from workbench.harness.ablate import model_heads
    from workbench.interventions.masks import HeadMask

    mask = HeadMask.load(args.heads_mask)
    if args.model is not None and (shape := model_heads(args.model)) is not None:
        mask.check_shape(shape, args.model)  # and again once it loads, where not known here
    return mask


def cmd_record(args: argparse.Namespace) -> None:
    from workbench.interventions.masks import applied, check_donors
    from workbench.models.load import load_model
    from workbench.recording.writer import record
    from workbench.store.records import Interventions
    from workbench.store.runs import RunStore

    device = chosen_device(args.device)
    mask = _heads_mask(args)
    make_prompts, source = _prompt_source(args)
    model = load_model(args.model, dtype=args.dtype, device=device, runs_dir=args.out)
    if mask is not None:
        mask.check(model)
    _check_topk(args.topk, model)
    prompts = make_prompts(model, args.limit)
    for p in prompts:  # check every prompt before a run is created
        model.encode(p)
    check_donors(mask, model, prompts, max_tokens=args.max_batch_tokens)
    config = {"source": source, "n_prompts": len(prompts), "store_dtype": args.store_dtype,
              "max_batch_tokens": args.max_batch_tokens, "dtype": args.dtype,
              "patterns": args.patterns, "topk": args.topk, "resid": not args.no_resid,
              "qk_dtype": args.qk_dtype}
    store = RunStore(paths.runs_dir(args.out))
    interventions = Interventions(heads_mask=mask.to_record()) if mask is not None else None
    with store.start("record", model.info, config,
                     extra={"interventions": interventions}) as run, applied(model, mask):
        rec = record(model, prompts, run.dir / "recording", store_dtype=args.store_dtype,
                     max_batch_tokens=args.max_batch_tokens, patterns=args.patterns,
                     topk=args.topk, include_resid=not args.no_resid,
                     qk_dtype=args.qk_dtype)
        n_tokens = sum(len(p.token_ids) for p in rec.prompts)
        stored = f"top-{rec.topk}" if rec.patterns == "topk" else rec.patterns
        run.update(summary=[f"recorded {len(rec)} prompts, {n_tokens} tokens, "
                            f"{rec.n_layers} layers x {rec.n_heads} heads, {stored} patterns"])
    final = store.get(run.final)
    for line in final.meta.summary:
        _out(_cell(line))
    _out(_cell(final.path))
