"""A full disk at the run's history files: metrics, samples and the plot. Each costs one line naming the
file, the reason and the free space, and nothing already written is lost (no half line is left)."""

import errno
import json
from types import SimpleNamespace

import pytest

from areal_trainer.errors import UserError
from areal_trainer.tracking import plot, space
from areal_trainer.tracking.logger import StatsLogger, read_metrics


def _cfg():
    return SimpleNamespace(stats_logger=SimpleNamespace(wandb=SimpleNamespace(mode="disabled")))


@pytest.fixture
def full_disk(monkeypatch):
    """Writes through ``space`` get half their bytes onto the disk, then ENOSPC (as a filling disk does)."""
    real_open = open

    class Filling:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def filling_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Filling(f) if "a" in mode else f

    monkeypatch.setattr(space, "open", filling_open, raising=False)


def test_a_real_full_device_is_named_with_the_free_space():
    with pytest.raises(space.AppendError) as e:
        space.append("/dev/full", ["x" * 2048 + "\n"])
    assert e.value.strerror.startswith("cannot append to /dev/full: OSError: [Errno 28] No space left on device. "
                                       "Free space there: ")
    assert "the write needed 0.002 MiB. What the file held before is kept." in e.value.strerror


def test_metrics_on_a_full_disk_stop_the_run_and_keep_every_whole_record(tmp_path, full_disk):
    log = StatsLogger(str(tmp_path), _cfg())
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    with pytest.raises(UserError) as e:
        log.log(2, {"reward": 0.75})
    assert str(e.value).startswith(f"cannot append to {path}: OSError: [Errno 28] No space left on device. Free "
                                   "space there: ")
    assert str(e.value).endswith("What the file held before is kept. Free some space and resume with "
                                 "recover.mode=auto.")
    assert read_metrics(str(path)) == [{"step": 1, "reward": 0.5}]
    assert path.read_text().endswith("}\n")  # no half record after it


def test_samples_on_a_full_disk_are_one_warning_and_the_run_goes_on(tmp_path, full_disk):
    log = StatsLogger(str(tmp_path), _cfg())
    with pytest.warns(UserWarning, match=r"samples\.jsonl: .*No space left.* The run goes on without writing "):
        log.log_samples(1, [{"prompt": "p", "completion": "c"}])
    with NoWarning():  # once is enough
        log.log_samples(2, [{"prompt": "p", "completion": "c"}])
    assert (tmp_path / "samples.jsonl").read_text() == ""


class NoWarning:
    def __enter__(self):
        import warnings

        self.catch = warnings.catch_warnings(record=True)
        self.seen = self.catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self.catch.__exit__(*exc)
        assert self.seen == []


def test_a_plot_on_a_full_disk_is_one_warning_and_leaves_no_file(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    from matplotlib.figure import Figure

    def filling_savefig(self, path, **kwargs):
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", filling_savefig)
    with pytest.warns(UserWarning, match=r"cannot write .*curves\.png: OSError: .*No space left.*Free space there: "):
        assert plot.plot_run(str(tmp_path), "t") is None
    assert not (tmp_path / "curves.png").exists()


def test_the_runs_record_on_a_full_disk_is_one_line_and_keeps_what_it_held(tmp_path, monkeypatch, full_disk):
    from areal_trainer.tracking import record

    d = tmp_path / record.SUBDIR
    d.mkdir()
    (d / "config.yaml").write_text("old: 1\n")
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(record, "open", full_open, raising=False)
    with pytest.raises(UserError, match=r"^cannot write the run's record .*config\.yaml: OSError: \[Errno 28\] No "
                                        r"space left on device\. Free space there: .* MiB; it needs "):
        record.write_start(str(tmp_path), {"new": 2}, [])
    assert (d / "config.yaml").read_text() == "old: 1\n" and sorted(p.name for p in d.iterdir()) == ["config.yaml"]
    with pytest.raises(UserError, match=r"resumes\.yaml: .*No space left.*Nothing was resumed yet"):
        record.append_resume(str(tmp_path), checkpoint="c", overrides=[], changes=[], skipped=[])
    assert (d / record.RESUMES).read_text() == ""


class _FullWandb:
    """A wandb run whose writes fail as on a full disk under its directory."""

    def __init__(self, directory):
        self.dir, self.logged, self.finished = str(directory), 0, []

    def log(self, *args, **kwargs):
        self.logged += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    def finish(self, **kwargs):
        self.finished.append(kwargs)


def test_wandb_on_a_full_disk_is_one_warning_and_the_run_keeps_its_metrics(tmp_path, capsys):
    log = StatsLogger(str(tmp_path), _cfg())
    run = log.wandb = _FullWandb(tmp_path / "wandb")
    (tmp_path / "wandb").mkdir()
    log.log(1, {"reward": 0.5})
    log.log(2, {"reward": 0.75})
    log.log_samples(2, [{"prompt": "p", "completion": "c"}])
    log.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"warning: wandb cannot write to {tmp_path / 'wandb'}: OSError: [Errno 28] No space left "
                             "on device. Free space there: ")
    assert err[0].endswith("The run goes on without wandb; metrics.jsonl keeps every step, and what wandb wrote so "
                           "far stays.")
    assert run.logged == 1 and run.finished == [{"exit_code": 1, "quiet": True}]  # asked once, then left
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


class _QuietWandb(_FullWandb):
    """A wandb run whose writer (another process) fails on a full disk without telling the run."""

    def log(self, *args, **kwargs):
        self.logged += 1


@pytest.mark.parametrize("full_after", [1, 3])
def test_wandb_whose_writer_fails_in_silence_on_a_full_disk_is_one_warning(tmp_path, capsys, monkeypatch, full_after):
    """The disk under wandb's directory fills after ``full_after`` of its calls (3: as wandb finishes its run)."""
    from areal_trainer.tracking import space

    log = StatsLogger(str(tmp_path), _cfg())
    run = log.wandb = _QuietWandb(tmp_path / "wandb")
    (tmp_path / "wandb").mkdir()
    monkeypatch.setattr(space, "is_full",
                        lambda path, below=4096: path == run.dir and run.logged + len(run.finished) >= full_after)
    log.log(1, {"reward": 0.5})
    log.log(2, {"reward": 0.75})
    log.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"warning: wandb cannot write to {run.dir}: OSError: [Errno 28] No space left on device ")
    assert err[0].endswith("metrics.jsonl keeps every step, and what wandb wrote so far stays.")
    if full_after == 1:  # seen after the first record: wandb is left at once
        assert run.logged == 1 and run.finished == [{"exit_code": 1, "quiet": True}]
    else:  # seen only after wandb finished: named, not finished twice
        assert run.logged == 2 and run.finished == [{}]
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_is_full_reads_the_free_space(tmp_path):
    from areal_trainer.tracking import space

    assert not space.is_full(str(tmp_path)) and space.is_full(str(tmp_path), below=2**62)
    assert not space.is_full(str(tmp_path / "absent"))
