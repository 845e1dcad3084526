"""Published claims checked on a study's runs, each with n, an estimate, its 95% interval and a three-valued verdict
(``lnblocks.study.core.stats``, ``lnblocks.study.core.claims``; the rules and scales are in docs/study-claims.md):

- ``xiong``: Xiong et al. 2020, Pre-LN vs Post-LN (X1-X8), when the study has both;
- ``wortsman``: Wortsman et al. 2023, qk-layernorm, z-loss, LR sensitivity (W1-W4), when it has Pre-LN with and
  without qk-norm over an LR grid;
- ``placements``: the claim of each placement's own paper (D1, P1, R1, M1, Y1, Z1, S1), for the arms it has;
- ``frontier``: the 2025-26 papers (Derf, norm x optimizer, HybridNorm, SiameseNorm, nGPT, hyper-connections and
  mHC, gated attention, OLMo 2, Gemma's soft-capping; DF, NO, HN, SN, NG, HC, GA, OL, GM). A study that uses an
  option added for them (``frontier_arms.uses_frontier_options``: Muon, Derf, V-norm, per-sublayer placement,
  SiameseNorm, nGPT, hyper-connections, the output gate, soft-capping) is judged by these only: its Pre-LN and
  qk-norm arms are the baselines of those papers' comparisons, not a second Xiong or Wortsman study.

Every check reads the flat run rows (``summary.csv``) and the init gradient profiles (``init_profile.json``) only,
so a report's claims can be recomputed from those two files.
"""

from __future__ import annotations

from typing import Any

from lnblocks.study.core.claims import Claim
from lnblocks.study.lm.report.findings.frontier import frontier_claims
from lnblocks.study.lm.report.findings.frontier_arms import uses_frontier_options
from lnblocks.study.lm.report.findings.placements import placement_claims
from lnblocks.study.lm.report.findings.wortsman import wortsman_claims
from lnblocks.study.lm.report.findings.xiong import xiong_claims
from lnblocks.study.lm.report.init_profile import InitProfile

__all__ = ["frontier_claims", "placement_claims", "study_claims", "wortsman_claims", "xiong_claims"]


def study_claims(rows: list[dict[str, Any]], profiles: list[InitProfile]) -> list[Claim]:
    """Every claim the study's arms can test, in the order of docs/study-claims.md."""
    if uses_frontier_options(rows):
        return frontier_claims(rows)
    return [*xiong_claims(rows, profiles), *wortsman_claims(rows), *placement_claims(rows, profiles)]
