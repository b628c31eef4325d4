"""Log serving: only files inside the run folder, never `../`, absolute paths or symlinks out."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from service.web.dashboard import logs
from service.web.dashboard.reproduce import local_command


def _log_url(seeded, path: str, **extra: str) -> str:
    query = "&".join([f"path={quote(path, safe='')}", *(f"{k}={v}" for k, v in extra.items())])
    return f"/runs/{seeded.errored}/phases/{seeded.errored_phase}/log?{query}"


def _err_log(seeded) -> str:
    return f"run-{seeded.errored}/train_and_save-attempt1/9201_0_log.err"


def test_a_phase_log_is_served(app_client, seeded):
    r = app_client.get(_log_url(seeded, _err_log(seeded)))
    assert r.status_code == 200 and "Traceback (most recent call last)" in r.text
    raw = app_client.get(_log_url(seeded, _err_log(seeded), raw="1"))
    assert raw.headers["content-type"].startswith("text/plain") and raw.text.startswith("[rank0] step 9")


def test_dot_dot_is_refused(app_client, seeded):
    for path in ("../../../etc/passwd", f"{_err_log(seeded)}/../../../../etc/passwd", "..", "../runs"):
        r = app_client.get(_log_url(seeded, path))
        assert r.status_code == 403, (path, r.status_code)


def test_absolute_paths_outside_are_refused(app_client, seeded):
    assert app_client.get(_log_url(seeded, "/etc/passwd")).status_code == 403


def test_absolute_path_inside_the_run_folder_is_served(app_client, seeded, run_folder):
    assert app_client.get(_log_url(seeded, str(run_folder / _err_log(seeded)))).status_code == 200


def test_symlink_escaping_the_run_folder_is_refused(app_client, seeded, run_folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a log")
    link = run_folder / f"run-{seeded.errored}" / "train_and_save-attempt1" / "escape.log"
    link.symlink_to(secret)
    r = app_client.get(_log_url(seeded, f"run-{seeded.errored}/train_and_save-attempt1/escape.log"))
    assert r.status_code == 403 and "not a log" not in r.text


def test_missing_or_foreign_files_are_404(app_client, seeded):
    assert app_client.get(_log_url(seeded, f"run-{seeded.errored}/train_and_save-attempt1/nope.err")).status_code == 404
    other = f"run-{seeded.regressed}/resume-attempt1/9102_0_log.err"  # inside the run folder, another run's
    assert app_client.get(_log_url(seeded, other)).status_code == 404
    wrong_run = f"/runs/{seeded.good}/phases/{seeded.errored_phase}/log?path={quote(_err_log(seeded))}"
    assert app_client.get(wrong_run).status_code == 404


def test_failure_window_prefers_the_last_traceback():
    lines = ["ok"] * 30 + ["Traceback (most recent call last):", '  File "x.py"', "KeyError: 'step'"] + ["tail"] * 3
    kind, window = logs.failure_window(lines)
    assert kind == "traceback" and window[0].number == 23 and [w.number for w in window if w.mark] == [31, 33]
    kind, window = logs.failure_window(["a"] * 100)
    assert kind == "tail" and len(window) == 40 and window[-1].number == 100


def test_read_tail_drops_the_partial_first_line(tmp_path: Path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    lines, cut = logs.read_tail(path, max_bytes=100)
    assert cut and lines[-1] == "line 999" and all(line.startswith("line ") for line in lines)


def test_local_command_quotes_and_repeats_workarounds():
    spec = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10, "sharding": "dp_reshardable",
            "seed": 1, "tolerance": "exact", "workarounds": ["realign-param-index", "restore-adam-step"]}
    assert local_command(spec, environment="mcore next") == (
        "parity run-local --environment 'mcore next' --config moe-fp32-router --dp 2 --steps 20 --save-step 10 "
        "--sharding dp_reshardable --seed 1 --tolerance exact --workaround realign-param-index "
        "--workaround restore-adam-step --isolation process --nodes 1 --tp 1 --pp 1 --ep 1 --device cpu"
    )


def test_only_listed_log_files_are_served(app_client, seeded, run_folder):
    phase_dir = run_folder / f"run-{seeded.errored}" / "train_and_save-attempt1"
    (phase_dir / "9201_0_result.pkl").write_bytes(b"\x80\x04secret pickle")
    (phase_dir / "notes.log").write_text("a log the phase does not list\n")
    pickle = app_client.get(_log_url(seeded, f"run-{seeded.errored}/train_and_save-attempt1/9201_0_result.pkl"))
    assert pickle.status_code == 403 and "secret pickle" not in pickle.text
    unlisted = app_client.get(_log_url(seeded, f"run-{seeded.errored}/train_and_save-attempt1/notes.log"))
    assert unlisted.status_code == 404 and "does not list" not in unlisted.text


def test_a_listed_log_swapped_for_a_symlink_is_refused(app_client, seeded, run_folder):
    """Even a link that stays inside the run folder: O_NOFOLLOW refuses the final symlink."""
    log = run_folder / f"run-{seeded.errored}" / "train_and_save-attempt1" / "9201_0_log.out"
    target = run_folder / f"run-{seeded.errored}" / "private.txt"
    target.write_text("not for the dashboard\n")
    saved = log.read_bytes()
    log.unlink()
    log.symlink_to(target)
    try:
        r = app_client.get(_log_url(seeded, f"run-{seeded.errored}/train_and_save-attempt1/9201_0_log.out"))
        assert r.status_code == 403 and "not for the dashboard" not in r.text
    finally:
        log.unlink()
        log.write_bytes(saved)


def test_reads_are_bounded(tmp_path: Path):
    path = tmp_path / "huge.log"
    with path.open("wb") as fh:
        fh.truncate(3 * logs.TAIL_BYTES)  # sparse: 3 MiB of zeros, cheap to make
        fh.seek(0, 2)
        fh.write(b"\nlast line\n")
    lines, cut = logs.read_tail(path)
    assert cut and lines[-1] == "last line" and sum(len(x) + 1 for x in lines) <= logs.TAIL_BYTES
    lines, cut = logs.read_tail(path, logs.TRIAGE_TAIL_BYTES)
    assert cut and sum(len(x) + 1 for x in lines) <= logs.TRIAGE_TAIL_BYTES
