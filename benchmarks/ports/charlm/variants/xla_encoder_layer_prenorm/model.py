"""A tiny decoder-only transformer (GPT) over characters, in the style of nanoGPT, built from torch.nn's
own transformer layer.

Token + learned position embeddings, N_LAYER pre-LayerNorm blocks (causal multi-head self-attention, then
a GELU MLP), a final LayerNorm and an untied linear head without bias.

Port note: each block is torch.nn.TransformerEncoderLayer (the library's fused-QKV MultiheadAttention
with an out projection, linear1 -> activation -> linear2, norm1/norm2), set up to be the original's
block rather than the layer's defaults:
  - norm_first=True: pre-LayerNorm, x + attn(norm1(x)) then x + mlp(norm2(x)) (the default is post-LN);
  - activation="gelu": F.gelu, the exact erf GELU (the default is ReLU);
  - dropout=0.0 (the default is 0.1), batch_first=True, layer_norm_eps=1e-5, bias=True;
  - a causal mask from nn.Transformer.generate_square_subsequent_mask (-inf above the diagonal) passed
    with is_causal=True, so position t attends to 0..t; scores scaled by 1/sqrt(head_dim) as before.
MultiheadAttention initialises in_proj with xavier_uniform and zero biases; the weights are re-drawn
here as the original's nn.Linear layers draw them (kaiming_uniform(a=sqrt(5)), i.e. U(+-1/sqrt(fan_in)),
and U(+-1/sqrt(fan_in)) biases), so the initial network has the original's distribution. The fused
in_proj_weight (3*C, C) stacks q, k, v rows exactly as c_attn's output is split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 28
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    layer_norm_eps: float = 1e-5


def _linear_init_(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """nn.Linear.reset_parameters on an existing (out, in) weight and its bias."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        bound = 1.0 / math.sqrt(weight.size(1))
        nn.init.uniform_(bias, -bound, bound)


def make_block(cfg: GPTConfig) -> nn.TransformerEncoderLayer:
    block = nn.TransformerEncoderLayer(
        d_model=cfg.n_embd, nhead=cfg.n_head, dim_feedforward=4 * cfg.n_embd, dropout=0.0,
        activation="gelu", layer_norm_eps=cfg.layer_norm_eps, batch_first=True, norm_first=True,
    )
    with torch.no_grad():
        _linear_init_(block.self_attn.in_proj_weight, block.self_attn.in_proj_bias)
        _linear_init_(block.self_attn.out_proj.weight, block.self_attn.out_proj.bias)
        _linear_init_(block.linear1.weight, block.linear1.bias)
        _linear_init_(block.linear2.weight, block.linear2.bias)
    return block


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([make_block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(cfg.block_size),
                             persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.size()
        assert T <= self.cfg.block_size, f"sequence of {T} > block size {self.cfg.block_size}"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        mask = self.causal_mask[:T, :T]
        for block in self.h:
            x = block(x, src_mask=mask, is_causal=True)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             eps: float) -> torch.optim.AdamW:
        """nanoGPT's two groups: every 2-D parameter (the in/out projections, linear1/linear2, the head AND the
        embeddings) decays; biases and LayerNorm weights do not."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps)
