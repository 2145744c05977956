"""An adapter that runs any transformers causal LM as a ``Backend``, on transformers' own ``DynamicCache``.

Every forward passes the model an explicit 4D additive mask ``[1, 1, T, C + T]`` and ``position_ids``, so a
tree of drafts is scored in one pass. Models that mix full and sliding-window layers (Gemma-3, ...) get one
mask per layer type, the window applied by position. The cache keeps every token in every layer (plain
``DynamicLayer``s), so rollback is a crop and commit is an index-select, whatever the window.

Whether trees really work is not assumed: a small probe at construction scores a tree in one pass and each
of its branches as a chain, and ``supports_tree`` says whether they agreed.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from paradecode.backends.base import ForwardOutput, causal_mask, check_aux_layers, tree_depths, tree_mask

DEFAULT_MAX_LENGTH = 4096  # cap on the context when the caller does not choose
MASKABLE_ATTENTION = ("eager", "sdpa")  # implementations that honour an arbitrary 4D mask
PROBE_PARENTS = (-1, -1, 0, 1)  # two branches of two nodes, the roots sharing a position


class HFBackend:
    """A transformers ``PreTrainedModel`` (``AutoModelForCausalLM``) behind the ``Backend`` protocol."""

    def __init__(self, model: Any, max_length: int | None = None) -> None:
        config = model.config.get_text_config(decoder=True)
        attention = config._attn_implementation
        if attention not in MASKABLE_ATTENTION:
            raise ValueError(
                f"HFBackend needs an attention implementation that takes custom masks {MASKABLE_ATTENTION}, "
                f"the model uses {attention!r}; load it with attn_implementation='sdpa'"
            )
        if getattr(config, "use_bidirectional_attention", False) or not getattr(config, "is_causal", True):
            raise ValueError("HFBackend runs causal language models only")
        self.model = model.eval()
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_hidden_layers
        self.max_length = max_length or min(config.max_position_embeddings, DEFAULT_MAX_LENGTH)
        self._layer_types = self._read_layer_types(config)
        self._sliding_window = getattr(config, "sliding_window", None)
        self._device = next(model.parameters()).device
        self._mask_dtype = next(model.parameters()).dtype
        self.dtype = "fp32" if self._mask_dtype == torch.float32 else str(self._mask_dtype).removeprefix("torch.")
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed during transformers 5
        self.reset()
        self.supports_tree = self._tree_agrees_with_chains()

    @property
    def kernels(self) -> str:
        return f"transformers-{self.dtype}"

    @staticmethod
    def _read_layer_types(config: Any) -> list[str]:
        """Attention type of every layer: 'full_attention' or 'sliding_attention'."""
        if getattr(config, "layer_types", None) is not None:
            layer_types = list(config.layer_types)
        elif getattr(config, "attention_chunk_size", None) is not None:
            layer_types = ["chunked_attention"]
        elif getattr(config, "sliding_window", None) is not None:
            layer_types = ["sliding_attention"] * config.num_hidden_layers
        else:
            layer_types = ["full_attention"] * config.num_hidden_layers
        unknown = set(layer_types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"HFBackend cannot mask layers of type {sorted(unknown)}")
        return layer_types

    @property
    def cache_len(self) -> int:
        return len(self._positions)

    def reset(self) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache()  # no config: full layers everywhere, the masks carry any window
        self._positions = torch.zeros(0, dtype=torch.long)  # [cache_len] position of each cached token

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.cache_len:
            raise ValueError(f"cannot roll back to {length} tokens; the cache holds {self.cache_len}")
        self._cache.crop(length - self.cache_len)  # negative: how many tokens to drop
        self._positions = self._positions[:length]

    def commit(self, start: int, keep: Sequence[int]) -> None:
        keep = list(keep)
        if keep and (start + keep[-1] >= self.cache_len or keep[0] < 0):
            raise ValueError(f"commit keeps entries up to {start + keep[-1]}, the cache holds {self.cache_len}")
        if keep == list(range(len(keep))):
            self.rollback(start + len(keep))
            return
        kept = torch.cat((torch.arange(start), torch.tensor(keep) + start))  # [start + K] slots to keep
        for layer in self._cache.layers:
            if not layer.is_initialized:  # a layer that stores nothing (shared KV)
                continue
            index = kept.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, index)  # [1, Hkv, start + K, hd]
            layer.values = layer.values.index_select(-2, index)
        self._positions = self._positions[kept]

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor | None = None,  # [T] int64; None: cache_len .. cache_len+T-1
        mask: torch.Tensor | None = None,  # [T, cache_len+T] bool; None: causal
        *,
        return_hidden: bool = False,
        exit_layer: int | None = None,
        layers: Sequence[int] | None = None,
        logits: bool = True,  # transformers computes them anyway; they are dropped when not wanted
        aux_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        if exit_layer is not None or layers is not None:
            raise NotImplementedError("HFBackend always runs every layer; a subset of layers needs LlamaBackend")
        check_aux_layers(aux_layers, range(self.num_layers))
        t, start = token_ids.shape[0], self.cache_len
        if start + t > self.max_length:
            raise ValueError(f"{start + t} tokens do not fit the context (max_length {self.max_length})")
        if positions is None:
            positions = torch.arange(start, start + t)
        if mask is None:
            mask = causal_mask(start, t)
        elif mask.shape != (t, start + t):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(t, start + t)}")
        key_positions = torch.cat((self._positions, positions.cpu()))  # [C + T]
        out = self.model(
            input_ids=token_ids[None].to(self._device),
            position_ids=positions[None].to(self._device),
            attention_mask=self._model_masks(mask.cpu(), positions.cpu(), key_positions),
            use_cache=True,
            output_hidden_states=return_hidden or bool(aux_layers),
            **{self._cache_arg: self._cache},
        )
        self._positions = key_positions
        hidden = out.hidden_states[-1][0] if return_hidden else None  # [T, D] after the final norm
        aux = torch.cat([out.hidden_states[i][0] for i in aux_layers], -1).float() if aux_layers else None
        return ForwardOutput(logits=out.logits[0].float() if logits else None, hidden=hidden, aux=aux)

    def _model_masks(
        self, mask: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The model's ``attention_mask``: an additive ``[1, 1, T, C + T]`` mask, or a dict of them keyed by layer
        type when the model mixes types (the convention of transformers' hybrid models)."""
        masks = {}
        for layer_type in set(self._layer_types):
            allowed = mask  # [T, C + T] bool
            if layer_type == "sliding_attention":  # transformers' window: key_pos > query_pos - window
                allowed = allowed & (key_positions[None, :] > positions[:, None] - self._sliding_window)
            additive = torch.zeros(allowed.shape, dtype=self._mask_dtype)
            additive.masked_fill_(~allowed, torch.finfo(self._mask_dtype).min)
            masks[layer_type] = additive[None, None].to(self._device)
        return masks if len(masks) > 1 else masks.popitem()[1]

    def _tree_agrees_with_chains(self) -> bool:
        """Score a small tree in one pass and each branch as a chain; trees work when the logits agree."""
        generator = torch.Generator().manual_seed(0)
        prefix = torch.randint(self.vocab_size, (3,), generator=generator)  # [3]
        nodes = torch.randint(self.vocab_size, (len(PROBE_PARENTS),), generator=generator)  # [N]
        depths = torch.tensor(tree_depths(PROBE_PARENTS))  # [N]
        self.forward(prefix)
        tree = self.forward(nodes, len(prefix) - 1 + depths, tree_mask(PROBE_PARENTS, len(prefix))).logits
        tolerance = 1e-3 if self._mask_dtype == torch.float32 else 5e-2  # relative to the logits' scale
        agree = True
        for branch in ([0, 2], [1, 3]):
            self.rollback(len(prefix))
            chain = self.forward(nodes[branch]).logits  # [2, V]
            scale = chain.abs().max().clamp(min=1.0)
            agree = agree and bool(((chain - tree[branch]).abs().max() <= tolerance * scale).item())
        self.reset()
        return agree
