"""The metrics file on resume: records after the checkpoint go, a line cut short by a kill is dropped."""

import json
from types import SimpleNamespace

from areal_trainer.tracking.logger import StatsLogger, read_metrics


def _cfg():
    return SimpleNamespace(stats_logger=SimpleNamespace(wandb=SimpleNamespace(mode="disabled")))


def test_resume_keeps_records_up_to_the_checkpoint_and_drops_a_cut_line(tmp_path):
    lines = [json.dumps({"step": s, "reward/task": s / 10}) for s in range(5)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 5, "rew')
    log = StatsLogger(str(tmp_path), _cfg(), resume_step=3)
    log.log(4, {"reward/task": 0.9})
    log.close()
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert records[-1]["reward/task"] == 0.9


def test_resume_after_a_cut_last_line_without_newline(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}))
    log = StatsLogger(str(tmp_path), _cfg(), resume_step=2)
    log.log(3, {})
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3]


def test_fresh_run_starts_an_empty_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 7}) + "\n")
    StatsLogger(str(tmp_path), _cfg())
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == []
