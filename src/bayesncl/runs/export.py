"""The end-of-training export, which loads elsewhere without bayesncl, and a run's config.

- ``encoder.safetensors``: ``safetensors.torch.load_file(path)`` → the model's full state dict;
  its metadata holds the resolved config as JSON (``safe_open(path, "pt").metadata()["config"]``).
- ``backbone_torchvision.pt`` (ResNet backbones): torchvision names without ``fc``. Load it with
  ``net = torchvision.models.resnet18(); net.fc = torch.nn.Identity();
  net.load_state_dict(torch.load(path, weights_only=True))`` (strict), or keep the fc and pass
  ``strict=False`` (the only missing keys are then ``fc.weight`` and ``fc.bias``). A CIFAR-stem or
  1-channel backbone first needs the same ``conv1`` (and, CIFAR stem, ``maxpool = Identity()``)
  as :func:`bayesncl.core.model.build_backbone` uses, else conv1's shape does not match.
"""

from __future__ import annotations

import os
from pathlib import Path

import torchvision

from bayesncl.config import Config, build_config, load_run_yaml
from bayesncl.core.model import ContrastiveModel
from bayesncl.runs.fileio import atomic_path
from bayesncl.runs.messages import RunDirError
from bayesncl.runs.safe_load import check_checkpoint_entries, load_checkpoint_file
from bayesncl.runs.state import atomic_save

ENCODER_FORMAT = "bayesncl-encoder-v1"


def export_encoder(model: ContrastiveModel, run_dir: Path, cfg: Config | None = None) -> None:
    """Write ``encoder.safetensors`` (backbone, projector, gating head) and, for ResNets, the backbone
    alone as a torchvision-loadable state dict ``backbone_torchvision.pt`` (no fc: see README).

    With ``cfg`` the safetensors metadata also holds the resolved config as JSON (key ``config``), so
    the file alone can be evaluated elsewhere (``bayesncl evaluate encoder.safetensors``)."""
    import json

    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": ENCODER_FORMAT}
    if cfg is not None:
        metadata["config"] = json.dumps(cfg.to_dict(), sort_keys=True)
    with atomic_path(run_dir / "encoder.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    if not isinstance(model.backbone, torchvision.models.ResNet):
        return  # small_cnn is not a torchvision model
    atomic_save(
        {k: v.detach().cpu() for k, v in model.backbone.state_dict().items()},
        run_dir / "backbone_torchvision.pt",
    )


def load_run_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """The resolved config of an existing run dir, ``overrides`` (``key=value``) on top, checked once
    (:func:`~bayesncl.config.build_config`): its ``config.yaml``, or the one inside its ``last.pt``
    where the YAML is missing (e.g. deleted by hand)."""
    if not (run_dir / "config.yaml").exists() and (run_dir / "last.pt").exists():
        ckpt = load_checkpoint_file(run_dir / "last.pt")
        if not isinstance(ckpt, dict):
            what = type(ckpt).__name__
            raise RunDirError(f"{run_dir / 'last.pt'} holds a {what}, not a bayesncl checkpoint")
        check_checkpoint_entries(ckpt, run_dir / "last.pt")
        return build_config(ckpt["config"], overrides, source=run_dir / "last.pt")
    return build_config(load_run_yaml(run_dir / "config.yaml"), overrides, source=run_dir / "config.yaml")


def resume_config(run_dir: Path, overrides: list[str]) -> Config:
    """``--resume``'s config: the run's own (:func:`load_run_config`), ``overrides`` on top (checked
    against the checkpoint's when the run dir is prepared). A killed ``--overwrite``'s previous run
    goes back first, rank 0 alone (under torchrun it holds the run dir's lock). RunDirError when the
    run dir holds neither config.yaml nor last.pt."""
    from bayesncl.runs.lock import settle_run_dir

    if os.environ.get("RANK", "0") == "0":
        settle_run_dir(run_dir)
    if not (run_dir / "config.yaml").exists() and not (run_dir / "last.pt").exists():
        raise RunDirError(f"--resume: no checkpoint {run_dir / 'last.pt'} to resume from")
    return load_run_config(run_dir, overrides)
