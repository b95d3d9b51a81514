"""The authors' supervised evaluation protocols on a pretrained backbone: the linear probe
(``bayesncl evaluate --probe paper``) and fine-tuning (``bayesncl finetune``), one per dataset
family, as their configs choose them by folder (PKU-ML/non_neg and Cui-Peng-624/BayesNCL, the same
files in both):

* ``cifar``: ``scripts/linear/cifar/simclr.yaml`` and ``scripts/finetuning/cifar/simclr.yaml``:
  LARS (eta 0.02, clip_lr, bias and norm excluded), lr 0.4 × batch/256, weight decay 1e-4,
  momentum 0.9, batch 256, 10 warmup epochs from 3e-5 then cosine to 0, stepped per iteration;
  50 epochs (linear), 30 (fine-tuning);
* ``imagenet``: ``scripts/linear/imagenet-100/simclr.yaml`` and
  ``scripts/finetuning/imagenet-100/simclr.yaml``: SGD, lr 1.0 × batch/256, weight decay 0,
  momentum 0.9 (``solo/args/linear.py`` sets it for SGD when the YAML gives none), batch 256,
  ``MultiStepLR`` at epochs 60 and 80 (gamma 0.1, ``solo/methods/linear.py``); 50 epochs (linear),
  30 (fine-tuning). Their runs end before epoch 60, so the rate never decays: we keep the
  milestones as written, so a longer run (``--probe-epochs``, ``train.epochs``) decays as theirs would.

Both use one lr for backbone and head (``solo/methods/linear.py`` never reads the YAML's
``classifier_lr``). ``auto`` picks ``imagenet`` for ``data.name=imagefolder`` (the ImageNet-100
recipes' data) and ``cifar`` for every other dataset (CIFAR, Fashion-MNIST, ...: the behaviour
before the key existed).
"""

from __future__ import annotations

from dataclasses import dataclass

from bayesncl.config import ConfigError
from bayesncl.config.schema import PROTOCOL_CHOICES

#: The ``data.name`` values whose ``auto`` protocol is ``imagenet``.
IMAGENET_DATASETS: tuple[str, ...] = ("imagefolder",)


@dataclass(frozen=True)
class Protocol:
    """One protocol's optimiser and schedule. ``lr`` is per 256 images (× batch/256); ``schedule``:
    ``warmup_cosine`` (``warmup_epochs`` from ``warmup_start_lr``, per iteration) or ``step``
    (× ``gamma`` at each epoch of ``milestones``); ``source``: the authors' file."""

    name: str
    optimizer: str  # lars | sgd
    lr: float
    weight_decay: float
    momentum: float
    epochs: int
    batch_size: int
    schedule: str  # warmup_cosine | step
    source: str
    warmup_epochs: float = 0.0
    warmup_start_lr: float = 3e-5
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    lars_eta: float = 0.02
    clip_lr: bool = True

    def describe(self, epochs: int | None = None) -> str:
        """One line for results files, e.g. ``imagenet: SGD lr 1 x batch/256, momentum 0.9, ...``."""
        e = self.epochs if epochs is None else epochs
        opt = f"LARS (eta {self.lars_eta:g})" if self.optimizer == "lars" else "SGD"
        if self.schedule == "warmup_cosine":
            sched = f"warmup {min(self.warmup_epochs, e):g} epochs then cosine"
        else:
            sched = f"x{self.gamma:g} at epochs {', '.join(map(str, self.milestones))}"
        return (f"{self.name}: {opt} lr {self.lr:g} x batch/256, momentum {self.momentum:g}, weight decay "
                f"{self.weight_decay:g}, batch {self.batch_size}, {e} epochs, {sched}")


def _cifar(epochs: int, source: str) -> Protocol:
    return Protocol("cifar", "lars", lr=0.4, weight_decay=1e-4, momentum=0.9, epochs=epochs, batch_size=256,
                    schedule="warmup_cosine", source=source, warmup_epochs=10.0)  # fmt: skip


def _imagenet(epochs: int, source: str) -> Protocol:
    return Protocol("imagenet", "sgd", lr=1.0, weight_decay=0.0, momentum=0.9, epochs=epochs, batch_size=256,
                    schedule="step", source=source, milestones=(60, 80), gamma=0.1)  # fmt: skip


#: The linear-probe protocols by name.
LINEAR: dict[str, Protocol] = {
    "cifar": _cifar(50, "scripts/linear/cifar/simclr.yaml"),
    "imagenet": _imagenet(50, "scripts/linear/imagenet-100/simclr.yaml"),
}
#: The fine-tuning protocols by name.
FINETUNE: dict[str, Protocol] = {
    "cifar": _cifar(30, "scripts/finetuning/cifar/simclr.yaml"),
    "imagenet": _imagenet(30, "scripts/finetuning/imagenet-100/simclr.yaml"),
}


def protocol_name(choice: str, dataset: str) -> str:
    """``cifar`` or ``imagenet``: ``choice`` itself, or for ``auto`` the one of ``dataset`` (a
    ``data.name``). Raises ConfigError for a choice not in :data:`PROTOCOL_CHOICES`."""
    if choice not in PROTOCOL_CHOICES:
        raise ConfigError(f"protocol {choice!r}: expected one of {', '.join(PROTOCOL_CHOICES)}")
    if choice != "auto":
        return choice
    return "imagenet" if dataset in IMAGENET_DATASETS else "cifar"


def linear_protocol(choice: str, dataset: str) -> Protocol:
    """The linear-probe :class:`Protocol` for ``eval.probe_protocol=choice`` on ``dataset``."""
    return LINEAR[protocol_name(choice, dataset)]


def finetune_protocol(choice: str, dataset: str) -> Protocol:
    """The fine-tuning :class:`Protocol` for ``eval.finetune_protocol=choice`` on ``dataset``."""
    return FINETUNE[protocol_name(choice, dataset)]
