"""Where this process sits in a ``torchrun`` job: ``DistContext`` (rank, world size, local rank), what a run's
checkpoints and its ``train`` are told (``core.tasks.RunContext.dist``). Imports nothing of the study."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in a ``torchrun`` job (world size 1: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1
