"""What the model writes, for people to read: a few sampled trajectories per training step
(``samples.jsonl`` and a wandb table, ``stats_logger.samples_per_step``) and one held-out example
per evaluation on the console.

Records are built from a step's token-aligned, right-padded ``[B, S]`` batch tensors and the
tokenizer (see ``rollout/types.py`` for the keys). Which rows are shown depends only on the batch
layout: no randomness, so runs stay reproducible and the global RNG is left untouched. Everything
here is pure except :func:`append_samples`.

A row reads ``prompt | answer 0 | env 1 | answer 1 | ...``: the prompt is every token before the
first trained one (``loss_mask`` 1); after it, tokens the loss ignores (feedback, tool output) are
environment text, shown as ``⟦env: ...⟧`` in ``completion`` and as ``trained: false`` segments.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence

import torch

from . import space

ENV_OPEN, ENV_CLOSE = "⟦env: ", "⟧"
TABLE_COLUMNS = ("step", "prompt_id", "group", "index", "versions", "prompt", "completion", "reward", "advantage",
                 "answer_len", "num_turns", "truncated")
"""Columns of the wandb table, in order (``versions`` as text, e.g. ``"3,4"``)."""
_ROW_KEYS = ("input_ids", "attention_mask", "loss_mask", "versions", "rewards", "is_truncated", "num_turns")


def pick_rows(group_sizes: Sequence[int], n: int) -> list[tuple[int, int]]:
    """``(group, index)`` of up to ``n`` rows to show: the first answer of every prompt group in
    batch order, then every second answer, and so on (all rows when the batch has fewer than ``n``)."""
    picked: list[tuple[int, int]] = []
    for index in range(max(group_sizes, default=0)):
        for group, size in enumerate(group_sizes):
            if len(picked) == n:
                return picked
            if index < size:
                picked.append((group, index))
    return picked


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal values of a 0/1 ``mask`` as ``(start, end, trained)``, ``end`` exclusive."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or bool(mask[t]) != bool(mask[start]):
            runs.append((start, t, bool(mask[start])))
            start = t
    return runs


def split_row(tokenizer, ids: Sequence[int], loss_mask: Sequence[int]) -> tuple[str, list[dict]]:
    """The prompt text and the completion's segments ``{"text", "trained"}`` of one unpadded row.

    ``ids`` and ``loss_mask`` are ``[L]``. Special tokens are kept (the stop token, the chat
    template's turn markers): the text is what the model saw and wrote, not the reward's view.
    """
    runs = mask_runs(loss_mask)
    if runs and not runs[0][2]:  # the leading untrained run is the prompt
        prompt_end = runs.pop(0)[1]
    else:
        prompt_end = 0
    prompt = tokenizer.decode(list(ids[:prompt_end]), skip_special_tokens=False)
    segments = [{"text": tokenizer.decode(list(ids[s:e]), skip_special_tokens=False), "trained": trained}
                for s, e, trained in runs]
    return prompt, segments


def render(segments: Sequence[Mapping]) -> str:
    """The completion as one string, environment segments wrapped in ``⟦env: ...⟧``."""
    return "".join(s["text"] if s["trained"] else f"{ENV_OPEN}{s['text']}{ENV_CLOSE}" for s in segments)


def mean_advantage(advantages: torch.Tensor, adv_mask: torch.Tensor) -> float | None:
    """Mean of one row's ``[S]`` advantages over its loss tokens (``adv_mask``, aligned with them);
    None when the loss ignores the whole row."""
    n = float(adv_mask.sum())
    return float((advantages * adv_mask).sum()) / n if n > 0 else None


def squeeze_images(text: str, image_token: str | None) -> str:
    """``text`` with every run of two or more ``image_token`` written once with its count (``<image>×16``): an
    image becomes hundreds of identical tokens, which say nothing to a reader but how many."""
    if not image_token:
        return text
    size = len(image_token)
    return re.sub(f"(?:{re.escape(image_token)}){{2,}}", lambda m: f"{image_token}×{len(m.group()) // size}", text)


def row_record(tokenizer, row: Mapping[str, torch.Tensor], advantage: float | None = None,
               images: Sequence[str] = (), image_token: str | None = None) -> dict:
    """One readable sample from one row of a trajectory batch.

    ``row`` holds ``[S]`` tensors (``input_ids``, ``attention_mask``, ``loss_mask``, optionally
    ``versions``) and 0-dim ones (``rewards``, ``is_truncated``, optionally ``num_turns``).
    ``versions`` lists the distinct policy versions of the trained tokens (two when a generation
    spanned a weight update); ``answer_len`` counts the trained tokens. ``images``: the row's images as the
    dataset names them (an image prompt; recorded as ``images``), whose tokens (``image_token``) the prompt
    shows as one placeholder and their count.
    """
    length = int(row["attention_mask"].sum())
    ids = row["input_ids"][:length].tolist()
    mask = [int(m) for m in row["loss_mask"][:length].tolist()]
    prompt, segments = split_row(tokenizer, ids, mask)
    prompt = squeeze_images(prompt, image_token)
    record: dict = {"images": list(images)} if images else {}
    if "versions" in row:
        v = row["versions"][:length]
        record["versions"] = sorted({int(x) for x in v[v >= 0].tolist()})
    turns = int(row["num_turns"]) if "num_turns" in row else sum(s["trained"] for s in segments)
    record.update(prompt=prompt, completion=render(segments), segments=segments, reward=float(row["rewards"]),
                  advantage=advantage, answer_len=sum(mask), num_turns=turns, truncated=bool(row["is_truncated"]))
    return record


def step_samples(tokenizer, data: Mapping[str, torch.Tensor], advantages: torch.Tensor, adv_mask: torch.Tensor,
                 group_sizes: Sequence[int], n: int, prompt_ids: Sequence[int | None] | None = None,
                 images: Sequence[Sequence[str]] = (), image_token: str | None = None) -> list[dict]:
    """Records of ``n`` rows of a training batch, chosen by :func:`pick_rows`.

    ``data`` is the step's ``[B, S]`` batch (groups concatenated, ``group_sizes`` rows each);
    ``advantages`` and ``adv_mask`` are the advantage's ``[B, S]`` next-token aligned tensors (any
    common alignment gives the same mean); ``prompt_ids`` the dataset row of each group; ``images`` each
    row's image names (empty: no row has images; see :func:`row_record`).
    """
    picked = pick_rows(group_sizes, n)
    if not picked:
        return []
    starts = [0, *itertools.accumulate(group_sizes)]  # the batch row of each group's first answer
    idx = torch.tensor([starts[g] + i for g, i in picked], device=data["input_ids"].device)
    rows = {k: data[k][idx].cpu() for k in _ROW_KEYS if k in data}
    adv, amask = advantages[idx].float().cpu(), adv_mask[idx].float().cpu()
    out = []
    for j, (g, i) in enumerate(picked):
        head = {"prompt_id": prompt_ids[g] if prompt_ids is not None else None, "group": g, "index": i}
        record = row_record(tokenizer, {k: v[j] for k, v in rows.items()}, mean_advantage(adv[j], amask[j]),
                            images[int(idx[j])] if images else (), image_token)
        out.append({**head, **record})
    return out


def table_rows(step: int, records: Sequence[Mapping]) -> list[list]:
    """The wandb table rows of one step's records, in :data:`TABLE_COLUMNS` order."""
    def cell(r: Mapping, col: str):
        if col == "step":
            return step
        if col == "versions":
            return ",".join(str(v) for v in r.get("versions", []))
        return r.get(col)

    return [[cell(r, c) for c in TABLE_COLUMNS] for r in records]


def append_samples(path: str, step: int, records: Sequence[Mapping]) -> None:
    """Append one JSON line per record, each starting with ``step``; nothing for no records. All or none of
    them (``space.append``: an ``AppendError`` leaves the file as it was)."""
    if not records:
        return
    space.append(path, [json.dumps({"step": step, **r}, ensure_ascii=False) + "\n" for r in records])


def _indented(label: str, text: str) -> str:
    pad = " " * (len(label) + 2)  # continuation lines line up under the first
    return f"  {label}" + text.rstrip("\n").replace("\n", "\n" + pad)


def eval_example(tokenizer, group: Mapping[str, torch.Tensor], step: int, correct: bool | None = None,
                 images: Sequence[str] = (), image_token: str | None = None) -> str:
    """Console text of the first sample of an evaluation ``group`` (``[G, L]`` rows, ``rewards``
    ``[G]``): prompt, completion and reward, with the verifier's verdict when there is one (``correct``, as
    ``eval/accuracy`` counts it; None: the run has no verifier, and no verdict is shown); its images' names."""
    r = row_record(tokenizer, {k: group[k][0] for k in _ROW_KEYS if k in group}, images=images,
                   image_token=image_token)
    verdict = "" if correct is None else " (correct)" if correct else " (wrong)"
    lines = [f"eval example at step {step}: reward {r['reward']:.3f}{verdict}"]
    lines += [_indented("images:     ", ", ".join(images))] if images else []
    return "\n".join([*lines, _indented("prompt:     ", r["prompt"]), _indented("completion: ", r["completion"])])
