"""An error on one rank of a torchrun study (its data differ on that node, a bad environment variable there, an
out-of-memory on one GPU) ends the job at once with that rank's error printed. It used to wait in the executor's
closing barrier while rank 0 waited in the run's next collective, silently, until gloo's 30-minute timeout. Here a
bad ``LNBLOCKS_CORPUS_KEEP`` on rank 1 only: under torchrun (whose agent stops the other ranks once one exits with
an error) and as two plain processes (nothing stops rank 0 but its own collective failing), where rank 0 stops
with one line naming rank 1 and its error. Every launch has a timeout, so a regression fails instead of hanging.
Also: the CLI writes its error line in one write, so the lines of two ranks on a shared stderr never run into each
other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lnblocks.cli import main as cli_main
from tests.models.parallel_launch import free_port
from tests.study.study_helpers import child_env

TIMEOUT = 120  # a rank left waiting in a collective would stay there for gloo's 30 minutes
STUDY = """
name: one_rank_fails
data: {{source: text, files: [{text}], tokenizer: bytes, seq_len: 8, batch_size: 4, eval_batches: 1,
        cache_dir: {cache}}}
model: {{dim: 16, depth: 1}}
train: {{steps: 3}}
diagnostics: {{every: 0, init_grad_batches: 0}}
grid: {{train.seed: [0, 1]}}
"""
WRAPPER = """
import os, sys
if os.environ["RANK"] == "1":
    os.environ["LNBLOCKS_CORPUS_KEEP"] = "bad"  # this node's environment only
from lnblocks.cli import main
sys.exit(main(["study", "run", {study!r}, "--out", {out!r}]))
"""
RANK1 = "lnblocks: error: LNBLOCKS_CORPUS_KEEP (0: never remove corpora automatically) must be an int >= 0, got 'bad'"


def wrapper(tmp_path: Path) -> Path:
    text = tmp_path / "a.txt"
    text.write_text("".join(f"line {i}: some text to train on\n" for i in range(200)))
    (tmp_path / "s.yaml").write_text(STUDY.format(text=text, cache=tmp_path / "cache"))
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER.format(study=str(tmp_path / "s.yaml"), out=str(tmp_path / "out")))
    return script


def no_records(tmp_path: Path) -> bool:
    return not list((tmp_path / "out" / "runs").glob("*.json")) if (tmp_path / "out" / "runs").exists() else True


def test_an_error_on_rank_1_under_torchrun_ends_the_job_with_its_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(wrapper(tmp_path))]  # fmt: skip
    # its own session: a regression's ranks, left waiting, are killed with torchrun instead of outliving the test
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT)  # TimeoutExpired: a rank was left waiting
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and RANK1 in err.splitlines(), out[-2000:] + err[-4000:]
    assert no_records(tmp_path)


def test_the_other_ranks_stop_with_one_line_naming_the_rank_and_its_error(tmp_path: Path) -> None:
    """Two processes joined by the environment (``env://``, rank 0 holding the store), no torchrun agent."""
    port, script = free_port(), wrapper(tmp_path)
    procs = []
    for rank in (0, 1):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=TIMEOUT)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [[line for line in err.splitlines() if line.startswith("lnblocks: ")] for err in errs]
    assert lines[1] == [RANK1] and procs[1].returncode == 2, errs[1][-3000:]
    assert lines[0] == [
        "lnblocks: error: rank 1 of 2 stopped with an error, so this rank stops: " + RANK1.split("error: ", 1)[1]
    ], errs[0][-3000:]
    assert procs[0].returncode == 2 and no_records(tmp_path)


class Writes:
    """A stderr that records each ``write`` call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_the_cli_error_line_is_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert cli_main(["study", "run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert len(stderr.calls) == 1, stderr.calls
    assert stderr.calls[0].startswith("lnblocks: error: study config ") and stderr.calls[0].endswith("not found\n")
