"""Changing a model to see what matters: head masks, ablation, head importance."""

from workbench.interventions.masks import Ablation, HeadMask, applied, head_means, mask_hooks

__all__ = ["Ablation", "HeadMask", "applied", "head_means", "mask_hooks"]
