"""Prompt datasets: the built-in arithmetic set, GSM8K from the Hugging Face hub
(``path=openai/gsm8k name=main``, splits ``train``/``test``), or a local jsonl/json/parquet/csv
file with the same fields (``question``, ``answer`` ending in ``#### n``).

Rows become samples ``{"messages", "question", "answer"}``; the reward compares the model's final
answer with ``answer``. The messages are the config's ``system_prompt`` (if any) and a user message:
the question in ``prompt_template``, then ``prompt_suffix``. The defaults give the user message
``question + suffix`` alone, the prompt of every earlier version.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import UserError
from . import arith

BOXED_SUFFIX = "\nPlease put your final answer within \\boxed{}."
_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
BUILTIN_DEFAULT_ROWS = {"train": 50000, "test": 256}
GSM8K_IDS = ("openai/gsm8k", "gsm8k")
"""Hub ids of GSM8K; it has two configs, ``main`` (the usual one) and ``socratic``."""


def load_rows(cfg: Any, key: str) -> list[dict]:
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
    bad = [i for i, row in enumerate(rows) if _unusable(row, cfg)]
    if bad:
        raise UserError(_row_problem(cfg, key, rows, bad))
    return [{"question": str(r[cfg.question_key]), "answer": str(r[cfg.answer_key])} for r in rows]


def _unusable(row: dict, cfg: Any) -> list[str]:
    """The required fields of ``row`` that are missing (or null) or empty, each described."""
    out = []
    for field in (cfg.question_key, cfg.answer_key):
        if row.get(field) is None:
            out.append(f"no {field!r} field")
        elif str(row[field]).strip() == "":
            out.append(f"an empty {field!r} field")
    return out


def _row_problem(cfg: Any, key: str, rows: list[dict], bad: list[int]) -> str:
    """The first bad row, 1-based (its line number in a jsonl file), with the fields it has and those required."""
    i = bad[0]
    row = rows[i]
    where = f"row {i + 1}"
    if cfg.path.lower().endswith(".jsonl") and os.path.isfile(cfg.path):
        where = f"line {_jsonl_line(cfg.path, i)}"  # blank lines hold no row
    # A local file's rows all carry every column of the file; those this row lacks are null.
    present = ", ".join(repr(k) for k, v in row.items() if v is not None) or "none"
    others = f" ({len(bad) - 1} more of the {len(rows)} rows also lack a usable field)" if len(bad) > 1 else ""
    return (f"{key}: {where} of {cfg.path!r} has {' and '.join(_unusable(row, cfg))}{others}. Fields in that "
            f"row: {present}; required: {cfg.question_key!r} ({key}.question_key) and {cfg.answer_key!r} "
            f"({key}.answer_key), both non-empty. Set {key}.question_key / {key}.answer_key to the right column "
            "names, or fix the rows.")


def _jsonl_line(path: str, index: int) -> int:
    """The 1-based line number of the ``index``-th (0-based) non-blank line of a jsonl file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        seen = -1
        for n, line in enumerate(f, 1):
            seen += bool(line.strip())
            if seen == index:
                return n
    return index + 1


def check_fits_batch(samples: list[dict], cfg: Any, key: str, world_size: int = 1) -> None:
    """A training set must hold one whole batch (with ``drop_last`` an epoch would otherwise have no step)."""
    n = len(samples)
    if not cfg.drop_last or n >= cfg.batch_size:
        return
    largest = n - n % world_size
    procs = f" (a multiple of the {world_size} processes)" if world_size > 1 else ""
    fix = f"Set {key}.batch_size={largest} or less{procs}, or use" if largest else "Use"
    dropped = f" left after max_length={cfg.max_length}" if cfg.max_length is not None else ""
    raise UserError(f"{key}.batch_size={cfg.batch_size} is more than the {n} usable rows{dropped} of {key}.path="
                    f"{cfg.path!r}: not one whole batch can be formed (drop_last=true), so there would be no training "
                    f"step. {fix} a dataset with more rows.")


def demonstration(sample: dict) -> str:
    """The target text of the supervised warm start: the row's demonstration if any, else its answer."""
    return sample.get("demonstration", sample["answer"])


def _load_hf(cfg: Any, key: str) -> list[dict]:
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


def _load_hint(cfg: Any, key: str, err: Exception) -> str:
    """A suggestion for a failed hub load: the missing config name, or how to work offline."""
    msg = str(err)
    if "Config name is missing" in msg or "BuilderConfig" in msg:
        return f". Set {key}.name (for openai/gsm8k: {key}.name=main)."
    if "offline" in msg.lower() or "couldn't reach" in msg.lower() or isinstance(err, ConnectionError):
        return (f". The hub is unreachable or offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) and the "
                f"dataset is not cached: load it once with network access, or set {key}.path to a local "
                f".jsonl/.parquet file with {cfg.question_key!r} and {cfg.answer_key!r} fields.")
    return ""


def prompt_suffix(cfg: Any) -> str:
    """``cfg.prompt_suffix``, by default the task's: the built-in task asks for ``#### n`` (taught by the warm
    start) with no instruction; other data for ``\\boxed{}``."""
    if cfg.prompt_suffix is not None:
        return cfg.prompt_suffix
    return "" if cfg.path == "builtin:arith" else BOXED_SUFFIX


def prompt_messages(cfg: Any, question: str) -> list[dict]:
    """The chat messages asking ``question``: the system prompt (if any), then the user message."""
    template = "{question}" if cfg.prompt_template is None else cfg.prompt_template
    user = {"role": "user", "content": template.format(question=question) + prompt_suffix(cfg)}
    return [{"role": "system", "content": cfg.system_prompt.format()}, user] if cfg.system_prompt else [user]


def check_system_role(cfg: Any, tokenizer, key: str) -> None:
    """A system prompt needs a chat template that renders a system message (some have no system role)."""
    if not cfg.system_prompt:
        return
    system = cfg.system_prompt.format()
    probe = [{"role": "system", "content": system}, {"role": "user", "content": "?"}]
    try:
        text = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - templates raise their own errors (e.g. "System role not supported")
        why = f"fails on a system message ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
    else:
        if system.strip() in text:
            return
        why = "leaves a system message out"
    name = getattr(tokenizer, "name_or_path", "") or ""
    of = f" of {name!r}" if name else ""
    none = "null" if key == "train_dataset" else "''"  # valid_dataset's null means train_dataset's
    raise UserError(f"{key}.system_prompt: the chat template of the tokenizer{of} {why}, so the system prompt "
                    f"{cfg.system_prompt!r} cannot reach the model. Put the instruction in {key}.prompt_template "
                    f"instead (e.g. {key}.prompt_template='<instruction> {{question}}') and set {key}.system_prompt="
                    f"{none}, or use a tokenizer whose chat template has a system role.")


def build_samples(cfg: Any, tokenizer, key: str) -> list[dict]:
    """Rows as chat samples; prompts whose user message is longer than ``cfg.max_length`` tokens are dropped."""
    check_system_role(cfg, tokenizer, key)
    rows = load_rows(cfg, key)
    samples = []
    for row in rows:
        messages = prompt_messages(cfg, row["question"])
        content = messages[-1]["content"]
        if cfg.max_length is not None and len(tokenizer(content, add_special_tokens=False).input_ids) > cfg.max_length:
            continue
        samples.append({"messages": messages, **row})
    if not samples:
        raise UserError(f"{key}: no usable rows in {cfg.path!r} (max_length={cfg.max_length} dropped them all?).")
    return samples
