"""Text-to-image pipelines of the ML.ENERGY leaderboard rebuilt from diffusers configs, as :mod:`dippm_nas.stages`.

Each ``configs/mlenergy_t2i/<name>.json`` holds what a pipeline runs per batch, written from the public model card
(``config.json`` of the UNet, VAE and text encoders, the scheduler, the default resolution): its text encoder(s),
``unet_calls`` UNet calls (at twice the batch: classifier-free guidance) and one VAE decode. No weights are loaded:
every module is built on the meta device and given uninitialised CPU storage (``to_empty``), which the capture never
reads, so even a 2.6 B-parameter UNet captures in well under a GB of memory.

Needs ``diffusers`` and ``transformers`` (``pip install diffusers transformers``); nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dippm_nas import InputSpec, capture

CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "mlenergy_t2i"
#: The ML.ENERGY ``Model`` column of each config file's pipeline.
MODEL_OF = {p.stem: json.loads(p.read_text())["model"] for p in sorted(CONFIG_DIR.glob("*.json"))}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Component:
    """One module of a pipeline and how often it runs per batch of ``b`` images.

    Attributes:
        name: ``"text_encoder"``, ``"text_encoder_2"``, ... , ``"unet"`` (the denoiser: a UNet or, for SD 3, a
            transformer) or ``"vae_decode"``.
        calls: calls per batch.
        batch_factor: the module's batch is ``batch_factor * b`` (2 for a guided UNet).
    """

    name: str
    calls: int
    batch_factor: int


def load_config(name: str) -> dict[str, Any]:
    """The pipeline description ``configs/mlenergy_t2i/<name>.json``."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"no pipeline config {path}; choices: {sorted(MODEL_OF)}")
    return json.loads(path.read_text())


def components(cfg: dict[str, Any]) -> list[Component]:
    """The modules one batch runs, in order."""
    out = [Component("text_encoder" if i == 0 else f"text_encoder_{i + 1}", int(te["calls"]), 1)
           for i, te in enumerate(cfg["text_encoders"])]
    out.append(Component("unet", int(cfg["unet_calls"]), 2 if cfg.get("guidance", True) else 1))
    out.append(Component("vae_decode", 1, 1))
    return out


def _empty(build: Any) -> Any:
    """``build()`` on the meta device, then uninitialised CPU storage (never read by the capture)."""
    import torch

    with torch.device("meta"):
        m = build()
    return m.to_empty(device="cpu").eval()


def build_module(cfg: dict[str, Any], name: str) -> tuple[Any, Any]:
    """``(module, InputSpec)`` of one component at batch 1 (the caller replaces the batch size)."""
    import diffusers
    import torch
    import transformers
    from torch import nn

    dtype = cfg.get("dtype", "float16")
    if name.startswith("text_encoder"):
        i = 0 if name == "text_encoder" else int(name.rsplit("_", 1)[1]) - 1
        te = cfg["text_encoders"][i]
        cls = getattr(transformers, te["class"])
        conf = getattr(transformers, te.get("config_class", "CLIPTextConfig"))(**te["config"])
        enc = _empty(lambda: cls(conf))

        class TextEncoder(nn.Module):
            def __init__(self, m: nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
                return self.m(input_ids, return_dict=False)[0]

        seq = int(te.get("seq_len", te["config"].get("max_position_embeddings", 77)))
        return TextEncoder(enc), InputSpec(inputs={"input_ids": ((seq,), "int64")}, dtype=dtype)
    if name == "unet" and cfg["unet"]["class"] == "SD3Transformer2DModel":
        u = cfg["unet"]
        dit = _empty(lambda: diffusers.SD3Transformer2DModel(**u["config"]))

        class Transformer(nn.Module):
            def __init__(self, m: nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                        pooled_projections: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
                return self.m(hidden_states, encoder_hidden_states, pooled_projections, timestep.reshape(-1),
                              return_dict=False)[0]

        c = u["config"]
        lat = (int(c["in_channels"]), cfg["height"] // 8, cfg["width"] // 8)
        inputs = {"hidden_states": (lat, None),
                  "encoder_hidden_states": ((int(u["text_tokens"]), int(c["joint_attention_dim"])), None),
                  "pooled_projections": ((int(c["pooled_projection_dim"]),), None), "timestep": ((1,), None)}
        return Transformer(dit), InputSpec(inputs=inputs, dtype=dtype)
    if name == "unet":
        u = cfg["unet"]
        unet = _empty(lambda: getattr(diffusers, u["class"])(**u["config"]))
        lat = (int(u["config"].get("in_channels", 4)), cfg["height"] // 8, cfg["width"] // 8)
        ctx = int(u["config"]["cross_attention_dim"])
        xl = u["config"].get("addition_embed_type") == "text_time"

        class UNet(nn.Module):
            def __init__(self, m: nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, sample: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep: torch.Tensor,
                        text_embeds: torch.Tensor | None = None, time_ids: torch.Tensor | None = None) -> torch.Tensor:
                added = {"text_embeds": text_embeds, "time_ids": time_ids} if text_embeds is not None else None
                return self.m(sample, timestep.reshape(-1), encoder_hidden_states, added_cond_kwargs=added,
                              return_dict=False)[0]

        inputs: dict[str, Any] = {"sample": (lat, None), "encoder_hidden_states": ((77, ctx), None),
                                  "timestep": ((1,), None)}
        if xl:
            pooled = int(cfg["text_encoders"][-1]["config"]["projection_dim"])
            inputs.update({"text_embeds": ((pooled,), None), "time_ids": ((6,), None)})
        return UNet(unet), InputSpec(inputs=inputs, dtype=dtype)
    if name == "vae_decode":
        v = cfg["vae"]
        vae = _empty(lambda: getattr(diffusers, v["class"])(**v["config"]))

        class VaeDecode(nn.Module):
            def __init__(self, m: nn.Module) -> None:
                super().__init__()
                self.m = m

            def forward(self, latents: torch.Tensor) -> torch.Tensor:
                return self.m.decode(latents, return_dict=False)[0]

        lat = (int(v["config"].get("latent_channels", 4)), cfg["height"] // 8, cfg["width"] // 8)
        return VaeDecode(vae), InputSpec(inputs={"latents": (lat, None)}, dtype=v.get("dtype", dtype))
    raise SystemExit(f"unknown component {name!r}")


def capture_component(cfg: dict[str, Any], comp: Component, batch: int, *, cache: Any = True) -> Any:
    """The :class:`~dippm_nas.OperatorGraph` of one component at ``batch`` images (its own batch is
    ``comp.batch_factor * batch``), through the conversion cache: captured once per (model, batch)."""
    module, spec = build_module(cfg, comp.name)
    spec = dataclasses.replace(spec, batch_size=comp.batch_factor * batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(module, spec, cache=cache)
