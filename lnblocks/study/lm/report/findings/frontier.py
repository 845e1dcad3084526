"""The claims of the 2025-26 stability papers, for the arms a study has (``frontier_arms.frontier_roles``): each
group is checked when the study has the arm its paper introduces, and a claim whose comparison arm is missing is NOT
TESTED with that reason (docs/study-claims.md, "The 2025-26 stability literature")."""

from __future__ import annotations

from typing import Any

from lnblocks.study.core.claims import Claim
from lnblocks.study.lm.report.findings import frontier_attention as att
from lnblocks.study.lm.report.findings import frontier_norms as norms
from lnblocks.study.lm.report.findings.frontier_arms import frontier_roles


def frontier_claims(rows: list[dict[str, Any]]) -> list[Claim]:
    """DF, NO, HN, SN, NG, HC, GA, OL and GM claims of the groups whose own arm the study has."""
    r = frontier_roles(rows)
    groups = (
        ("derf" in r, norms.derf),
        (any(k.endswith("+muon") for k in r), norms.norm_optimizer),
        ("hybridnorm" in r, norms.hybridnorm),
        ("siamese" in r, norms.siamese),
        ("ngpt" in r, norms.ngpt),
        ("hc" in r or "mhc" in r, att.hyper),
        ("gated" in r, att.gated),
        ("olmo2" in r, att.olmo2),
        ("softcap" in r, att.gemma),
    )
    out: list[Claim] = []
    for present, check in groups:
        if present:
            out += check(rows, r)
    return out
