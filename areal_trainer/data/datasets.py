"""Prompt datasets in the shapes users have, as samples the rollout and the rewards read.

Sources: the built-in arithmetic set (``builtin:arith``), the built-in pictures (``builtin:squares``,
``data/pictures.py``), a Hugging Face hub dataset (``path``, ``name``, ``split``), or local files
(``data/files.py``: a file, a directory or a glob of ``.jsonl``/``.json``/``.parquet``/``.csv``). Image
prompts (TRL's vision layout) are checked and loaded by ``data/vision.py``.

Row shapes (TRL's dataset formats, and GSM8K's):

* **prompt as text**: a ``prompt`` column, or ``question`` (GSM8K); the user message is the text in
  ``prompt_template``, then ``prompt_suffix``, after ``system_prompt`` if any;
* **conversational**: ``prompt`` or ``messages`` is a list of ``{role, content}`` messages (a system
  message included), rendered as they are; ``system_prompt`` is added only when they have none.

``prompt_key`` (default: the first of ``prompt``, ``messages``, ``question`` the rows have) and
``answer_key`` (default: ``answer`` when the rows have it, else no answer) name the columns. Every
other column is passed through: a sample is ``{"messages", "prompt", "answer", "fields", "row"}``,
where ``prompt`` is the row's own prompt (text or messages), ``answer`` its answer column (or None),
``fields`` every column but the prompt by name (the answer column too, unless it is named ``answer``:
with ``answer_key=solution`` a reward gets both ``answer`` and ``solution``), ``row`` where it came from.
Rewards and agents receive the row's own prompt and columns, never the rendered chat text. A column value
of the wrong kind (a list in a text column, a number as a prompt) is an error naming the column and the
row, never stringified.

Length. A prompt that leaves no room for one answer token within the row limit (``model/limits.py``:
``gconfig.max_tokens`` or the model's positions, the smaller), counted as the engine sees it (rendered by
the chat template), is dropped with a warning, or is an error with ``overlong_prompts: error``.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import UserError
from ..model.chat import prompt_lengths
from ..model.limits import RowLimit
from . import arith, pictures
from .files import Row, local_files, read_files
from .vision import ImageProblem, PromptImages, is_part_messages, row_images

BOXED_SUFFIX = "\nPlease put your final answer within \\boxed{}."
BUILTIN_DEFAULT_ROWS = {"train": 50000, "test": 256}
PICTURES = "builtin:squares"
"""The built-in picture task for image-text-to-text models (``data/pictures.py``)."""
GSM8K_IDS = ("openai/gsm8k", "gsm8k")
"""Hub ids of GSM8K; it has two configs, ``main`` (the usual one) and ``socratic``."""
PROMPT_COLUMNS = ("prompt", "messages", "question")
"""Where the prompt is looked for, in this order, when ``prompt_key`` is null."""
ROLES = ("system", "user", "assistant", "tool")


def load_rows(cfg: Any, key: str) -> list[Row]:
    """The raw rows of a dataset (at most ``cfg.max_rows``)."""
    if cfg.path == PICTURES:
        n = cfg.max_rows or BUILTIN_DEFAULT_ROWS.get(cfg.split, 1000)
        try:
            return [Row(r, f"row {i + 1} of {PICTURES}") for i, r in enumerate(pictures.generate(cfg.split, n))]
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
    if cfg.path == "builtin:arith":
        n = cfg.max_rows or BUILTIN_DEFAULT_ROWS.get(cfg.split, 1000)
        try:
            return [Row(r, f"row {i + 1} of builtin:arith") for i, r in enumerate(arith.generate(cfg.split, n))]
        except ValueError as e:
            raise UserError(f"{key}: {e}") from None
    files = local_files(cfg.path, f"{key}.path")
    rows = read_files(files, f"{key}.path") if files is not None else _load_hub(cfg, key)
    return rows[: cfg.max_rows] if cfg.max_rows is not None else rows


def _load_hub(cfg: Any, key: str) -> list[Row]:
    import datasets

    if cfg.path.lower() in GSM8K_IDS and cfg.name is None:
        raise UserError(f"{key}.name: {cfg.path!r} needs a config name; set {key}.name=main "
                        "(or socratic for the Socratic-style solutions).")
    try:
        ds = datasets.load_dataset(cfg.path, cfg.name, split=cfg.split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types; report them all the same way
        raise UserError(f"{key}.path: cannot load {cfg.path!r} (name={cfg.name!r}, split={cfg.split!r}): "
                        f"{type(e).__name__}: {str(e).splitlines()[0]}{_load_hint(key, e)}") from None
    return [Row(dict(r), f"row {i + 1} of {cfg.path!r}") for i, r in enumerate(ds)]


def _load_hint(key: str, err: Exception) -> str:
    """A suggestion for a failed hub load: the missing config name, or how to work offline."""
    msg = str(err)
    if "Config name is missing" in msg or "BuilderConfig" in msg:
        return f". Set {key}.name (for openai/gsm8k: {key}.name=main)."
    if "offline" in msg.lower() or "couldn't reach" in msg.lower() or isinstance(err, ConnectionError):
        return (f". The hub is unreachable or offline mode is on (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) and the "
                f"dataset is not cached: load it once with network access, or set {key}.path to a local "
                ".jsonl/.parquet file, a directory or a glob of them.")
    return ""


def columns_of(cfg: Any, rows: list[Row], key: str) -> tuple[str, str | None]:
    """``(prompt column, answer column or None)``: the configured ones, else found in the first row."""
    first = rows[0].columns
    prompt = cfg.prompt_key or next((c for c in PROMPT_COLUMNS if c in first), None)
    if prompt is None:
        raise UserError(f"{key}: {rows[0].where} has no prompt column: its columns are "
                        f"{', '.join(map(repr, first)) or 'none'}. Set {key}.prompt_key to the column that holds "
                        f"the prompt (text, or chat messages); by default one of {', '.join(PROMPT_COLUMNS)} is used.")
    answer = cfg.answer_key or ("answer" if "answer" in first else None)
    return prompt, answer


def _is_messages(value: Any) -> bool:
    """Chat messages: text contents, or (TRL's vision layout, ``data/vision.py``) lists of text and image parts."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and m.get("role") in ROLES
                                                           for m in value) and (
        all(isinstance(m.get("content"), str) for m in value) or is_part_messages(value))


def _row_problem(row: Row, column: str, key_name: str, what: str) -> UserError:
    present = ", ".join(repr(k) for k, v in row.columns.items() if v is not None) or "none"
    return UserError(f"{key_name.rsplit('.', 1)[0]}: {row.where}: {what}. Columns in that row: {present}. Set "
                     f"{key_name} to the right column, or fix the rows.")


def prompt_suffix(cfg: Any, column: str) -> str:
    """``cfg.prompt_suffix``, by default the task's: ``\\boxed{}`` for GSM8K-shaped rows (a ``question``
    column) other than the built-in task, whose warm start teaches ``#### n``; nothing for ``prompt`` rows."""
    if cfg.prompt_suffix is not None:
        return cfg.prompt_suffix
    return BOXED_SUFFIX if column == "question" and cfg.path != "builtin:arith" else ""


def prompt_messages(cfg: Any, prompt: Any, column: str = "question") -> list[dict]:
    """The chat messages of a row's prompt: a conversation as it is (the system prompt added when it has
    none); a text in the user message (``prompt_template``, then the suffix) after the system prompt."""
    system = [{"role": "system", "content": cfg.system_prompt.format()}] if cfg.system_prompt else []
    if isinstance(prompt, list):
        return ([] if any(m["role"] == "system" for m in prompt) else system) + [dict(m) for m in prompt]
    template = "{question}" if cfg.prompt_template is None else cfg.prompt_template
    return [*system, {"role": "user", "content": template.format(question=prompt) + prompt_suffix(cfg, column)}]


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


def to_sample(cfg: Any, row: Row, prompt_col: str, answer_col: str | None, key: str) -> dict:
    """One row as a sample (see the module docstring); a row whose prompt or answer is unusable is an error."""
    prompt = row.columns.get(prompt_col)
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
        raise _row_problem(row, prompt_col, f"{key}.prompt_key", f"no {prompt_col!r} value (or an empty one)")
    if not isinstance(prompt, str) and not _is_messages(prompt):
        raise _row_problem(row, prompt_col, f"{key}.prompt_key",
                           f"{prompt_col!r} holds a {type(prompt).__name__}, neither text nor chat messages (a list "
                           f"of {{role, content}} with roles {', '.join(ROLES)}; a content is text, or a list of "
                           "{\"type\": \"text\", \"text\": ...} and {\"type\": \"image\"} parts)")
    answer = None
    if answer_col is not None:
        answer = row.columns.get(answer_col)
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise _row_problem(row, answer_col, f"{key}.answer_key", f"no {answer_col!r} value (or an empty one)")
    # The answer column stays a column by its own name too (``answer_key=solution``: rewards and agents still
    # get ``solution``); only a column named ``answer`` is left out, being the sample's ``answer`` already.
    fields = {k: v for k, v in row.columns.items() if k != prompt_col and not (k == answer_col == "answer")}
    return {"messages": prompt_messages(cfg, prompt, prompt_col), "prompt": prompt, "answer": answer,
            "fields": fields, "row": row.where}


def field_names(samples: list[dict]) -> frozenset[str]:
    """The column names the samples' ``fields`` hold, over all rows (what rewards may take by name)."""
    return frozenset().union(*(s["fields"] for s in samples))


def demonstration(sample: dict) -> str:
    """The target text of the supervised warm start: the row's ``demonstration`` column if any, else its answer."""
    return sample["fields"].get("demonstration", sample["answer"])


def build_samples(cfg: Any, tokenizer, key: str, limit: RowLimit | None = None, vision=None,
                  model_path: str | None = None, rows: list[Row] | None = None) -> list[dict]:
    """Rows as samples; prompts longer than ``cfg.max_length`` tokens (the user message of a text prompt,
    the rendered conversation of a chat prompt) are dropped, and so are those with no room for an answer
    within ``limit`` (or they are an error: ``cfg.overlong_prompts``). ``vision``: the processor of an
    image-text-to-text model (``model/vision.py``'s ``VisionEncoder``; None for a text-only model, which
    image rows are an error for): every sample gets its images and the processor (``data/vision.py``).
    ``model_path``: ``actor.path``, for messages. ``rows``: given rows (an environment's,
    ``environment.type``) instead of those ``cfg.path`` names."""
    check_system_role(cfg, tokenizer, key)
    rows = load_rows(cfg, key) if rows is None else rows
    if not rows:
        raise UserError(f"{key}: {cfg.path!r} holds no rows.")
    prompt_col, answer_col = columns_of(cfg, rows, key)
    samples, problems, unreadable = [], [], []
    for row in rows:
        try:
            sample = to_sample(cfg, row, prompt_col, answer_col, key)
            images = row_images(row, sample["prompt"], key)
            if images and vision is None:
                model = "actor.path" if model_path is None else f"actor.path={model_path!r}"
                raise UserError(f"{key}: {row.where} has an image ({images[0].name!r}), but {model} is a text-only "
                                "model (no vision tower, no image processor). Use an image-text-to-text model (e.g. "
                                "actor.path=builtin:tiny-vlm, a LLaVA or Qwen2-VL checkpoint), or remove the image "
                                "rows.")
        except ImageProblem as e:
            (unreadable if cfg.bad_images == "skip" else problems).append(e)
            continue
        except UserError as e:
            problems.append(e)
            continue
        if vision is not None:
            sample["vision"] = PromptImages(images, vision, cfg.max_pixels)
        if cfg.max_length is not None and _prompt_tokens(tokenizer, sample) > cfg.max_length:
            continue
        samples.append(sample)
    if problems:
        more = f" ({len(problems) - 1} more of the {len(rows)} rows have problems too.)" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}")
    if unreadable:
        warnings.warn(f"{key}: left out {len(unreadable)} of {len(rows)} rows whose image is missing or unreadable "
                      f"({key}.bad_images=skip), e.g. {unreadable[0]}", UserWarning, stacklevel=2)
    if limit is not None:
        samples = _within(samples, cfg, tokenizer, key, limit)
    if not samples:
        raise UserError(f"{key}: no usable rows in {cfg.path!r} (max_length={cfg.max_length} or the row limit dropped "
                        "them all?).")
    return samples


def _within(samples: list[dict], cfg: Any, tokenizer, key: str, limit: RowLimit) -> list[dict]:
    """The samples whose prompt leaves room for one answer token within ``limit``; the others are dropped
    with one warning, or are an error (``cfg.overlong_prompts``)."""
    lengths = _lengths(tokenizer, samples)
    over = [i for i, n in enumerate(lengths) if n + 1 > limit.tokens]
    if not over:
        return samples
    for i in over:  # a prompt whose images alone push it past the limit: the image is the thing to fix
        vision = samples[i].get("vision")
        if vision is not None and vision.refs and vision.text_length(samples[i]["messages"]) + 1 <= limit.tokens:
            if (cfg.overlong_prompts or "error") == "error":
                raise UserError(
                    f"{key}: {samples[i]['row']}: its image {vision.names[0]!r} makes the prompt {lengths[i]} tokens "
                    f"(the images' tokens included), past the row limit of {limit.tokens} ({limit.source}). Set "
                    f"{key}.max_pixels to scale images down (Qwen-VL-style processors give fewer tokens for fewer "
                    f"pixels), {limit.fix}, or set {key}.overlong_prompts=drop to leave such rows out.")
    first = samples[over[0]]
    example = (f"{first['row']} has {lengths[over[0]]} prompt tokens (rendered by the chat template) and the row "
               f"limit is {limit.tokens} tokens of prompt plus answer ({limit.source})")
    if (cfg.overlong_prompts or "drop") == "error":
        more = f" ({len(over) - 1} more of the {len(samples)} prompts are too long too.)" if len(over) > 1 else ""
        raise UserError(f"{key}: {example}, so no answer fits.{more} Shorten or remove such prompts, {limit.fix}, "
                        f"or set {key}.overlong_prompts=drop to leave them out.")
    warnings.warn(f"{key}: dropped {len(over)} of {len(samples)} prompts with no room for an answer: e.g. {example}. "
                  f"Set {key}.overlong_prompts=error to stop instead.", UserWarning, stacklevel=3)
    dropped = set(over)
    return [s for i, s in enumerate(samples) if i not in dropped]


def _lengths(tokenizer, samples: list[dict]) -> list[int]:
    """Each sample's prompt tokens as the engine gets them (an image prompt's image tokens included)."""
    text = [i for i, s in enumerate(samples) if s.get("vision") is None]
    out = dict(zip(text, prompt_lengths(tokenizer, [samples[i]["messages"] for i in text])))
    out.update({i: s["vision"].length(s["messages"]) for i, s in enumerate(samples) if s.get("vision") is not None})
    return [out[i] for i in range(len(samples))]


def _prompt_tokens(tokenizer, sample: dict) -> int:
    if sample.get("vision") is not None:
        return sample["vision"].length(sample["messages"])
    if isinstance(sample["prompt"], list):
        text = tokenizer.apply_chat_template(sample["messages"], add_generation_prompt=True, tokenize=False)
    else:
        text = sample["messages"][-1]["content"]
    return len(tokenizer(text, add_special_tokens=False).input_ids)


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
