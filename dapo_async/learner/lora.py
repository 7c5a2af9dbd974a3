"""LoRA through ``peft`` (``learner.lora_rank`` > 0): the policy's linear layers get low-rank
adapters, only the adapters train (AdamW state for them alone), and everything that leaves the
learner — weight sync, checkpoints, evaluation copies — carries *merged* weights under the HF
model's own names, so generators (transformers, vLLM) and `transformers` loaders need nothing
LoRA-specific.

Merging is out of place (``W + ΔW`` per layer, ``ΔW = B·A·scaling``): merging into the master
weights and unmerging again would let rounding drift accumulate in them every step. A checkpoint
holds the merged model plus ``lora_adapter.pt`` (the adapters alone); a resumed learner rebuilds
the base model from ``model.path`` and loads the adapters.
"""

from __future__ import annotations

import torch

ADAPTER_FILE = "lora_adapter.pt"
_PREFIX = "base_model.model."


def apply_lora(model: torch.nn.Module, lc) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lc.lora_rank,
        lora_alpha=lc.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(lc.lora_target_modules),
    )
    return get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    return type(model).__name__.startswith("Peft")


def _hf_name(name: str) -> str:
    return name.removeprefix(_PREFIX).replace(".base_layer.", ".")


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The HF model's state dict with every adapter merged in (new tensors; the master weights
    are not touched)."""
    from peft.tuners.lora import LoraLayer

    deltas = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and module.active_adapters:
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                deltas[_hf_name(name) + ".weight"] = delta
        out = {}
        for name, t in model.state_dict().items():
            if ".lora_" in name:
                continue
            hf = _hf_name(name)
            out[hf] = (t + deltas[hf].to(t.dtype)) if hf in deltas else t
    return out


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if ".lora_" in k}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing = [k for k in adapter_state(model) if k not in state]
    if missing:
        raise ValueError(f"{ADAPTER_FILE}: no weights for {missing[:3]} (another lora config?)")
    model.load_state_dict(state, strict=False)
