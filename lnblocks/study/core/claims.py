"""Claims checked on a study: the three-valued ``Verdict`` of one claim on one ``Estimate`` (``core.stats``), the
published ``Claim`` every task's findings return (its verdict, or NOT TESTED when the study cannot test it), and the
markdown verdict table the reports print.

Verdict rules (docs/study-claims.md states them next to every claim):

- Continuous claims ("value > threshold" or "value < threshold") on a 95% interval: REPRODUCED when the whole
  interval lies on the claimed side of the threshold, DID NOT REPRODUCE when the whole interval lies on the other
  side, INCONCLUSIVE when it contains the threshold. ``seeds_needed`` is then the smallest n whose t half-width
  ``t(1 - a/2, n - k) * spread / sqrt(n)`` falls below the observed distance to the threshold.
- Share-of-seeds claims ("the run gets stuck"): the same rule on the exact Clopper-Pearson interval of the agreeing
  share with threshold 1/2, i.e. REPRODUCED when the lower bound exceeds 1/2 (most seeds agree, with 95%
  confidence), DID NOT REPRODUCE when the upper bound is below 1/2. Exact intervals never overclaim at small n;
  the price is that 6/6 agreeing seeds are needed (5/5 gives a lower bound of 0.478).
- Threshold claims ("Post-LN's largest stable LR lies below Pre-LN's") compare ``largest_stable_lr`` per seed with
  ``ordered_share``: seeds the grid cannot resolve are left out, so a wider grid cannot flip the verdict.
- Equivalence claims ("accuracy is flat": ``|effect| < margin``, ``within``): REPRODUCED when the interval lies
  inside ``(-margin, margin)``, DID NOT REPRODUCE when it lies wholly beyond one bound.
- Claims of several parts (``all_of``): REPRODUCED when every part is, DID NOT REPRODUCE when one part is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from lnblocks.study.core.atomic import finite_or_null
from lnblocks.study.core.stats import MAX_SEEDS, Estimate, seeds_needed

SHARE_THRESHOLD = 0.5


class Outcome(str, Enum):
    """A verdict's outcome; its value is what reports print."""

    REPRODUCED = "REPRODUCED"
    DID_NOT_REPRODUCE = "DID NOT REPRODUCE"
    INCONCLUSIVE = "INCONCLUSIVE"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one claim (``claim`` reads e.g. ``"slope > 0"``) against ``estimate``.
    ``seeds_needed`` (INCONCLUSIVE only): the total n at which the same effect would be settled, or None when the
    estimate sits exactly on ``threshold``, the spread is unknown (one seed) or it would take over ``MAX_SEEDS``."""

    outcome: Outcome
    estimate: Estimate
    claim: str
    threshold: float
    seeds_needed: int | None = None

    def __str__(self) -> str:
        text = f"{self.outcome}: {self.estimate} vs claim {self.claim}"
        if self.outcome is Outcome.INCONCLUSIVE:
            if self.seeds_needed is not None:
                more = f"~{self.seeds_needed} seeds"
            elif self.estimate.value == self.threshold:
                more = "no number of seeds (the estimate sits on the threshold)"
            elif self.estimate.n == 1:
                more = "unknown (one seed has no spread)"
            else:
                more = f"more than {MAX_SEEDS} seeds"
            text += f"; would settle it: {more}"
        return text


def verdict(est: Estimate, claim: str, threshold: float | None = None) -> Verdict:
    """Check ``value > threshold`` (``claim=">"``) or ``value < threshold`` (``claim="<"``) on ``est``'s interval:
    REPRODUCED when the interval lies wholly on the claimed side, DID NOT REPRODUCE when it lies wholly on the
    other side, INCONCLUSIVE when it contains the threshold (then ``seeds_needed`` is set). Shares default to the
    threshold 1/2 ("most seeds agree"), everything else to 0."""
    if claim not in (">", "<"):
        raise ValueError(f"claim must be '>' or '<', got {claim!r}")
    if threshold is None:
        threshold = SHARE_THRESHOLD if est.successes is not None else 0.0
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
    above, below = est.low > threshold, est.high < threshold
    supports, contradicts = (above, below) if claim == ">" else (below, above)
    text = f"{est.label} {claim} {threshold:g}"
    if supports:
        return Verdict(Outcome.REPRODUCED, est, text, threshold)
    if contradicts:
        return Verdict(Outcome.DID_NOT_REPRODUCE, est, text, threshold)
    return Verdict(Outcome.INCONCLUSIVE, est, text, threshold, seeds_needed(est, threshold))


def within(est: Estimate, margin: float) -> Verdict:
    """Check ``|value| < margin`` (no effect bigger than ``margin``, e.g. "accuracy is flat") on ``est``'s interval:
    REPRODUCED when the interval lies inside ``(-margin, margin)``, DID NOT REPRODUCE when it lies wholly beyond
    one bound, INCONCLUSIVE otherwise (``seeds_needed`` against the nearer bound)."""
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    text = f"|{est.label}| < {margin:g}"
    if -margin < est.low and est.high < margin:
        return Verdict(Outcome.REPRODUCED, est, text, margin)
    if est.low > margin or est.high < -margin:
        return Verdict(Outcome.DID_NOT_REPRODUCE, est, text, margin)
    bound = margin if est.value >= 0 else -margin
    return Verdict(Outcome.INCONCLUSIVE, est, text, bound, seeds_needed(est, bound))


def all_of(parts: Sequence[Verdict], claim: str) -> Verdict:
    """The verdict of a claim made of ``parts`` (e.g. "BatchNorm falls and GroupNorm stays flat"): REPRODUCED when
    every part is, DID NOT REPRODUCE when one part is, INCONCLUSIVE otherwise. Its estimate and threshold are the
    first part with that outcome; ``seeds_needed`` (INCONCLUSIVE) the most any inconclusive part needs, None when
    one of them cannot say."""
    if not parts:
        raise ValueError("all_of needs at least one part")
    outcomes = [p.outcome for p in parts]
    if Outcome.DID_NOT_REPRODUCE in outcomes:
        outcome = Outcome.DID_NOT_REPRODUCE
    elif all(o is Outcome.REPRODUCED for o in outcomes):
        outcome = Outcome.REPRODUCED
    else:
        outcome = Outcome.INCONCLUSIVE
    first = next(p for p in parts if p.outcome is outcome)
    needed = None
    if outcome is Outcome.INCONCLUSIVE:
        counts = [p.seeds_needed for p in parts if p.outcome is Outcome.INCONCLUSIVE]
        needed = None if None in counts else max(counts)  # type: ignore[type-var]
    return Verdict(outcome, first.estimate, claim, first.threshold, needed)


# ---- published claims -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A published claim checked on a study: ``id`` (docs/study-claims.md), ``title`` (the claim), ``paper``,
    the ``verdict`` (None: not tested, ``text`` says why), ``text`` with every number, and ``scale``: what scale
    the claim needs when this one cannot settle it."""

    id: str
    title: str
    paper: str
    verdict: Verdict | None
    text: str
    scale: str = ""

    @property
    def outcome(self) -> Outcome | None:
        return None if self.verdict is None else self.verdict.outcome

    @property
    def status(self) -> str:
        return "NOT TESTED" if self.verdict is None else str(self.verdict.outcome)

    @property
    def estimate(self) -> str:
        return "" if self.verdict is None else format(self.verdict.estimate)

    def settle(self) -> str:
        """What would settle an INCONCLUSIVE verdict ("~9 seeds"), else ""."""
        v = self.verdict
        if v is None or v.outcome is not Outcome.INCONCLUSIVE:
            return ""
        if v.seeds_needed is not None:
            unit = "units" if v.estimate.successes is not None else "seeds"
            return f"~{v.seeds_needed} {unit}"
        return "no n (no effect)" if v.estimate.value == v.threshold else "unknown (n=1)"

    def to_dict(self) -> dict[str, Any]:
        """``findings.json``: ``title``, ``status`` and ``text`` (what ``make demo`` prints) and the numbers."""
        v = self.verdict
        est = None
        if v is not None:  # an unbounded interval (one seed) is stored as null: JSON has no infinity
            e = v.estimate
            est = finite_or_null(
                {"value": e.value, "low": e.low, "high": e.high, "n": e.n, "label": e.label, "successes": e.successes}
            )
        return {
            "id": self.id, "title": f"{self.id} {self.title}", "paper": self.paper, "status": self.status.lower(),
            "text": self.text, "estimate": est, "estimate_text": self.estimate, "settle": self.settle(),
            "rule": None if v is None else v.claim,
            "seeds_needed": None if v is None else v.seeds_needed, "scale": self.scale,
        }  # fmt: skip


def not_tested(cid: str, title: str, paper: str, why: str) -> Claim:
    return Claim(cid, title, paper, None, f"Not tested: {why}.")


def judged(cid: str, title: str, paper: str, est: Estimate | None, claim: str, threshold: float | None, text: str,
           scale: str = "", none_why: str = "no unit of the grid tells the arms apart") -> Claim:  # fmt: skip
    """A claim with ``verdict(est, claim, threshold)``, or not tested (``none_why``) when there is no estimate."""
    if est is None:
        return Claim(cid, title, paper, None, f"{text} Not tested: {none_why}.".strip(), scale)
    text = text.rstrip()
    c = Claim(cid, title, paper, verdict(est, claim, threshold), text, scale)
    settle = f"; would settle it: {c.settle()}" if c.settle() else ""
    return dataclasses.replace(c, text=f"{text} Verdict: {c.status} ({c.verdict.claim}){settle}.")


def md_line(text: Any) -> str:
    """``text`` on one markdown line (newlines and tabs become spaces)."""
    return " ".join(str(text).replace("\t", " ").splitlines())


def md_cell(text: Any) -> str:
    """``text`` as one markdown table cell: on one line, with ``|`` escaped (``|log Z|``, a label ``a|b``)."""
    return md_line(text).replace("|", "\\|")


def md_row(cells: Sequence[Any]) -> str:
    """One markdown table row of ``cells`` (each escaped with ``md_cell``)."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def claims_table(claims: list[Claim]) -> list[str]:
    """Markdown verdict table: id, claim, paper, estimate with its interval and n, verdict, what would settle an
    INCONCLUSIVE one, and the scale a claim needs."""
    lines = [
        "| id | claim | paper (arXiv) | estimate [95% interval] | verdict | would settle it | needs more scale |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        needs = c.scale if c.outcome is None or str(c.outcome) != "REPRODUCED" else ""
        lines.append(md_row([c.id, c.title, c.paper, c.estimate or "–", c.status, c.settle() or "", needs]))
    return lines
