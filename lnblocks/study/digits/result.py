"""What one ``cnn_digits`` run measured: ``DigitsResult``, the ``result`` of its ``RunRecord``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class DigitsResult:
    """The measurements of one run (see ``lnblocks.study.digits.train``): the learning rate used, epochs and SGD
    steps, the mean train-mode loss of the last epoch, and eval-mode accuracies in percent. ``switch_weights``
    (SwitchableNorm arm): per layer, the learned ``{"mean"|"var": {"in"|"ln"|"bn": weight}}`` at the end of
    training; ``agc_grad_ratio`` (NF arm): mean over steps of the blocks' gradient norm after AGC over before it
    (1.0: AGC never clipped). Both null for the other arms and absent from older records."""

    CONFIG: ClassVar[dict[str, Any]] = {"norm": (str,), "batch_size": (int,), "seed": (int,)}
    TIME: ClassVar[dict[str, Any]] = {"wall_s": "num", "cpu_s": "num"}
    SPEC: ClassVar[dict[str, Any]] = {
        "lr": "num", "epochs": (int,), "steps": (int,), "final_train_loss": "num?", "train_acc": "num",
        "test_acc": "num",
    }  # fmt: skip

    lr: float
    epochs: int
    steps: int
    final_train_loss: float | None
    train_acc: float
    test_acc: float
    switch_weights: list[dict[str, dict[str, float]]] | None = None
    agc_grad_ratio: float | None = None
