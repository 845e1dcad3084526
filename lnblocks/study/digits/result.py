"""What one ``cnn_digits`` run measured: ``DigitsResult``, the ``result`` of its ``RunRecord``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lnblocks.study.core.records import RecordError, check_keys


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

    @classmethod
    def check_json(cls, record: Mapping[str, Any], source: str) -> None:
        """What ``SPEC`` cannot say, read by the report: the training settings of the config build, the
        SwitchableNorm weights are ``[{"mean"|"var": {"in"|"ln"|"bn": weight}}]``, the AGC ratio a number or null;
        ``RecordError`` naming ``source`` and the key otherwise."""
        from lnblocks.study.digits.config import DigitsSettings

        config, result = record["config"], record["result"]
        try:
            DigitsSettings.from_dict({k: config[k] for k in DigitsSettings.field_names() if k in config})
        except (TypeError, ValueError) as err:
            raise RecordError(source, "config", f"does not build the training settings ({err})") from None
        if "agc_grad_ratio" in result:
            check_keys(result, {"agc_grad_ratio": "num?"}, source, "result.")
        weights = result.get("switch_weights")
        if weights is None:
            return
        ok = isinstance(weights, list) and all(
            isinstance(layer, dict) and all(isinstance(layer.get(kind), dict) for kind in ("mean", "var"))
            for layer in weights
        )
        if not ok:
            raise RecordError(source, "result.switch_weights", 'must be a list of {"mean": {...}, "var": {...}}')
        for i, layer in enumerate(weights):
            for kind in ("mean", "var"):
                check_keys(layer[kind], dict.fromkeys(("in", "ln", "bn"), "num"), source,
                           f"result.switch_weights[{i}].{kind}.")  # fmt: skip
