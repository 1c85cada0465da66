"""A character-level MLP language model (Bengio et al. 2003): the last `block_size` characters,
embedded and concatenated, predict the next one."""

import torch
from torch import nn
from torch.nn import functional as F


class CharMLP(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_embd: int, n_hidden: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.fc = nn.Linear(block_size * n_embd, n_hidden)
        self.head = nn.Linear(n_hidden, vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.wte(idx).flatten(1)
        logits = self.head(torch.tanh(self.fc(x)))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss
