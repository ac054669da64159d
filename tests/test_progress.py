import io
import time

from cramlm.progress import LOG_FILE_INTERVAL_S, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bar, steps: int, step_seconds: float = 0.0) -> None:
    # the order the stages use: postfix without a redraw, then update (which redraws at its pace)
    for i in range(steps):
        bar.set_postfix(loss=f"{i:.3f}", refresh=False)
        bar.update(1)
        time.sleep(step_seconds)
    bar.close()


def test_log_file_gets_a_few_lines_not_one_per_step():
    out = io.StringIO()
    bar = progress_bar(total=200, desc="task", file=out)
    assert bar.mininterval == LOG_FILE_INTERVAL_S
    drive(bar, 200, step_seconds=0.005)  # 1 s: a terminal bar would redraw ~10 times
    redraws = out.getvalue().count("\r")
    assert 1 <= redraws <= 4, redraws  # start, (maybe one timed redraw), close
    assert "200/200" in out.getvalue()


def test_terminal_keeps_live_redraws():
    out = Terminal()
    bar = progress_bar(total=10, file=out)
    assert bar.mininterval < 1
    assert bar.dynamic_ncols


def test_disabled_bar_is_silent():
    out = io.StringIO()
    drive(progress_bar(total=10, enabled=False, file=out), 10)
    assert out.getvalue() == ""
