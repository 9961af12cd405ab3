"""The LoRA adapters of one engine: every loaded adapter on the host, at most
``max_loras`` of them resident on the model's device, stacked per layer and projection
group (S-LoRA's unified layout: slot ``s`` of every stack is one adapter, zero-padded to
``max_rank``), least recently used evicted back to host memory.

Each step the model runner hands over its rows' slots (``row_slots``); inside ``step``
the layers add the adapters' products (``inference.lora.layers``), and a decode step on
the one-call CPU decode stack adds them inside that call (``model.decode_adapters``). A
step whose rows all run the base model leaves every fast path as it is; CUDA graphs have
no adapter products, so a step with adapter rows runs there without them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from chatsite_kernels.cpu.stack_adapters import AdapterGroup, AdapterStep, StackAdapters
from inference.lora.adapter import LoraAdapter, LoraLoadError
from inference.lora.layers import AttentionLora, MlpLora
from inference.lora.stacks import GROUPS, Stack


class LoraManager:
    def __init__(self, model: nn.Module, max_loras: int = 4, max_rank: int = 16) -> None:
        if max_loras < 1 or max_rank < 1:
            raise ValueError("max_loras and max_rank must be at least 1")
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or not all(
            hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj") for layer in layers
        ):
            raise LoraLoadError(
                "LoRA adapters need a Llama-family model (q/k/v/o and gate/up/down projections)"
            )
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.model, self.max_loras, self.max_rank = model, max_loras, max_rank
        self._layers = list(layers)
        self._stacks: list[dict[str, Stack]] | None = None  # allocated with the first adapter
        for i, layer in enumerate(layers):
            layer.self_attn.lora, layer.mlp.lora = AttentionLora(self, i), MlpLora(self, i)
        self.scales = torch.zeros(max_loras, dtype=torch.float32, device=self.device)
        self.adapters: dict[str, LoraAdapter] = {}  # every loaded adapter, on the host
        self.resident: OrderedDict[str, int] = OrderedDict()  # name -> slot, least recent first
        self.active: torch.Tensor | None = None  # the step's row slots, while one runs
        self._stack_adapters: tuple[object, StackAdapters] | None = None  # (decode stack, its adapters)
        self._lock = threading.Lock()  # loads come from the caller's thread, steps from the engine's

    @property
    def stacks(self) -> list[dict[str, Stack]]:
        """Per layer, each group's stack (allocated on first use: an engine that serves no
        adapter holds none)."""
        if self._stacks is None:
            stacks = []
            for layer in self._layers:
                modules = {**{n: getattr(layer.self_attn, n) for n in GROUPS["qkv"] + GROUPS["o"]},
                           **{n: getattr(layer.mlp, n) for n in GROUPS["gate_up"] + GROUPS["down"]}}  # fmt: skip
                stacks.append({group: self._stack(modules, names) for group, names in GROUPS.items()})
            self._stacks = stacks
        return self._stacks

    def _stack(self, modules: dict[str, nn.Module], names: tuple[str, ...]) -> Stack:
        s, r = self.max_loras, self.max_rank
        zeros = lambda *shape: torch.zeros(*shape, dtype=self.dtype, device=self.device)  # noqa: E731
        return Stack(
            zeros(s, len(names) * r, modules[names[0]].in_features),
            [zeros(s, modules[n].out_features, r) for n in names],
        )

    # ---- adapters (any thread) ---------------------------------------------------------
    def add(self, adapter: LoraAdapter) -> None:
        """Serve ``adapter`` under its name (replacing one of that name); resident on first use."""
        if adapter.rank > self.max_rank:
            raise LoraLoadError(
                f"{adapter.path}: rank {adapter.rank} is above ENGINE_MAX_LORA_RANK ({self.max_rank})"
            )
        for (layer, proj), (a, b) in adapter.weights.items():
            group = next(g for g, names in GROUPS.items() if proj in names)
            if layer >= len(self.stacks):
                raise LoraLoadError(f"{adapter.path}: layer {layer} is past the model's {len(self.stacks)}")
            i = GROUPS[group].index(proj)
            stack = self.stacks[layer][group]
            if a.shape[1] != stack.a.shape[2] or b.shape[0] != stack.b[i].shape[1]:
                raise LoraLoadError(
                    f"{adapter.path}: {proj} of layer {layer} does not fit this model's shapes"
                )
        with self._lock:
            self._evict(adapter.name)
            self.adapters[adapter.name] = adapter

    def remove(self, name: str) -> bool:
        with self._lock:
            self._evict(name)
            return self.adapters.pop(name, None) is not None

    def names(self) -> list[str]:
        return list(self.adapters)

    def get(self, name: str) -> LoraAdapter | None:
        return self.adapters.get(name)

    # ---- residency (engine thread) --------------------------------------------------------
    def _evict(self, name: str) -> None:
        slot = self.resident.pop(name, None)
        if slot is not None:
            self.scales[slot] = 0.0  # the slot's rows contribute nothing until it is refilled

    def _place(self, adapter: LoraAdapter, keep: set[str]) -> int:
        """The adapter's slot, copying it in (over the least recently used other) if needed."""
        slot = self.resident.get(adapter.name)
        if slot is not None:
            self.resident.move_to_end(adapter.name)
            return slot
        used = set(self.resident.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if not free:
            victim = next((n for n in self.resident if n not in keep), None)
            if victim is None:
                raise RuntimeError(f"a step holds more than {self.max_loras} adapters")
            free = [self.resident.pop(victim)]
        slot = free[0]
        r = self.max_rank
        for layer_stacks in self.stacks:
            for stack in layer_stacks.values():
                stack.a[slot].zero_()
                for b in stack.b:
                    b[slot].zero_()
        for (layer, proj), (a, b) in adapter.weights.items():
            group = next(g for g, names in GROUPS.items() if proj in names)
            i = GROUPS[group].index(proj)
            stack = self.stacks[layer][group]
            stack.a[slot, i * r : i * r + adapter.rank].copy_(a)
            stack.b[i][slot, :, : adapter.rank].copy_(b)
        self.scales[slot] = adapter.scaling
        self.resident[adapter.name] = slot
        return slot

    def row_slots(self, names: Sequence[str | None], counts: Sequence[int]) -> torch.Tensor | None:
        """Each row's slot for a step whose sequences run adapters ``names`` (None: the
        base) over ``counts`` rows each; None when no row runs an adapter."""
        if not any(names):
            return None
        with self._lock:
            wanted = {n for n in names if n}
            slot_of = {}
            for name in wanted:
                adapter = self.adapters.get(name)
                if adapter is None:
                    raise LoraLoadError(f"the adapter {name!r} was unloaded")
                slot_of[name] = self._place(adapter, wanted)
        rows = [slot_of[n] if n else -1 for n, c in zip(names, counts, strict=True) for _ in range(c)]
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    def _decode_stack_step(self, stack: object, slots: torch.Tensor) -> AdapterStep | None:
        """The step's adapters for the model's one-call decode stack, or None where the
        stacks are not fp32 on the CPU (that call reads only those)."""
        if stack is None or self.dtype != torch.float32 or self.device.type != "cpu":
            return None
        if self._stack_adapters is None or self._stack_adapters[0] is not stack:
            layers = [{g: AdapterGroup(s.a, tuple(s.b)) for g, s in groups.items()} for groups in self.stacks]
            self._stack_adapters = (stack, stack.adapters(layers, self.max_loras, self.max_rank))  # type: ignore[attr-defined]
        return self._stack_adapters[1].step(slots, self.scales, len(slots))

    @contextlib.contextmanager
    def step(self, slots: torch.Tensor | None) -> Iterator[None]:
        """The layers (or the decode stack's one call) add the adapters' products for
        ``slots`` while this is open."""
        if slots is None:
            yield
            return
        stack = self.model.__dict__.get("decode_stack")
        adapters = self._decode_stack_step(stack, slots)
        if stack is not None and adapters is None:
            self.model.decode_stack = None  # its one call reads fp32 CPU stacks only
        self.active = slots
        self.model.decode_adapters = adapters
        try:
            yield
        finally:
            self.active = None
            self.model.decode_adapters = None
            if stack is not None and adapters is None:
                self.model.decode_stack = stack
