"""What goes into a model: prompts and prompt sets, batching, corpora, sentences, token types,
IOI prompts.

Functions that need a model (random token ids from its vocabulary, framing with its
special tokens) take one as an argument; this layer never loads one.
"""

from workbench.inputs import corpus as _corpus  # noqa: F401 (registers the corpus prompt set)
from workbench.inputs import ioi as _ioi  # noqa: F401 (registers the ioi prompt set)
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.prompts import Prompt, load_prompt_set, prompts_from_text

__all__ = ["Batch", "Prompt", "load_prompt_set", "make_batches", "prompts_from_text"]
