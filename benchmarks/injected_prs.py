"""Run the gate suite on every injected pull request (jobs/selftest/pull_requests.py) and on clean main.

Each PR is a change applied to the Megatron-LM main snapshot's source before its wheel is built
(Python 3.12, as main requires), submitted exactly as a PR's CI does: `parity submit --suite gate
--wheel … --wait --junit …`. Prints one row per build: the exit code, whether it is the expected one
(clean 0, every PR 1), and per failing check the causes the JUnit file names — the table in
docs/detection.md.

    PARITY_SERVICE_URL=… PARITY_TOKEN=… .venv/bin/python benchmarks/injected_prs.py [--only NAME …]
    .venv/bin/python benchmarks/injected_prs.py      # a service of its own (embedded Postgres, local executor)
    .venv/bin/python benchmarks/injected_prs.py --own-check --docs   # each PR through only its catching check,
                                                                      # the table written into docs/detection.md

Wheels are cached under $PARITY_CI_CACHE (default /var/tmp/parity-ci), keyed by the snapshot's hash.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.selftest.pull_requests import BY_NAME, JUDGED, SNAPSHOT, source_tree  # noqa: E402
from service.environments import interpreters  # noqa: E402

PARITY = [sys.executable, "-m", "service.cli.main"]
CACHE = Path(os.environ.get("PARITY_CI_CACHE", "/var/tmp/parity-ci"))


def wheel(name: str, python: str) -> Path:
    """The megatron-core wheel of the snapshot with PR `name` applied ("clean": none), built once."""
    out = CACHE / f"main-{hashlib.sha256(SNAPSHOT.read_bytes()).hexdigest()[:16]}" / name
    found = sorted(out.glob("megatron_core-*.whl"))
    if found:
        return found[0]
    tree = source_tree(out / "src", None if name == "clean" else BY_NAME[name])
    subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(tree)], check=True)
    return sorted(out.glob("megatron_core-*.whl"))[0]


def gate(
    url: str, token: str, whl: Path, name: str, work: Path, suite: str = "gate",
) -> tuple[int, dict[str, str], float]:
    """Submit a suite (the gate, or one check of it) on a wheel: (exit code, {failing check: message}, seconds)."""
    junit = work / f"{name}.xml"
    t0 = time.time()
    done = subprocess.run(
        [*PARITY, "submit", "--url", url, "--token", token, "--suite", suite, "--wheel", str(whl), "--wait",
         "--junit", str(junit), "--label", f"branch=pr-{name}", "--label", "base_branch=main", "--timeout", "3600"],
        capture_output=True, text=True, cwd=ROOT,
    )
    failing: dict[str, str] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failing[str(case.get("name"))] = (bad.get("message") or "")[:160]
    return done.returncode, failing, time.time() - t0


def own_service(work: Path) -> tuple[str, str, list[subprocess.Popen[bytes]]]:
    """Start an API + scheduler of our own (embedded Postgres under work); return url, token, processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PARITY_DATA_DIR": str(work / "data"), "PARITY_EXECUTOR": "local",
           "PARITY_SELFTEST_INTERVAL_HOURS": "0"}
    os.environ.update(env)
    if (CACHE / "pythons").is_dir():  # the shared 3.12 torch base (several GB), built once per machine
        (work / "data" / "runs" / "environments").mkdir(parents=True)
        (work / "data" / "runs" / "environments" / "pythons").symlink_to(CACHE / "pythons")
    subprocess.run([*PARITY, "db", "upgrade"], check=True, cwd=ROOT)
    token = subprocess.run([*PARITY, "token", "create", "--name", "prs", "--scope", "submit", "--scope", "admin"],
                           check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    procs = [subprocess.Popen([*PARITY, *args], cwd=ROOT, stdout=(work / f"{args[0]}.log").open("wb"),
                              stderr=subprocess.STDOUT) for args in (["serve", "--port", str(port)], ["scheduler"])]
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if subprocess.run(["curl", "-fsS", f"{url}/api/v1/livez"], capture_output=True).returncode == 0:
            break
        time.sleep(0.2)
    return url, token, procs


def stop_leftovers(work: Path) -> int:
    """SIGKILL what the service left running under `work` (its warm pool's workers, whose scheduler is gone:
    they would idle-poll for their backstop's 5 minutes, into the next benchmark's figures; submitit bypasses
    SIGTERM); how many."""
    stopped = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            pid = int(cmdline.parent.name)
            if pid != os.getpid() and str(work).encode() in cmdline.read_bytes():
                os.kill(pid, signal.SIGKILL)
                stopped += 1
        except (OSError, ValueError):  # gone meanwhile, or not ours to signal
            pass
    return stopped


DOCS = ROOT / "docs" / "detection.md"
BEGIN, END = "<!-- injected-prs:begin -->", "<!-- injected-prs:end -->"


def write_docs(rows: list[str]) -> None:
    """Replace the table between the markers in docs/detection.md's "Injected pull requests" section."""
    text = DOCS.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOCS.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[stop:])


SUITES = ("gate", "layouts")  # the suites a PR's catching check may be in (PullRequest.suite)


def apply_suites(url: str, token: str, work: Path) -> None:
    """The gate and the suites beside it, and for each check a one-check suite `<suite>-<check>` of it."""
    files = []
    for name in SUITES:
        suite = yaml.safe_load((ROOT / "suites" / f"{name}.yaml").read_text())
        files.append(ROOT / "suites" / f"{name}.yaml")
        for check in suite["checks"]:
            one = work / f"{name}-{check['name']}.yaml"
            one.write_text(yaml.safe_dump({**suite, "name": f"{name}-{check['name']}", "checks": [check]}))
            files.append(one)
    for path in files:
        subprocess.run([*PARITY, "suite", "apply", str(path), "--url", url, "--token", token], check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="run only these PRs (and clean main)")
    parser.add_argument("--python", default=interpreters.configured(None).get("3.12", "python3.12"),
                        help="the Python main's wheel is built with (default: the configured 3.12)")
    parser.add_argument("--own-check", action="store_true",
                        help="run each PR through only the gate check that catches it (clean main: the whole gate)")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/detection.md")
    args = parser.parse_args()
    prs = [pr for pr in JUDGED if not args.only or pr.name in args.only]  # not the UNJUDGEABLE ones
    work = Path(tempfile.mkdtemp(prefix="parity-prs-"))
    url, token = os.environ.get("PARITY_SERVICE_URL", ""), os.environ.get("PARITY_TOKEN", "")
    procs: list[subprocess.Popen[bytes]] = []
    if not url:
        url, token, procs = own_service(work)
    try:
        apply_suites(url, token, work)
        rows = ["| build | feature | suite | exit | expected | its cause named | seconds | failing checks: causes |",
                "|---|---|---|---|---|---|---|---|"]
        print("\n".join(rows), flush=True)
        ok = True
        for pr in [None, *prs]:
            name = "clean" if pr is None else pr.name
            suite = "gate" if pr is None else (f"{pr.suite}-{pr.check}" if args.own_check and pr.check else pr.suite)
            code, failing, seconds = gate(url, token, wheel(name, args.python), name, work, suite)
            expected = 0 if pr is None else 1
            named = "-" if pr is None else (
                "yes" if any(cause in msg for msg in failing.values() for cause in pr.causes) else "**no**")
            good = code == expected and named != "**no**"
            ok &= good
            causes = "; ".join(f"{check}: {msg}" for check, msg in failing.items()) or "-"
            row = (f"| {name} | {pr.feature if pr else '-'} | {suite} | {code} "
                   f"| {'yes' if code == expected else '**NO**'} | {named} | {seconds:.0f} | {causes} |")
            rows.append(row)
            print(row, flush=True)
        if args.docs:
            write_docs(rows)
        return 0 if ok else 1
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        stop_leftovers(work)


if __name__ == "__main__":
    raise SystemExit(main())
