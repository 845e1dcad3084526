"""``lnblocks.process_exit``: a finished rank ends with its ``atexit`` handlers run and its output flushed, but without
interpreter finalization (where a gloo worker thread still releasing tensors aborts the process). Each check runs
in a subprocess, since the point is how a process ends; finalization is seen through an object whose ``__del__``
writes a marker file when the interpreter clears ``__main__``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from lnblocks.process_exit import end_distributed, exit_process, exit_rank

ROOT = Path(__file__).resolve().parents[1]
FINALIZER = """
import sys
class MarkOnFinalize:  # a global: its __del__ runs only when interpreter finalization clears __main__
    def __del__(self, path={marker!r}, open=open):
        with open(path, "w") as f:
            f.write("finalized")
mark = MarkOnFinalize()
"""


def run_python(code: str, marker: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    script = FINALIZER.format(marker=str(marker)) + code
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env={**full_env, **(env or {})}
    )


def test_exit_process_runs_atexit_flushes_and_skips_finalization(tmp_path: Path) -> None:
    code = """
import atexit
from lnblocks.process_exit import exit_process
atexit.register(lambda: print("atexit ran", end=""))
print("buffered,", end="")  # stdout is a pipe: block-buffered, lost by a bare os._exit
sys.stderr.write("err,")
exit_process(3)
"""
    proc = run_python(code, tmp_path / "marker")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered,atexit ran"
    assert proc.stderr == "err,"
    assert not (tmp_path / "marker").exists(), "exit_process let the interpreter finalize"


def test_without_it_the_interpreter_finalizes(tmp_path: Path) -> None:
    """The marker's control: the same process ending normally does finalize (so the check above can fail)."""
    proc = run_python("sys.exit(3)\n", tmp_path / "marker")
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / "marker").read_text() == "finalized"


@pytest.mark.parametrize("end", [exit_process, exit_rank])
@pytest.mark.parametrize("bad", [-1, 256, True, "0", 1.5, None])
def test_exit_process_refuses_what_is_not_an_exit_status(bad: object, end) -> None:
    with pytest.raises(ValueError, match=r"code must be an exit status, an int in \[0, 255\]"):
        end(bad)


@pytest.mark.parametrize("launched", [False, True])
@pytest.mark.parametrize("fails", [False, True])
def test_the_lnblocks_command_ends_a_launched_rank_that_succeeded_without_finalizing(
    tmp_path: Path, launched: bool, fails: bool
) -> None:
    """``lnblocks`` (``cli.run``) keeps its exit status and output either way; only a rank that a launcher started
    (``RANK`` set) and that succeeded skips finalization. A failing rank exits the ordinary way, so torchrun, which
    stops the other ranks when one fails, does not cut off their one-line errors."""
    if fails:  # a real command's user error
        call = f"sys.argv = ['lnblocks', 'study', 'report', {str(tmp_path / 'no_such_study')!r}]"
    else:  # run()'s own policy for a status-0 main, without the seconds a real command takes
        call = "lnblocks.cli.main = lambda argv=None: print('done') or 0"
    code = f"import lnblocks.cli\n{call}\nlnblocks.cli.run()\n"
    proc = run_python(code, tmp_path / "marker", env={"RANK": "0"} if launched else None)
    if fails:
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("lnblocks: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    assert (tmp_path / "marker").exists() is not (launched and not fails)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_end_distributed_in_a_plain_process_destroys_the_group_and_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    end_distributed()  # no process group: nothing to do
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        end_distributed()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_console_script_is_the_entry_that_ends_ranks_so() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lnblocks": "lnblocks.cli:run"}  # main() returns a status; run() ends the process with it
