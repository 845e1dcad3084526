"""Entry point of the sharded-study tests: ``[torchrun ...] sharded_run.py CONFIG OUT OVERRIDES_JSON`` runs the
study with those ``--set`` overrides, without a report (what ``lnblocks study run`` does, minus the report's cost)."""

import json
import sys

from lnblocks.process_exit import exit_rank
from lnblocks.study import run_study

if __name__ == "__main__":
    config, out, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    exit_rank(run_study(config, out, show_progress=False, report=False, overrides=overrides))  # lnblocks.process_exit
