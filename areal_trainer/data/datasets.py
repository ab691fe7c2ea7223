"""Prompt datasets: the built-in arithmetic set, GSM8K from the Hugging Face hub
(``path=openai/gsm8k name=main``, splits ``train``/``test``), or a local jsonl/json/parquet/csv
file with the same fields (``question``, ``answer`` ending in ``#### n``).

Rows become samples ``{"messages", "question", "answer"}``; the reward compares the model's final
answer with ``answer``.
"""

from __future__ import annotations

import os

from ..config.schema import DatasetConfig
from ..errors import UserError
from . import arith

BOXED_SUFFIX = "\nPlease put your final answer within \\boxed{}."
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
BUILTIN_DEFAULT_ROWS = {"train": 50000, "test": 256}
GSM8K_IDS = ("openai/gsm8k", "gsm8k")
"""Hub ids of GSM8K; it has two configs, ``main`` (the usual one) and ``socratic``."""


def load_rows(cfg: DatasetConfig, key: str) -> list[dict]:
    """The raw rows of a dataset (at most ``cfg.max_rows``), each checked for its fields."""
    if cfg.path == "builtin:arith":
        n = cfg.max_rows or BUILTIN_DEFAULT_ROWS.get(cfg.split, 1000)
        try:
            return arith.generate(cfg.split, n)
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
    rows = _load_hf(cfg, key)
    if cfg.max_rows is not None:
        rows = rows[: cfg.max_rows]
    for i, row in enumerate(rows):
        for field in (cfg.question_key, cfg.answer_key):
            if field not in row or row[field] is None or str(row[field]).strip() == "":
                raise UserError(f"{key}: row {i} of {cfg.path!r} has no {field!r} field "
                                f"(fields: {', '.join(sorted(row))}). Set {key}.question_key / "
                                f"{key}.answer_key to the right column names, or fix the row.")
    return [{"question": str(r[cfg.question_key]), "answer": str(r[cfg.answer_key])} for r in rows]


def demonstration(sample: dict) -> str:
    """The target text of the supervised warm start: the row's demonstration if any, else its answer."""
    return sample.get("demonstration", sample["answer"])


def _load_hf(cfg: DatasetConfig, key: str) -> list[dict]:
    import datasets

    ext = os.path.splitext(cfg.path)[1].lower()
    try:
        if os.path.isfile(cfg.path):
            if ext not in _LOCAL_FORMATS:
                raise UserError(f"{key}.path: {cfg.path!r} has an unknown extension; use .jsonl, .json, .parquet or .csv.")
            ds = datasets.load_dataset(_LOCAL_FORMATS[ext], data_files=cfg.path, split="train")
        elif cfg.path.startswith((".", "/", "~")) and not os.path.exists(cfg.path):
            raise UserError(f"{key}.path: {cfg.path!r} does not exist.")
        else:
            if cfg.path.lower() in GSM8K_IDS and cfg.name is None:
                raise UserError(f"{key}.name: {cfg.path!r} needs a config name; set {key}.name=main "
                                "(or socratic for the Socratic-style solutions).")
            ds = datasets.load_dataset(cfg.path, cfg.name, split=cfg.split)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; report them all the same way
        raise UserError(f"{key}.path: cannot load {cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}): "
                        f"{type(e).__name__}: {str(e).splitlines()[0]}{_load_hint(cfg, key, e)}") from None
    return list(ds)


def _load_hint(cfg: DatasetConfig, key: str, err: Exception) -> str:
    """A suggestion for a failed hub load: the missing config name, or how to work offline."""
    msg = str(err)
    if "Config name is missing" in msg or "BuilderConfig" in msg:
        return f". Set {key}.name (for openai/gsm8k: {key}.name=main)."
    if "offline" in msg.lower() or "couldn't reach" in msg.lower() or isinstance(err, ConnectionError):
        return (f". The hub is unreachable or offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) and the "
                f"dataset is not cached: load it once with network access, or set {key}.path to a local "
                f".jsonl/.parquet file with {cfg.question_key!r} and {cfg.answer_key!r} fields.")
    return ""


def prompt_suffix(cfg: DatasetConfig) -> str:
    """The built-in task asks for ``#### n`` (taught by the warm start); other data for ``\\boxed{}``."""
    return "" if cfg.path == "builtin:arith" else BOXED_SUFFIX


def build_samples(cfg: DatasetConfig, tokenizer, key: str) -> list[dict]:
    """Rows as chat samples; questions longer than ``cfg.max_length`` tokens are dropped."""
    rows = load_rows(cfg, key)
    suffix = prompt_suffix(cfg)
    samples = []
    for row in rows:
        content = row["question"] + suffix
        if cfg.max_length is not None and len(tokenizer(content, add_special_tokens=False).input_ids) > cfg.max_length:
            continue
        samples.append({"messages": [{"role": "user", "content": content}], **row})
    if not samples:
        raise UserError(f"{key}: no usable rows in {cfg.path!r} (max_length={cfg.max_length} dropped them all?).")
    return samples
