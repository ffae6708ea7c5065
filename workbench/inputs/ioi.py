"""Indirect-object-identification prompts (Wang et al. 2022): templates, names, corrupted runs.

"When Mary and John went to the store, John gave a drink to" is completed with the
*indirect object* (IO, Mary), not the *subject* (S, John), who occurs twice. The templates
(:data:`TEMPLATES`) are the fifteen of Wang et al.'s dataset code, written in their BABA
form (S first: "Then, [B] and [A] ... [B] gave a [OBJECT] to"), with ``[A]`` the IO and
``[B]`` the S; the ABBA form swaps the first two names ("Then, [A] and [B] ..."). A prompt
ends just before the IO, so the next token is the answer; the *logit difference*
``logit(IO) - logit(S)`` at the last position (END) measures the behaviour.

Names, places and objects are filled in from :data:`NAMES`, :data:`PLACES` and
:data:`OBJECTS`, filtered at run time to those that are one token in the model's tokenizer
with their leading space (:func:`single_tokens`), so every prompt of one template and
order has the same tokens at the same positions and the named positions (:data:`ROLES`:
IO, S1, S1+1, S2, END) are known. Token ids are built from the template's pieces, so a
position never depends on how the tokenizer merges across a name.

The corrupted run (Wang et al.'s "ABC" distribution) replaces the three names (IO, S1, S2)
by three other names, distinct from each other and from IO and S, and keeps every other
token: neither IO nor S is in its context, so it carries none of the task's information.

Examples:
    >>> prompts = ioi_prompts(model, 16, seed=0)                 # doctest: +SKIP
    >>> p = prompts[0]; p.text, model.str_tokens([p.io_id])      # doctest: +SKIP
    ('Then, John and Mary went to the store. John gave a drink to', [' Mary'])
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from workbench.core.errors import WorkbenchError
from workbench.core.values import MAX_PROMPTS, SEED, Range
from workbench.inputs.prompts import Prompt, prompt_set

if TYPE_CHECKING:
    from workbench.inputs.tokenizing import TokenizingModel

TEMPLATES: tuple[str, ...] = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a "
    "[OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)
"""Wang et al.'s templates in the BABA form: ``[A]`` the indirect object, ``[B]`` the subject
(twice); the final ``[A]`` is the answer, left out of the prompt."""
NAMES: tuple[str, ...] = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda",
    "Daniel", "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon",
    "Jason", "Justin", "Sarah", "William", "Jonathan", "Stephanie", "Brian", "Nicole",
    "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam", "Megan", "Melissa", "Kevin",
    "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren", "Amber",
    "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle",
    "Tiffany", "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob",
    "Stephen", "Patrick", "Sean", "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara",
    "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine", "Andrea", "Gregory", "Erica",
    "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose", "Alexander",
    "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia",
    "Cody", "Allison", "Bradley", "Samuel",
)
"""Common English first names, the kind Wang et al.'s dataset draws from."""
PLACES: tuple[str, ...] = ("store", "garden", "restaurant", "school", "hospital", "office",
                           "house", "station")
OBJECTS: tuple[str, ...] = ("ring", "kiss", "bone", "basketball", "computer", "necklace",
                            "drink", "snack")
Order = Literal["ABBA", "BABA"]
ORDERS: tuple[Order, ...] = ("ABBA", "BABA")
ROLES: tuple[str, ...] = ("IO", "S1", "S1+1", "S2", "END")
"""The named positions: the indirect object, the subject's first occurrence and the token
after it, the subject's second occurrence, and the last position (where the answer is
read)."""
_SLOT = re.compile(r" ?\[(A|B|PLACE|OBJECT)\]")


@dataclass(frozen=True)
class IOIPrompt:
    """One prompt, its corrupted twin and its named positions."""

    template: int
    order: Order
    io: str
    s: str
    text: str
    ids: tuple[int, ...]
    """framed as the model expects (BOS first, for a causal LM); the answer is not in it"""
    corrupted: tuple[int, ...]
    """the same with IO, S1 and S2 replaced by three other names"""
    io_id: int
    s_id: int
    roles: dict[str, int]
    """position of each of :data:`ROLES`"""

    @property
    def group(self) -> str:
        """Prompts of one group have the same length and named positions:
        ``"T3 ABBA"``."""
        return f"T{self.template} {self.order}"


def single_tokens(model: TokenizingModel, words: Sequence[str]) -> dict[str, int]:
    """The ``words`` that are one token with a leading space (``" Mary"``), with that token.

    Args:
        model: whose tokenizer decides.
        words: candidates (without the space).
    """
    out = {}
    for word in dict.fromkeys(words):
        ids = model.tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            out[word] = ids[0]
    return out


def _ordered(template: str, order: Order) -> str:
    """The template in ``order``: ABBA swaps its first two names."""
    if order == "BABA":
        return template
    first, second = [m for m in re.finditer(r"\[(A|B)\]", template)][:2]
    return (template[:first.start()] + second.group() + template[first.end():second.start()]
            + first.group() + template[second.end():])


def _build(model: TokenizingModel, template: str, fill: dict[str, tuple[str, int]]
           ) -> tuple[list[int], list[tuple[str, int]], str]:
    """Token ids of a template (the final answer slot dropped), the slot of each position
    that holds a filled word, and the text."""
    body = template[: template.rindex(" [A]")]
    ids: list[int] = []
    slots: list[tuple[str, int]] = []
    text, at = "", 0
    for match in _SLOT.finditer(body):
        piece = body[at: match.start()]
        if piece:
            ids += model.tokenizer(piece, add_special_tokens=False)["input_ids"]
        word, token = fill[match.group(1)]
        slots.append((match.group(1), len(ids)))
        ids.append(token)
        text += piece + " " + word
        at = match.end()
    tail = body[at:]
    if tail:
        ids += model.tokenizer(tail, add_special_tokens=False)["input_ids"]
    return ids, slots, text + tail


def ioi_prompts(model: TokenizingModel, n: int, *, templates: Sequence[int] | None = None,
                names: Sequence[str] | None = None, places: Sequence[str] | None = None,
                objects: Sequence[str] | None = None, seed: int = 0) -> list[IOIPrompt]:
    """``n`` IOI prompts cycling over the templates, each in ABBA then BABA order, with
    names, a place and an object drawn at random (reproducibly) from those that are single
    tokens of the model.

    Args:
        model: a causal LM (its tokenizer and framing).
        n: prompts.
        templates: indices into :data:`TEMPLATES` (default all).
        names, places, objects: candidates (default :data:`NAMES`, :data:`PLACES`,
            :data:`OBJECTS`), filtered to single tokens.
        seed: of the draws.

    Raises:
        WorkbenchError: fewer than five names (IO, S and three for the corrupted run), or
            no place or object, are single tokens.
    """
    # an empty list given is an empty list, never the defaults in its place
    pools = {kind: single_tokens(model, default if words is None else words)
             for kind, words, default in (("names", names, NAMES), ("places", places, PLACES),
                                          ("objects", objects, OBJECTS))}
    for kind, least in (("names", 5), ("places", 1), ("objects", 1)):
        if len(pools[kind]) < least:
            raise WorkbenchError(f"IOI needs at least {least} {kind} that are one token in "
                                 f"{model.info.name}'s tokenizer (with a leading space); "
                                 f"found {len(pools[kind])}")
    chosen = list(range(len(TEMPLATES))) if templates is None else list(templates)
    bad = [t for t in chosen if not 0 <= t < len(TEMPLATES)]
    if bad or not chosen:
        raise WorkbenchError(f"templates must be among 0 .. {len(TEMPLATES) - 1}, got {bad}")
    rng = random.Random(seed)
    offset = len(model.frame([]))  # BOS
    name_pool = sorted(pools["names"].items())
    out = []
    for i in range(n):
        t, order = chosen[(i // 2) % len(chosen)], ORDERS[i % 2]
        io, s, *others = rng.sample(name_pool, 5)
        place = rng.choice(sorted(pools["places"].items()))
        obj = rng.choice(sorted(pools["objects"].items()))
        template = _ordered(TEMPLATES[t], order)
        fill = {"A": io, "B": s, "PLACE": place, "OBJECT": obj}
        ids, slots, text = _build(model, template, fill)
        corrupted = list(ids)
        names_at = [pos for slot, pos in slots if slot in ("A", "B")]
        for pos, (_, token) in zip(names_at, others, strict=True):
            corrupted[pos] = token
        s_at = [pos for slot, pos in slots if slot == "B"]
        io_at = next(pos for slot, pos in slots if slot == "A")
        roles = {"IO": io_at, "S1": s_at[0], "S1+1": s_at[0] + 1, "S2": s_at[1],
                 "END": len(ids) - 1}
        out.append(IOIPrompt(t, order, io[0], s[0], text, tuple(model.frame(ids)),
                             tuple(model.frame(corrupted)), io[1], s[1],
                             {k: v + offset for k, v in roles.items()}))
    return out


@prompt_set("ioi")
def ioi(model: TokenizingModel, n_prompts: Annotated[int, Range(min=1, max=MAX_PROMPTS)] = 64,
        seed: Annotated[int, SEED] = 0) -> Iterator[Prompt]:
    """IOI sentences with their answer, the indirect object, as the last token (so an
    experiment that reads the last token as the answer, ``logit-lens``, asks about IO):
    the templates cycled, ABBA then BABA (:func:`ioi_prompts`)."""
    for i, p in enumerate(ioi_prompts(model, n_prompts, seed=seed)):
        yield Prompt(token_ids=(*p.ids, p.io_id), label=f"ioi[{i}] {p.group}")
