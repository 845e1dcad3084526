"""Runs as Ray tasks (``lnblocks study run CONFIG --executor ray [--ray-address ADDR]``): one task per run, with the
resources the study's ``resources`` section asks for, on a Ray cluster or a local Ray instance.

Each task trains its run with ``core.executors.execute`` (the same function the local executors call: pinned
``train.threads``, flush-to-zero), so its record equals the local executor's apart from timing and host fields. The
record comes back to the driver as the task's return value and the runner writes it (no shared filesystem needed).
Ray reruns a task whose worker process or node died (``resources.max_retries``); a run that raised comes back as an
error outcome and is recorded as failed, never retried. The driver polls with ``ray.wait(timeout=...)``, so Ctrl-C
is seen at once: it cancels every task in flight (``force=True`` ends their processes) and re-raises.

Slurm and other clusters: start Ray on the allocation as Ray's documentation describes (``ray start --head`` on one
node, ``ray start --address=HEAD:6379`` on the others) and pass ``--ray-address HEAD:6379`` (or ``auto`` on a node of
the cluster). Every node needs lnblocks installed and the data at the same paths.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lnblocks._optional import require
from lnblocks.config import Config, check_float, check_int
from lnblocks.study.core.executors import Job, Outcome, execute

POLL_SECONDS = 1.0
TASK_PREFIX = "lnblocks:"  # Ray shows a running task's process as "ray::lnblocks:<run id>"


@dataclass(frozen=True, kw_only=True)
class ResourcesConfig(Config):
    """The ``resources`` section of a study: what one run asks of a Ray cluster (``--executor ray``).

    ``cpus_per_run`` (None: the run's ``train.threads``) and ``gpus_per_run`` (fractions share a GPU) are the Ray
    task's ``num_cpus`` / ``num_gpus``; ``max_retries``: how often Ray reruns a run whose worker process or node died
    (a run that raised is recorded as failed, not retried).
    """

    cpus_per_run: float | None = None
    gpus_per_run: float = 0.0
    max_retries: int = 3

    def __post_init__(self) -> None:
        self._set("cpus_per_run", check_float("cpus_per_run", self.cpus_per_run, lo=0, lo_open=True, allow_none=True))
        self._set("gpus_per_run", check_float("gpus_per_run", self.gpus_per_run, lo=0))
        self._set("max_retries", check_int("max_retries", self.max_retries, minimum=0))


def _train_remote(job: Job) -> Outcome:
    """The body of every Ray task: train ``job`` in this worker process (errors become an error outcome)."""
    return execute(job)


class RayExecutor:
    """Train jobs as Ray tasks; ``address`` None starts a local instance (``num_cpus``: its CPUs, default all) unless
    this process is already connected to one, which is then used and left running."""

    live_tracking = False  # curves are written by the driver from each record (tracking.replay)

    def __init__(
        self,
        resources: ResourcesConfig | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.resources = resources or ResourcesConfig()
        self.address = address
        self.num_cpus = num_cpus
        self.poll_seconds = poll_seconds

    def _connect(self, ray: Any) -> bool:
        """Connect to (or start) Ray; True if this call started the connection (and must end it)."""
        if ray.is_initialized():
            return False
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.address is None:
            options["num_cpus"] = self.num_cpus
        else:
            options["address"] = self.address
        ray.init(**options)
        return True

    def _task_options(self, job: Job) -> dict[str, Any]:
        r = self.resources
        return {
            "num_cpus": r.cpus_per_run if r.cpus_per_run is not None else job.run.threads,
            "num_gpus": r.gpus_per_run,
            "max_retries": r.max_retries,
            "retry_exceptions": False,
            "name": f"{TASK_PREFIX}{job.run_id}",
        }

    def _capacity(self, ray: Any, job: Job) -> int:
        """How many runs like ``job`` the cluster can train at once; ``ValueError`` if not even one (the task would
        wait forever)."""
        have = ray.cluster_resources()
        opts = self._task_options(job)
        fits = [math.floor(have.get("CPU", 0.0) / opts["num_cpus"] + 1e-9)] if opts["num_cpus"] > 0 else []
        if opts["num_gpus"] > 0:
            fits.append(math.floor(have.get("GPU", 0.0) / opts["num_gpus"] + 1e-9))
        capacity = min(fits) if fits else 1
        if capacity < 1:
            raise ValueError(
                f"a run asks the Ray cluster for {opts['num_cpus']:g} CPU(s) and {opts['num_gpus']:g} GPU(s) "
                f"(resources.cpus_per_run / gpus_per_run, train.threads), but the cluster has "
                f"{have.get('CPU', 0):g} CPU(s) and {have.get('GPU', 0):g} GPU(s)"
            )
        return capacity

    def map(self, jobs: Iterator[Job], on_result: Callable[[Job, Outcome], None]) -> None:
        ray = require("ray")
        started = self._connect(ray)
        remote = ray.remote(_train_remote)
        pending: dict[Any, Job] = {}
        try:
            exhausted, window = False, 1
            while True:
                while not exhausted and len(pending) < window:  # keep about two runs per slot in flight
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    window = 2 * self._capacity(ray, job)
                    pending[remote.options(**self._task_options(job)).remote(job)] = job
                if not pending:
                    return
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.poll_seconds)
                for ref in ready:
                    job = pending.pop(ref)
                    on_result(job, self._outcome(ray, ref))
        except BaseException:  # Ctrl-C or a failing callback: nothing keeps training behind our back
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            if started:
                ray.shutdown()

    def _outcome(self, ray: Any, ref: Any) -> Outcome:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # raised outside execute's guard (e.g. unpickling the job)
            return Outcome(error=str(err))
        except ray.exceptions.RayError as err:  # the worker or node died more often than max_retries allows
            lost = f"the Ray worker training it died ({type(err).__name__}) after {self.resources.max_retries} retries"
            return Outcome(error=f"{lost}: {err}\n{traceback.format_exc(limit=0)}", lost=True)
