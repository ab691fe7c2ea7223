"""The run log's tee (``tracking/runlog.py``): lines are held until the run log starts, then appended as
they end; a line redrawn with carriage returns is logged in its last state; stdout's and stderr's
unfinished lines stay apart; ``note`` writes to the file only; nothing is written when it never starts."""

import sys

from areal_trainer.tracking import runlog


def test_lines_are_held_until_start_and_redraws_collapse(tmp_path, capsys):
    path = tmp_path / "__main__.log"
    with runlog.capture() as log:
        print("a warning before validation", file=sys.stderr)
        log.start(str(path))
        sys.stderr.write("\rbar 1/3")
        sys.stderr.write("\rbar 2/3")
        print("a line while the bar runs")  # the other stream: its own line
        sys.stderr.write("\r       \r")  # the bar cleared ...
        print("eval example", file=sys.stderr)  # ... for a message on its stream
        runlog.note("step 2/3: reward 0.5")
        for i in range(1000):
            sys.stderr.write(f"\rbar {i}")
        assert len(sys.stderr.pending) < 20  # a bar's line stays short however often it redraws
        sys.stderr.write("\rbar 3/3")  # never finished with a newline
        assert runlog.bytes_written(str(path)) == len(path.read_bytes())
    assert path.read_text().splitlines() == ["a warning before validation", "a line while the bar runs",
                                            "eval example", "step 2/3: reward 0.5", "bar 3/3"]
    out, err = capsys.readouterr()
    assert out == "a line while the bar runs\n"  # the console gets everything unchanged, notes excepted
    assert err.startswith("a warning before validation\n\rbar 1/3\rbar 2/3\r       \reval example\n\rbar 0\r")
    assert err.endswith("\rbar 999\rbar 3/3")


def test_a_run_log_that_never_starts_writes_nothing(tmp_path):
    path = tmp_path / "__main__.log"
    with runlog.capture() as log:
        print("Error: 1 configuration problem")
        log.start(None)  # e.g. the launcher of scheduler.type: its ranks write the file
        print("more")
        runlog.note("a step")
    assert not path.exists() and runlog.bytes_written(str(path)) == 0


def test_streams_are_restored_and_a_kept_tee_only_passes_through(tmp_path, capsys):
    before = sys.stdout
    with runlog.capture() as log:
        log.start(str(tmp_path / "a.log"))
        kept = sys.stdout  # as a logging handler created during the run holds it
    assert sys.stdout is before
    kept.write("after the run\n")
    assert capsys.readouterr().out == "after the run\n"
    assert (tmp_path / "a.log").read_text() == ""
