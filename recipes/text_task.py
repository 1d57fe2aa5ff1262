"""BERT's data and model, shared by ``bert_lightning.py`` and ``bert_accelerate.py``.

Two data sets, one pipeline (tokenizer -> token ids -> ``DataCollatorWithPadding``):

- ``keywords`` (default, offline): short reviews the recipe writes itself from a fixed seed. Each
  is 6-30 filler words with some positive and some negative keywords mixed in; the label is
  whether positive keywords outnumber negative ones. A word-level tokenizer is built in memory.
- ``sst2``: GLUE SST-2 through ``datasets`` and the model's own tokenizer (needs the Hub once).
"""

from __future__ import annotations

import random
from typing import Any

import torch

POSITIVE = ("good", "great", "fine", "nice", "superb")
NEGATIVE = ("bad", "poor", "awful", "dull", "weak")
FILLER = tuple(f"w{i}" for i in range(60))
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
LR, WEIGHT_DECAY, MAX_LENGTH = 1e-3, 0.01, 128  # AdamW for the tiny model; both scripts' defaults


def keyword_reviews(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` (text, label) pairs; label 1 when positive keywords outnumber negative ones."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pos, neg = rng.sample(range(4), 2)  # never a tie
        words = [rng.choice(FILLER) for _ in range(rng.randint(6, 30))]
        for word in [rng.choice(POSITIVE) for _ in range(pos)] + [rng.choice(NEGATIVE) for _ in range(neg)]:
            words.insert(rng.randint(0, len(words)), word)
        out.append((" ".join(words), int(pos > neg)))
    return out


def keyword_tokenizer() -> Any:
    """A word-level fast tokenizer over the task's words, with BERT's special tokens (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(SPECIAL + POSITIVE + NEGATIVE + FILLER)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


class Encoded(torch.utils.data.Dataset):
    """Tokenized examples (``input_ids``, ``attention_mask``, ``labels``), unpadded: the collator pads."""

    def __init__(self, tokenizer: Any, texts: list[str], labels: list[int], max_length: int) -> None:
        enc = tokenizer(texts, truncation=True, max_length=max_length)
        self.rows = [{"input_ids": ids, "attention_mask": mask, "labels": label}
                     for ids, mask, label in zip(enc["input_ids"], enc["attention_mask"], labels)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def text_tokenizer(data: str = "keywords", model_name: str = "bert-base-uncased", data_dir: str | None = None) -> Any:
    """The tokenizer of ``data``: built in memory for "keywords", the Hub's ``model_name`` for "sst2"."""
    if data == "keywords":
        return keyword_tokenizer()
    if data == "sst2":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_name, cache_dir=data_dir)
    raise ValueError(f"data={data!r} is invalid: choose 'keywords' (offline) or 'sst2'")


def text_datasets(data: str, tokenizer: Any, *, max_length: int = MAX_LENGTH, data_dir: str | None = None,
                  n_train: int = 4000, n_test: int = 1000, seed: int = 0) -> tuple[Encoded, Encoded]:
    """(train, test) for ``data`` = "keywords" (written from ``seed``) or "sst2" (GLUE, via ``datasets``)."""
    if data == "keywords":
        train, test = keyword_reviews(n_train, seed), keyword_reviews(n_test, seed + 1)
        return (Encoded(tokenizer, [t for t, _ in train], [y for _, y in train], max_length),
                Encoded(tokenizer, [t for t, _ in test], [y for _, y in test], max_length))
    if data == "sst2":
        from datasets import load_dataset

        glue = load_dataset("glue", "sst2", cache_dir=data_dir)  # the test split has no labels
        return (Encoded(tokenizer, glue["train"]["sentence"], glue["train"]["label"], max_length),
                Encoded(tokenizer, glue["validation"]["sentence"], glue["validation"]["label"], max_length))
    raise ValueError(f"data={data!r} is invalid: choose 'keywords' (offline) or 'sst2'")


def collator(tokenizer: Any) -> Any:
    """Dynamic padding: each batch is padded to its own longest example."""
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer, return_tensors="pt")


def bert_classifier(model: str = "tiny", vocab_size: int = 0, num_labels: int = 2, seed: int = 0) -> torch.nn.Module:
    """``BertForSequenceClassification``: "tiny" (2 layers, hidden 64, random init, offline) or a
    pretrained name such as "bert-base-uncased" (downloaded from the Hub)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)  # the same initial weights on every rank
    if model == "tiny":
        config = BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=128, num_labels=num_labels)
        return BertForSequenceClassification(config)
    return BertForSequenceClassification.from_pretrained(model, num_labels=num_labels)


def forward_batch(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logits, labels) of a padded batch; the model computes its own cross-entropy."""
    out = model(**batch)
    return out.loss, out.logits, batch["labels"]
