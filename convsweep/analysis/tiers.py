"""The tops of a board's tiers confirmed by measuring them again (`convsweep leaderboard --confirm ROUNDS`).

A class never shares a process between submissions, so the tops are not confirmed as `confirm:` confirms a cell's
settings (one process, interleaved). Each tier's top (its leader) is measured again in turns, each turn a process of
its own on fresh rounds with every check (`measure`, which the command line runs as `convsweep run-job`), the tops
in board order, then in reverse, then in order again (A B C, C B A, A B C, ...): a drift of the GPU over the turns
moves every top alike, and none always goes first. Each turn gives its op-time sum (the conv layers' medians
added up). Then each top is held to the next tier's top by a paired test over the rounds (convsweep.base.stats
.paired_difference): the tiers' order holds where the next top is slower (p < ALPHA), is reversed where it is
faster, and is not told apart otherwise. A top is confirmed where its order with every neighbour holds.

Only boards of this machine's GPU model are measured: ranks are only within one model.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from convsweep.base.numbers import median
from convsweep.base.errors import ConvsweepError
from convsweep.base.stats import ALPHA, Paired, paired_difference

# Wilcoxon's signed-rank test over n rounds cannot go below p = 2 / 2**n: 0.0625 at five, 0.031 at six. With fewer
# than six measured turns a top could never be told from its neighbour at ALPHA (convsweep.base.stats).
MIN_ROUNDS = 6

# A turn: the top measured again (its op-time sum in ms), or None and why it gave none.
Turn = tuple[float | None, str | None]


@dataclass
class Confirmation:
    """What the re-measurement said of one tier's top: its turns' op-time sums (None where a turn gave none), their
    median, its comparison with the next tier's top (`paired`, and `order`: holds, reversed or not told apart),
    and `confirmed` with the sentence the leaderboard shows."""

    turns_ms: list[float | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    paired: Paired | None = None
    order: str | None = None  # holds, reversed, not told apart (against the next tier's top)
    confirmed: bool | None = None
    text: str = ""

    @property
    def median_ms(self) -> float | None:
        return median([t for t in self.turns_ms if t is not None])


def turn_orders(n: int, rounds: int) -> list[list[int]]:
    """The order of the n tops in each round: forward, then backward, alternately."""
    return [list(range(n)) if r % 2 == 0 else list(range(n - 1, -1, -1)) for r in range(rounds)]


def order_of(paired: Paired) -> str:
    """How the next tier's top (B) stands against this one's (A) in the paired rounds."""
    if paired.tied or paired.difference_ms is None:
        return "not told apart"
    return "holds" if paired.difference_ms > 0 else "reversed"


def confirm_tops(names: Sequence[str], rounds: int, measure: Callable[[int], Turn]) -> list[Confirmation]:
    """Measure the tops (`names`, in board order) in alternating turns and judge each against the next: returns
    one Confirmation per top. `measure(i)` runs top i once and returns its Turn."""
    found = [Confirmation() for _ in names]
    for order in turn_orders(len(names), rounds):
        for i in order:
            ms, error = measure(i)
            found[i].turns_ms.append(ms)
            if error:
                found[i].errors.append(error)
    for i in range(len(names) - 1):
        here, there = found[i], found[i + 1]
        here.paired = paired_difference(here.turns_ms, there.turns_ms)
        here.order = order_of(here.paired)
    for i, top in enumerate(found):
        top.confirmed, top.text = _verdict(names, found, i, rounds)
    return found


def _measured(top: Confirmation) -> int:
    return sum(t is not None for t in top.turns_ms)


def _verdict(names: Sequence[str], found: list[Confirmation], i: int, rounds: int) -> tuple[bool | None, str]:
    """Top i against the tier above's top and the tier below's: confirmed where both orders hold."""
    top = found[i]
    if _measured(top) < MIN_ROUNDS:
        why = f": {top.errors[0]}" if top.errors else ""
        return False, f"not confirmed: {_measured(top)} of {rounds} turns measured (at least {MIN_ROUNDS}){why}"
    said, held = [], True
    for other in (i - 1, i + 1):
        if not 0 <= other < len(found):
            continue
        owner = found[min(i, other)]  # the pair is stored on the upper of the two: the lower's turns minus its own
        pair, order = owner.paired, owner.order
        assert pair is not None and order is not None
        if _measured(found[other]) < MIN_ROUNDS:
            said.append(f"{names[other]} gave too few turns to compare with")
            held = False
            continue
        mine = (pair.difference_ms or 0.0) * (1 if other < i else -1)  # this top's time minus the other's
        p = f", p {pair.p_value:.2g}" if pair.p_value is not None else ""
        if order == "holds":
            said.append(f"{'behind' if other < i else 'ahead of'} {names[other]} ({mine:+.3f} ms{p})")
        else:
            held = False
            word = "not told apart from" if order == "not told apart" else "order reversed with"
            said.append(f"{word} {names[other]} ({mine:+.3f} ms{p}; {pair.detectable_ms or 0:.3f} ms needed to tell)")
    if not said:
        return None, f"one tier: no order to confirm ({_measured(top)} turns, median {top.median_ms:.3f} ms)"
    return held, ("confirmed: " if held else "not confirmed: ") + "; ".join(said) + f" ({_measured(top)} turns)"


def _turn(measure: Callable[[Any, Any], Turn], board: Any, tops: list, i: int) -> Turn:
    return measure(board, tops[i])


def tops_of(ranked: Sequence) -> list:
    """Each tier's top on a board: the first of its ranked entries with that tier (board order)."""
    seen: dict[int, Any] = {}
    for entry in ranked:
        if entry.tier is not None:
            seen.setdefault(entry.tier, entry)
    return list(seen.values())


def confirm_boards(boards: Sequence, rounds: int, measure: Callable[[Any, Any], Turn],
                   gpu_names: Sequence[str]) -> list[str]:
    """Each board's tier tops measured again (confirm_tops) where this machine has the board's GPU model, the verdict
    put on each top (`confirmed`, `confirmation`); returns a line per board saying what was done.
    `measure(board, entry)` runs the entry's setting once in a process of its own."""
    if rounds < MIN_ROUNDS:
        raise ConvsweepError(f"leaderboard: --confirm needs at least {MIN_ROUNDS} rounds (over fewer, the paired test "
                             f"cannot reach p < {ALPHA:g}), got {rounds}")
    said, here = [], ", ".join(gpu_names) or "no GPU"
    for board in boards:
        tops = tops_of(board.ranked)
        if len(tops) < 2:  # no order between tiers: nothing to measure
            for top in tops:
                top.confirmation = "one tier: no order to confirm"
            said.append(f"{board.title}: {'one tier' if tops else 'no tier'}: no order to confirm")
            continue
        if board.gpu not in gpu_names:
            for top in tops:
                top.confirmation = f"not confirmed: ranked on {board.gpu}; this machine has {here}"
            said.append(f"{board.title}: not confirmed here (this machine has {here})")
            continue
        found = confirm_tops([top.submission for top in tops], rounds, functools.partial(_turn, measure, board, tops))
        for top, verdict in zip(tops, found):
            top.confirmed, top.confirmation = verdict.confirmed, verdict.text
        held = sum(v.confirmed is True for v in found)
        said.append(f"{board.title}: {len(tops)} tier top{'s' * (len(tops) != 1)} measured again over {rounds} "
                    f"rounds, {held} confirmed")
    return said
