"""How the policy is spread over the learner ranks: one rank, DDP or FSDP2.

Owns the wrapping (the HF model goes inside ``ResponseLogProbs``, the module that is trained; DDP
replicates it, FSDP2 ``fully_shard``s every decoder layer and then makes it the root), mixed
precision (parameters stay in their dtype — fp32 master weights — and compute runs in
``compute_dtype``: autocast for one rank and DDP, a ``MixedPrecisionPolicy`` with fp32 gradient
reduction under FSDP2),
activation checkpointing, the attention path of a bf16 model on a CPU (``attention.py``), the
gradient-sync switch for micro-batch accumulation, the small
collectives the trainer needs (sums and maxima of counts), and gathering full weights and optimizer
state on rank 0 for checkpoints and weight sync.

Under FSDP2 every forward and backward is a collective, so every rank must run the same number of
micro-batches; the trainer pads with empty (zero-mask) micro-batches to the global maximum, which
``max_int`` provides. Gathering full weights is collective too: every rank calls ``full_state``,
parameter by parameter, and only rank 0 receives and keeps the result.
"""

from __future__ import annotations

import contextlib

import torch

from dapo_async.learner.attention import LOW_PRECISION, attention_for
from dapo_async.learner.logprobs import ResponseLogProbs
from dapo_async.learner.lora import is_lora, merged_state_dict


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (the FSDP2 sharding units)."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


class Parallel:
    """The training view of the model on this rank."""

    def __init__(
        self,
        model: torch.nn.Module,
        rank: int = 0,
        world_size: int = 1,
        fsdp: bool = False,
        activation_checkpointing: bool = False,
        compute_dtype: torch.dtype | None = None,
        logprob_chunk_tokens: int = 1024,
    ):
        self.model = model
        # collectives of counts run where the model lives (NCCL needs CUDA tensors)
        self.device = next(model.parameters()).device
        param_dtype = next(model.parameters()).dtype
        if compute_dtype not in LOW_PRECISION:
            compute_dtype = param_dtype  # full precision: compute in the parameters' own dtype
        attention_for(model, compute_dtype)  # bf16 on a CPU: its own attention path
        self.rank = rank
        self.world_size = world_size
        self.fsdp = fsdp and world_size > 1
        if activation_checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise ValueError(
                    "learner.activation_checkpointing: the model has no gradient_checkpointing_enable"
                )
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            if getattr(model, "config", None) is not None:
                model.config.use_cache = False
        self.policy = ResponseLogProbs(model, logprob_chunk_tokens)
        # autocast where parameters and compute differ (FSDP2 casts through its policy instead)
        self.autocast_dtype = None
        if self.fsdp:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(
                param_dtype=compute_dtype if compute_dtype != param_dtype else None,
                reduce_dtype=torch.float32 if compute_dtype != param_dtype else None,
            )
            for layer in decoder_layers(model):
                fully_shard(layer, mp_policy=mp)
            fully_shard(self.policy, mp_policy=mp)
            self.train_model = self.policy
        else:
            if compute_dtype != param_dtype:
                self.autocast_dtype = compute_dtype
            if world_size > 1:
                from torch.nn.parallel import DistributedDataParallel

                ids = [self.device.index] if self.device.type == "cuda" else None
                self.train_model = DistributedDataParallel(self.policy, device_ids=ids)
            else:
                self.train_model = self.policy

    def autocast(self):
        """Context for a forward pass in the compute dtype."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # ------------------------------------------------------------------ gradient sync

    def grad_sync(self, enabled: bool):
        """Context for one micro-batch's backward: reduce gradients only when ``enabled``."""
        if self.fsdp:
            self.policy.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        if enabled or not hasattr(self.train_model, "no_sync"):
            return contextlib.nullcontext()
        return self.train_model.no_sync()

    # ------------------------------------------------------------------ small collectives

    def sum_floats(self, local: list[float]) -> list[float]:
        if self.world_size == 1:
            return local
        import torch.distributed as dist

        t = torch.tensor(local, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.cpu().tolist()

    def max_int(self, local: int) -> int:
        if self.world_size == 1:
            return local
        import torch.distributed as dist

        t = torch.tensor([local], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    # ------------------------------------------------------------------ full state on rank 0

    def full_shapes(self) -> list[tuple[str, torch.Size, torch.dtype]]:
        """Names, full shapes and dtypes of the weights (no communication)."""
        return [(k, t.shape, t.dtype) for k, t in self._state().items()]

    def _state(self) -> dict[str, torch.Tensor]:
        """The weights as the HF model names them (LoRA adapters merged in)."""
        if is_lora(self.model):
            return merged_state_dict(self.model)
        return self.model.state_dict()

    def iter_full_state(self):
        """Yield (name, full tensor) one tensor at a time; collective under FSDP2, so every rank
        must exhaust it. Only rank 0's tensors are meaningful (the others get None for sharded
        ones): each sharded tensor is *gathered to rank 0*, not all-gathered, so the other ranks
        neither receive nor hold a full copy. At most one gathered tensor is alive at a time
        (weight sync streams them into its buckets)."""
        from torch.distributed.tensor import DTensor, Shard

        for name, t in self.model.state_dict().items():
            if not isinstance(t, DTensor):
                yield name, t
            elif tuple(t.placements) == (Shard(0),):
                yield name, self._gather_rows_to_rank0(t)
            else:  # a layout FSDP2 does not make by default: let DTensor assemble it
                yield name, t.full_tensor()

    def _gather_rows_to_rank0(self, t):
        """The full tensor of a dim-0-sharded DTensor on rank 0 (None elsewhere). FSDP2 splits
        rows like ``torch.chunk``: rank r holds rows [r·c, (r+1)·c) of c = ⌈n / world⌉, the
        last ranks fewer or none; shards are padded to c rows for the gather."""
        import torch.distributed as dist

        local = t.to_local()
        rows = t.shape[0]
        c = -(-rows // self.world_size)
        padded = torch.zeros((c, *t.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]].copy_(local)
        parts = (
            [torch.empty_like(padded) for _ in range(self.world_size)] if self.rank == 0 else None
        )
        dist.gather(padded, parts, dst=0, group=t.device_mesh.get_group())
        return torch.cat(parts)[:rows] if self.rank == 0 else None

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Full (unsharded) weights on rank 0, None elsewhere. Collective under FSDP2."""
        if not self.fsdp:
            return self._state() if self.rank == 0 else None
        if self.rank == 0:
            return {name: full.detach().cpu() for name, full in self.iter_full_state()}
        for _ in self.iter_full_state():  # the other ranks take part in each gather
            pass
        return None

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """Optimizer state for a checkpoint (full on rank 0 under FSDP2; collective there)."""
        if not self.fsdp:
            return optimizer.state_dict() if self.rank == 0 else None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        state = get_optimizer_state_dict(
            self.model,
            optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
        return state if self.rank == 0 else None

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if not self.fsdp:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(
            self.model,
            optimizer,
            optim_state_dict=state,
            options=StateDictOptions(full_state_dict=True),
        )
