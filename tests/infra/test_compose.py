"""docker-compose.yml checked by reading it: no Docker engine needed."""

from __future__ import annotations

import argparse
import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.core.settings import Settings

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: real builds or many real runs

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
EXPECTED_SERVICES = {
    "postgres",
    "mariadb",
    "munge-key",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "api",
    "scheduler",
}
# Containers that run jobs or hand them to Slurm: each must see the run folder at the same path.
RUN_FOLDER_USERS = {"api", "scheduler", "slurmd"}
KNOWN_SUBCOMMANDS = {"serve", "scheduler", "db upgrade"}
# Only these containers may see the munge key (whoever has it can act as any Slurm user).
MUNGE_KEY_USERS = {"munge-key", "slurmdbd", "slurmctld", "slurmd", "scheduler"}
# Only these containers may see the database URL (and its password).
DATABASE_USERS = {"api", "scheduler"}
SECRET_NAME = re.compile(r"PASS|SECRET|TOKEN|KEY", re.IGNORECASE)
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def load_compose() -> dict[str, Any]:
    """The compose file as a dict (YAML anchors and merge keys resolved)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, whether written as a mapping or as KEY=VALUE items."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source for each short-syntax volume entry."""
    result = {}
    for entry in service.get("volumes") or []:
        source, target = entry.split(":")[:2]
        result[target] = source
    return result


def command_text(service: dict[str, Any]) -> str:
    """The command (and entrypoint) as one shell-ish string."""
    parts = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if isinstance(value, list):
            parts.append(" ".join(value))
        elif value:
            parts.append(str(value))
    return " ".join(parts)


def parity_subcommands(text: str) -> list[str]:
    """Subcommands invoked as `parity <sub>` (two words for the `db` group) in a command."""
    tokens = shlex.split(text.replace("&&", " ; ").replace(";", " ; "))
    found = []
    for i, token in enumerate(tokens):
        if token.rsplit("/", 1)[-1] == "parity" and i + 1 < len(tokens):
            sub = tokens[i + 1]
            if sub == "db" and i + 2 < len(tokens):
                sub = f"db {tokens[i + 2]}"
            found.append(sub)
    return found


def dockerfile_stages(path: Path) -> set[str]:
    """Names given with `FROM ... AS name` in a Dockerfile."""
    return set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", path.read_text(), flags=re.MULTILINE | re.IGNORECASE))


def default_secrets(value: str) -> list[str]:
    """`${NAME:-default}` / `${NAME-default}` references to a secret-looking variable in value."""
    return [m.group(0) for m in re.finditer(r"\$\{(\w+):?-[^}]*\}", value) if SECRET_NAME.search(m.group(1))]


def privilege_problems(root: Path) -> list[str]:
    """The image, entrypoint and slurm.conf it writes keep the service and the jobs off root."""
    problems = []
    dockerfile = (root / "docker" / "Dockerfile").read_text()
    entrypoint = (root / "docker" / "entrypoint.sh").read_text()
    if not re.search(r"^ENV PARITY_RUN_AS=(?!root\b)\w+", dockerfile, re.MULTILINE):
        problems.append("Dockerfile: no unprivileged PARITY_RUN_AS user for the app")
    if "setpriv" not in entrypoint or not re.search(r"^\s*drop_privileges \"\$@\"", entrypoint, re.MULTILINE):
        problems.append("entrypoint.sh: app commands are not run through drop_privileges")
    if not re.search(r"^SlurmUser=(?!root\b)\w+", entrypoint, re.MULTILINE):
        problems.append("entrypoint.sh: slurmctld/slurmdbd run as root (SlurmUser)")
    if not re.search(r"^DisableRootJobs=YES", entrypoint, re.MULTILINE):
        problems.append("entrypoint.sh: slurm.conf lets jobs run as root (DisableRootJobs)")
    return problems


def job_user_problems(services: dict[str, Any], root: Path) -> list[str]:
    """Builds and phases run as a job user the image creates, neither root nor the service's user."""
    problems = []
    dockerfile = (root / "docker" / "Dockerfile").read_text()
    run_as = re.search(r"^ENV PARITY_RUN_AS=(\S+)", dockerfile, re.MULTILINE)
    user = environment(services.get("scheduler") or {}).get("PARITY_JOB_USER", "")
    if not user:
        problems.append("scheduler: no PARITY_JOB_USER (jobs would run as the service's user)")
    elif user in ("root", "0") or (run_as and user == run_as.group(1)):
        problems.append(f"scheduler: PARITY_JOB_USER={user} is root or the service's own user")
    elif not re.search(rf"useradd\b[^\n]*\s{re.escape(user)}\s*(\\|$)", dockerfile, re.MULTILINE):
        problems.append(f"Dockerfile: creates no user {user} (PARITY_JOB_USER)")
    for name, svc in services.items():
        if name != "scheduler" and environment(svc).get("PARITY_JOB_USER"):
            problems.append(f"{name}: sets PARITY_JOB_USER but only the scheduler starts jobs")
    return problems


def exposure_problems(services: dict[str, Any], root: Path) -> list[str]:
    """The API listens on loopback by default, reads runs read-only, and the app is no database superuser."""
    problems = []
    api = services.get("api") or {}
    for entry in api.get("ports") or []:
        parts = str(entry).split(":")
        if len(parts) < 3 or not re.fullmatch(r"(127\.0\.0\.1|\$\{\w+:-127\.0\.0\.1\})", ":".join(parts[:-2])):
            problems.append(f"api: port {entry!r} is published on every address (default must be 127.0.0.1)")
    run_folder = environment(api).get("PARITY_RUN_FOLDER", "")
    for entry in api.get("volumes") or []:
        parts = str(entry).split(":")
        if len(parts) >= 2 and parts[1] == run_folder and "ro" not in parts[2:]:
            problems.append(f"api: the run folder {run_folder} is mounted read-write (the API only reads runs)")
    postgres = services.get("postgres") or {}
    superuser = environment(postgres).get("POSTGRES_USER", "postgres")
    for name, svc in services.items():
        url = environment(svc).get("PARITY_DATABASE_URL", "")
        user = re.match(r"^[\w+]+://([^:@/]+)", url)
        if user and user.group(1) == superuser:
            problems.append(f"{name}: connects to Postgres as the superuser {superuser!r}")
    init = [source for target, source in mounts(postgres).items() if target == "/docker-entrypoint-initdb.d"]
    scripts = "".join(f.read_text() for src in init for f in sorted((root / src).glob("*.sh"))) if init else ""
    owns_schema = "CREATE SCHEMA parity AUTHORIZATION parity" in scripts
    if not re.search(r"CREATE ROLE parity LOGIN .*NOSUPERUSER", scripts) or not owns_schema:
        problems.append("postgres: no init script creating the non-superuser app role that owns its schema")
    return problems


def compose_problems(compose: dict[str, Any], root: Path) -> list[str]:
    """Everything wrong with a compose dict, one readable line each (empty when it is fine)."""
    problems: list[str] = []
    services: dict[str, Any] = compose.get("services") or {}
    declared_volumes = set(compose.get("volumes") or {})
    settings_fields = set(Settings.model_fields)

    problems += [f"service {name!r} is missing" for name in sorted(EXPECTED_SERVICES - set(services))]
    for name, svc in services.items():
        if "image" not in svc and "build" not in svc:
            problems.append(f"{name}: neither image nor build")
        build = svc.get("build")
        if isinstance(build, dict):
            dockerfile = root / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                problems.append(f"{name}: Dockerfile {dockerfile} does not exist")
            elif build.get("target") and build["target"] not in dockerfile_stages(dockerfile):
                problems.append(f"{name}: build target {build['target']!r} is not a stage of {dockerfile}")
        for key in environment(svc):
            if key.startswith("PARITY_") and key.removeprefix("PARITY_").lower() not in settings_fields:
                problems.append(f"{name}: {key} is not a field of service.core.settings.Settings")
        for target, source in mounts(svc).items():
            if not source.startswith((".", "/", "~")) and source not in declared_volumes:
                problems.append(f"{name}: volume {source!r} (at {target}) is not declared under volumes:")
        depends = svc.get("depends_on") or {}
        if isinstance(depends, list):
            problems.append(f"{name}: depends_on without conditions (only waits for the start)")
            depends = {}
        for dep, spec in depends.items():
            condition = (spec or {}).get("condition", "service_started")
            if dep not in services:
                problems.append(f"{name}: depends on unknown service {dep!r}")
            elif condition not in CONDITIONS:
                problems.append(f"{name}: unknown depends_on condition {condition!r}")
            elif condition == "service_healthy" and "test" not in (services[dep].get("healthcheck") or {}):
                problems.append(f"{name}: waits for {dep!r} to be healthy but {dep!r} has no healthcheck")
            elif condition == "service_started" and "test" in (services[dep].get("healthcheck") or {}):
                problems.append(f"{name}: starts with {dep!r} without waiting for its healthcheck")
        for sub in parity_subcommands(command_text(svc)):
            if sub not in KNOWN_SUBCOMMANDS:
                problems.append(f"{name}: runs unknown subcommand `parity {sub}`")

        if "test" not in (svc.get("healthcheck") or {}):
            problems.append(f"{name}: no healthcheck")
        if str(svc.get("user", "")).split(":")[0] in ("root", "0"):
            problems.append(f"{name}: runs as root (user: {svc['user']})")
        for source in mounts(svc).values():
            if source == "munge-key" and name not in MUNGE_KEY_USERS:
                problems.append(f"{name}: mounts the munge key but only {sorted(MUNGE_KEY_USERS)} may")
        if "PARITY_DATABASE_URL" in environment(svc) and name not in DATABASE_USERS:
            problems.append(f"{name}: gets PARITY_DATABASE_URL but only {sorted(DATABASE_USERS)} need the database")
        for key, value in environment(svc).items():
            problems += [f"{name}: {key} has a default secret ({ref})" for ref in default_secrets(value)]
    problems += privilege_problems(root)
    problems += job_user_problems(services, root)
    problems += exposure_problems(services, root)

    run_folders: set[str] = {f for svc in services.values() if (f := environment(svc).get("PARITY_RUN_FOLDER"))}
    if len(run_folders) != 1:
        problems.append(f"PARITY_RUN_FOLDER must be one path everywhere, found {sorted(map(str, run_folders))}")
    else:
        (run_folder,) = run_folders
        sources: set[str] = set()
        for name in sorted(RUN_FOLDER_USERS & set(services)):
            mounted = mounts(services[name]).get(run_folder)
            if mounted is None:
                problems.append(f"{name}: the run folder {run_folder} is not mounted")
            else:
                sources.add(mounted)
        if len(sources) > 1:
            problems.append(f"the run folder comes from different volumes: {sorted(sources)}")
    return problems


# ----------------------------------------------------------------------------- the real file


def test_compose_file_has_no_problems() -> None:
    assert compose_problems(load_compose(), REPO_ROOT) == []


def test_api_port_is_published_and_matches_the_setting() -> None:
    api = load_compose()["services"]["api"]
    port = environment(api)["PARITY_API_PORT"]
    assert any(str(entry).split(":")[-1] == port for entry in api.get("ports", []))
    assert f"--port {port}" in command_text(api)


def test_api_migrates_before_serving_and_scheduler_schedules() -> None:
    services = load_compose()["services"]
    assert parity_subcommands(command_text(services["api"])) == ["db upgrade", "serve"]
    assert "0.0.0.0" in command_text(services["api"])
    assert parity_subcommands(command_text(services["scheduler"])) == ["scheduler"]


def test_app_services_use_postgres_and_slurm() -> None:
    services = load_compose()["services"]
    for name in ("api", "scheduler"):
        env = environment(services[name])
        assert env["PARITY_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["PARITY_DATABASE_URL"]
        assert env["PARITY_EXECUTOR"] == "slurm"
        fields: dict[str, Any] = {
            k.removeprefix("PARITY_").lower(): v for k, v in env.items() if k.startswith("PARITY_")
        }
        Settings(**fields)


def test_slurm_settings_are_identical_in_every_slurm_container() -> None:
    services = load_compose()["services"]
    slurm_envs = [
        {k: v for k, v in environment(svc).items() if k.startswith("CLUSTER_") and not k.startswith("CLUSTER_DB_")}
        for name, svc in services.items()
        if name in {"slurmdbd", "slurmctld", "slurmd", "api", "scheduler"}
    ]
    assert slurm_envs[0] and all(env == slurm_envs[0] for env in slurm_envs)
    partition = slurm_envs[0]["CLUSTER_PARTITION"]
    assert environment(services["scheduler"])["PARITY_SLURM_PARTITION"] == partition


def test_commands_are_real_cli_subcommands() -> None:
    try:
        from service.cli.main import build_parser

        parser = build_parser()
    except ImportError as exc:
        pytest.skip(f"service.cli.main does not import yet: {exc}")

    def knows(parser: argparse.ArgumentParser, words: list[str]) -> bool:
        if not words:
            return True
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and words[0] in action.choices:
                return knows(action.choices[words[0]], words[1:])
        return False

    used = {sub for svc in load_compose()["services"].values() for sub in parity_subcommands(command_text(svc))}
    assert used == KNOWN_SUBCOMMANDS
    assert all(knows(parser, sub.split()) for sub in used), used


def test_scheduler_healthcheck_is_a_real_command() -> None:
    from service.cli.main import build_parser

    test = load_compose()["services"]["scheduler"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "parity"]
    assert build_parser().parse_args(test[2:]).check is True


def test_entrypoint_handles_every_slurm_role() -> None:
    entrypoint = (REPO_ROOT / "docker" / "entrypoint.sh").read_text()
    for svc in load_compose()["services"].values():
        role = (svc.get("command") or [""])[0]
        if role in {"munge-key", "slurmdbd", "slurmctld", "slurmd"}:
            assert re.search(rf"\$role == {role} \]\]|^\s*{role}\)", entrypoint, re.MULTILINE), role


# ---------------------------------------------------------------- the checker catches mistakes


def broken(mutate) -> list[str]:
    compose = copy.deepcopy(load_compose())
    mutate(compose)
    return compose_problems(compose, REPO_ROOT)


def test_checker_reports_missing_healthcheck() -> None:
    problems = broken(lambda c: c["services"]["postgres"].pop("healthcheck"))
    assert any("'postgres' has no healthcheck" in p for p in problems), problems


def test_checker_reports_unknown_env_var() -> None:
    problems = broken(lambda c: c["services"]["scheduler"]["environment"].update(PARITY_NO_SUCH_KNOB="1"))
    assert problems == ["scheduler: PARITY_NO_SUCH_KNOB is not a field of service.core.settings.Settings"]


def test_checker_reports_missing_service_and_dangling_dependency() -> None:
    problems = broken(lambda c: c["services"].pop("slurmctld"))
    assert "service 'slurmctld' is missing" in problems
    assert any("depends on unknown service 'slurmctld'" in p for p in problems), problems


def test_checker_reports_undeclared_volume_and_unmounted_run_folder() -> None:
    def mutate(c: dict[str, Any]) -> None:
        c["volumes"].pop("runs")
        c["services"]["slurmd"]["volumes"] = ["munge-key:/etc/munge:ro", "runs:/elsewhere"]

    problems = broken(mutate)
    assert any("volume 'runs'" in p and "not declared" in p for p in problems), problems
    assert "slurmd: the run folder /srv/parity/runs is not mounted" in problems


def test_checker_reports_missing_dockerfile_target_and_unknown_subcommand() -> None:
    def mutate(c: dict[str, Any]) -> None:
        c["services"]["api"]["build"] = {"context": ".", "dockerfile": "docker/Dockerfile", "target": "nope"}
        c["services"]["slurmd"]["build"] = {"context": ".", "dockerfile": "docker/Nope.Dockerfile"}
        c["services"]["scheduler"]["command"] = ["parity", "schedule"]

    problems = broken(mutate)
    assert any(p.startswith("api: build target 'nope'") for p in problems), problems
    assert any(p.startswith("slurmd: Dockerfile") and "does not exist" in p for p in problems), problems
    assert "scheduler: runs unknown subcommand `parity schedule`" in problems


def test_checker_reports_least_privilege_mistakes() -> None:
    def mutate(c: dict[str, Any]) -> None:
        c["services"]["api"]["volumes"].append("munge-key:/etc/munge:ro")
        c["services"]["api"]["user"] = "root"
        c["services"]["slurmd"]["environment"]["PARITY_DATABASE_URL"] = "postgresql+psycopg://parity@postgres:5432/p"
        c["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] = "${POSTGRES_PASSWORD:-parity}"
        c["services"]["scheduler"].pop("healthcheck")

    problems = broken(mutate)
    assert "api: runs as root (user: root)" in problems, problems
    assert any(p.startswith("api: mounts the munge key") for p in problems), problems
    assert any(p.startswith("slurmd: gets PARITY_DATABASE_URL") for p in problems), problems
    assert "postgres: POSTGRES_PASSWORD has a default secret (${POSTGRES_PASSWORD:-parity})" in problems, problems
    assert "scheduler: no healthcheck" in problems, problems


def test_checker_reports_root_in_the_image_and_slurm_conf(tmp_path: Path) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text("FROM python:3.11 AS app\n")
    (tmp_path / "docker" / "entrypoint.sh").write_text("SlurmUser=root\nexec \"$@\"\n")
    assert privilege_problems(tmp_path) == [
        "Dockerfile: no unprivileged PARITY_RUN_AS user for the app",
        "entrypoint.sh: app commands are not run through drop_privileges",
        "entrypoint.sh: slurmctld/slurmdbd run as root (SlurmUser)",
        "entrypoint.sh: slurm.conf lets jobs run as root (DisableRootJobs)",
    ]


def test_secrets_have_no_default_and_an_example_env_file() -> None:
    text = COMPOSE_FILE.read_text()
    assert "${POSTGRES_PASSWORD:?" in text and "${SLURMDBD_STORAGE_PASS:?" in text
    example = (REPO_ROOT / "docker" / "env.example").read_text()
    assert "POSTGRES_PASSWORD=" in example and "SLURMDBD_STORAGE_PASS=" in example


def test_checker_reports_unconditioned_depends_on() -> None:
    problems = broken(lambda c: c["services"]["scheduler"].update(depends_on=["postgres"]))
    assert problems == ["scheduler: depends_on without conditions (only waits for the start)"]


# ------------------------------------------------ the Slurm containers, run without Docker


@pytest.mark.nightly
@pytest.mark.slurm
def test_entrypoint_runs_a_working_cluster_in_namespaces(tmp_path: Path) -> None:
    """munge-key, slurmdbd, slurmctld, slurmd and a submitting container, as compose wires them."""
    needed = ["unshare", "ip", "mariadbd", "mariadb-install-db", "slurmctld", "slurmd", "slurmdbd", "munged"]
    missing = [tool for tool in needed if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"needs root and {missing or needed} (scripts/slurm-up.sh installs the packages)")
    script = REPO_ROOT / "tests" / "infra" / "compose_namespaces.sh"
    result = subprocess.run(
        ["unshare", "-mnup", "--fork", "--kill-child", "--mount-proc", str(script), str(tmp_path)],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=240,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(tmp_path.glob("*.log")))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out + logs
    # the job ran as the unprivileged user the scheduler container dropped to (nobody here), not root
    assert "results: [(0, 'slurmd', 65534), (1, 'slurmd', 65534)]" in out, out + logs
    assert "|COMPLETED|slurmd" in out, out + logs
    assert "cluster: parity" in out, out + logs


def test_checker_reports_exposure_mistakes() -> None:
    """Each of the issue's compose findings, put back, is reported (the real file has none: above)."""
    compose = load_compose()
    assert exposure_problems(compose["services"], REPO_ROOT) == []
    c = copy.deepcopy(compose)
    c["services"]["api"]["ports"] = ["8000:8000"]
    c["services"]["api"]["volumes"] = ["runs:/srv/parity/runs", "parity-data:/srv/parity/data"]
    c["services"]["postgres"]["environment"]["POSTGRES_USER"] = "parity"
    c["services"]["postgres"]["volumes"] = ["postgres-data:/var/lib/postgresql/data"]
    problems = exposure_problems(c["services"], REPO_ROOT)
    assert "api: port '8000:8000' is published on every address (default must be 127.0.0.1)" in problems
    assert "api: the run folder /srv/parity/runs is mounted read-write (the API only reads runs)" in problems
    assert "api: connects to Postgres as the superuser 'parity'" in problems
    assert "scheduler: connects to Postgres as the superuser 'parity'" in problems
    assert "postgres: no init script creating the non-superuser app role that owns its schema" in problems


def test_checker_reports_jobs_running_as_the_service(tmp_path: Path) -> None:
    """The real file runs jobs as parity-job (above); without it, or as the service, it is reported."""
    compose = load_compose()
    assert job_user_problems(compose["services"], REPO_ROOT) == []
    assert environment(compose["services"]["scheduler"])["PARITY_JOB_USER"] == "parity-job"
    c = copy.deepcopy(compose)
    del c["services"]["scheduler"]["environment"]["PARITY_JOB_USER"]
    assert job_user_problems(c["services"], REPO_ROOT) == [
        "scheduler: no PARITY_JOB_USER (jobs would run as the service's user)"]
    c["services"]["scheduler"]["environment"]["PARITY_JOB_USER"] = "parity"
    assert job_user_problems(c["services"], REPO_ROOT) == [
        "scheduler: PARITY_JOB_USER=parity is root or the service's own user"]
    c["services"]["scheduler"]["environment"]["PARITY_JOB_USER"] = "mallory"
    assert job_user_problems(c["services"], REPO_ROOT) == ["Dockerfile: creates no user mallory (PARITY_JOB_USER)"]
