"""A build installs and lists; it imports nothing it installed. Its first warm worker is its import check
(service/runs/import_check.py): a wheel whose Megatron-Core cannot be imported fails its environment and
its suite's runs with the import's error, and no phase of them runs; a good one records what the harness
detects in it, as the build's own check did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.db import session_scope
from service.core.settings import get_settings
from service.environments.build_steps import read_build_result
from service.environments.recipe import BuildFailed, build_environment
from service.environments.registry import IMPORT_CHECK, get_environment, request_build
from service.suites.definitions import SuiteCheck, apply_suite
from service.suites.runs import create_suite_run
from tests.plugins.scheduler_harness import GOOD, phases, run_row, service_env, start, stop, wait_for
from tests.plugins.wheels import write_wheel

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: real builds, a real warm suite

BOOM = "this build cannot be imported (test_import_check)"
# what a hostile build's own code makes its worker report: it runs in that worker before the report is
# written, so it can replace the writer (a real attack on the report, not a hand-written file)
LIE = ("import sys\n"
       "worker = sys.modules['jobs.launch.pool_worker']\n"
       "worker.import_report = lambda info, rank: {'ok': 'yes', 'torch': 'x' * 5000, 'capabilities': []}\n")
CHECK = {"config": "moe-fp32-router", "dp": 1, "steps": 4, "save_step": 2, "workarounds": GOOD}


def _unimportable(folder: Path, marker: Path | None = None) -> Path:
    touch = f"open({str(marker)!r}, 'w').close()\n" if marker else ""
    # a NUL in the error: Postgres refuses it in a text column, so it must never reach one
    return write_wheel(folder, "megatron-core", "0.0.2", {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": f"{touch}raise RuntimeError({BOOM + chr(0) + ' after a NUL'!r})\n"})


def _lying(folder: Path) -> Path:
    return write_wheel(folder, "megatron-core", "0.0.3", {"megatron/__init__.py": "", "megatron/core/__init__.py": LIE})


@pytest.mark.engine  # builds on the shared torch of this test's own environment
def test_a_build_installs_and_lists_but_imports_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "imported-by-the-build"
    folder = tmp_path / "build"
    doc = build_environment(str(folder), [str(_unimportable(tmp_path / "w", marker))])
    assert doc["import_check"] == "pending" and doc["megatron_core"] == "0.0.2", doc
    assert not marker.exists(), "the build imported the Megatron-Core it installed"
    assert read_build_result(folder)["import_check"] == "pending"
    # the bytecode is written while the venv is the build's to write (the workers' users cannot)
    site = next((folder / "venv" / "lib").glob("python3.*/site-packages"))
    assert list((site / "megatron" / "core" / "__pycache__").glob("__init__.*.pyc"))


@pytest.mark.engine
def test_a_build_without_megatron_core_fails_naming_it(tmp_path: Path) -> None:
    other = write_wheel(tmp_path / "w", "not-megatron", "1.0", {"not_megatron/__init__.py": ""})
    with pytest.raises(BuildFailed, match="installed no megatron-core distribution"):
        build_environment(str(tmp_path / "build"), [str(other)])


@pytest.mark.megatron
@pytest.mark.slow  # two real builds and a warm suite on each, ~1-2 min
def test_a_suites_first_worker_is_the_builds_import_check(
    committed_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("PARITY_RUN_FOLDER", str(runs))
    get_settings.cache_clear()
    settings = get_settings()
    wheels = {"broken": str(_unimportable(tmp_path / "w")), "lying": str(_lying(tmp_path / "w")),
              "good": "megatron-core==0.16.1"}
    with session_scope() as session:
        apply_suite(session, name="imports", checks=[SuiteCheck.model_validate({"name": "one", "spec": CHECK})])
    names, run_ids = {}, {}
    for key, line in wheels.items():
        with session_scope() as session:
            names[key] = request_build(session, requirements=[line], settings=settings)[0].name
        with session_scope() as session:
            suite_run, _ = create_suite_run(session, suite_name="imports", version=None, environment=names[key],
                                            labels={}, requester="t", settings=settings)
            run_ids[key] = int(suite_run.runs[0]["run_id"])
    scheduler = start(["scheduler"], service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_SUITE_WORKER_IDLE_S="3"),
                      tmp_path / "scheduler.log")
    try:
        wait_for(lambda: all(run_row(i).finished_at for i in run_ids.values()), 800, "the suites' checks",
                 alive=[scheduler])
    finally:
        stop(scheduler)
    with session_scope() as session:
        envs = {key: get_environment(session, name=name) for key, name in names.items()}
        for env in envs.values():
            session.expunge(env)

    broken, failed = envs["broken"], run_row(run_ids["broken"])
    assert broken.state == "failed" and broken.packages.get(IMPORT_CHECK) == "failed", broken.error_message
    message = broken.error_message or ""
    assert "importing torch and megatron.core failed" in message and BOOM in message, message
    assert "\x00" not in message and "after a NUL" in message, message
    # megatron.core that does not import is the build's answer: the check fails naming it (never "couldn't tell")
    assert failed.state == "failed" and failed.verdict == "fail", (failed.state, failed.error_message)
    assert failed.signatures == ["build-import-crash"] and BOOM in (failed.error_message or ""), failed.error_message
    assert not [p for p in phases(run_ids["broken"]) if p.job_id], "a phase ran on a build that cannot be imported"

    lying, refused = envs["lying"], run_row(run_ids["lying"])
    assert lying.state == "failed" and lying.packages.get(IMPORT_CHECK) == "failed", lying.error_message
    assert "malformed imported.rank0.json: field ok" in (lying.error_message or ""), lying.error_message
    assert refused.state == "error" and "malformed" in (refused.error_message or ""), refused.error_message
    assert not [p for p in phases(run_ids["lying"]) if p.job_id], "a phase ran on a build whose report was refused"

    good, passed = envs["good"], run_row(run_ids["good"])
    assert passed.verdict == "pass", passed.error_message
    assert all((p.job_name or "").startswith("pool:") for p in phases(run_ids["good"]))
    assert good.packages.get(IMPORT_CHECK) == "passed", good.packages
    assert good.packages["capabilities"]["megatron_core"] == "0.16.1", good.packages
