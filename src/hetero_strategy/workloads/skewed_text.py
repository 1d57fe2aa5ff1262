"""A length-skewed text task whose step cost is its token count (for ``balance.sample_cost``).

Most sequences are short and a few are long, as in real corpora. The model packs a batch's
sequences end to end (no padding) and runs a token-wise residual MLP, then averages each
sequence: its cost is proportional to the batch's tokens, so a count-based split of a global
batch leaves whichever rank drew the long sequences behind. Plain PyTorch, made from a seed.

Example::

    data = SkewedTexts(1024)
    loader = DataLoader(data, batch_size=32, collate_fn=pack)
    tokens, segments, labels = next(iter(loader))
    logits = PackedTokenMLP()(tokens, segments, len(labels))   # (32, 2)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PackedTokenMLP", "SkewedTexts", "pack"]


class SkewedTexts(torch.utils.data.Dataset):
    """``n`` token sequences: lengths uniform in ``short``, or in ``long`` with ``long_fraction``.

    The label says whether most of a sequence's tokens lie in the lower half of the vocabulary.
    ``lengths`` (one int per sample) is what ``HeteroStrategy(sample_cost="lengths")`` reads.
    """

    def __init__(self, n: int, vocab: int = 512, short: tuple[int, int] = (8, 32),
                 long: tuple[int, int] = (160, 320), long_fraction: float = 0.15, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        is_long = torch.rand(n, generator=g) < long_fraction
        lengths = torch.where(is_long, torch.randint(long[0], long[1] + 1, (n,), generator=g),
                              torch.randint(short[0], short[1] + 1, (n,), generator=g))
        self.vocab = vocab
        self.lengths: list[int] = [int(n) for n in lengths]
        self.tokens = [torch.randint(0, vocab, (k,), generator=g) for k in self.lengths]
        self.labels = [int((t < vocab // 2).float().mean() > 0.5) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.tokens[i], self.labels[i]


def pack(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (T,), segment id of each token (T,), labels (b,)): sequences end to end."""
    tokens = torch.cat([t for t, _ in batch])
    segments = torch.repeat_interleave(torch.arange(len(batch)), torch.tensor([len(t) for t, _ in batch]))
    return tokens, segments, torch.tensor([y for _, y in batch])


class PackedTokenMLP(nn.Module):
    """Embedding, ``depth`` residual token-wise MLP blocks, per-sequence mean, linear classifier."""

    def __init__(self, vocab: int = 512, width: int = 128, depth: int = 2, classes: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor, segments: torch.Tensor, n: int) -> torch.Tensor:
        h = self.embed(tokens)  # (T, width)
        for block in self.blocks:
            h = h + block(h)
        pooled = torch.zeros(n, h.shape[1], dtype=h.dtype).index_add_(0, segments, h)
        counts = torch.bincount(segments, minlength=n).clamp(min=1).unsqueeze(1)
        return self.head(pooled / counts)  # (n, classes)
