"""The one settings object of the service: every knob is a PARITY_* environment variable."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, ByteSize, Field, TypeAdapter, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.core.pool_config import PoolEntry, parse_pool


def default_data_dir() -> Path:
    """Where embedded state lives when nothing else is configured (XDG data dir)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "megatron-parity"


# what a local job is isolated by, each promised when the scheduler is root (PARITY_JOB_ISOLATION_WAIVE)
ISOLATIONS = ("cgroup", "limits", "mounts", "network")
BUILD_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?")
# where pip and uv read their index from the environment (a build's gateway lets their hosts through)
INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX",
                   "UV_INDEX")
MAX_QUOTA_BYTES = 1 << 50  # 1 PiB: anything larger is a typo, and overflows what rlimits take
# a number (at most 16 digits, an optional fraction) and a unit: K, M, G, T, P alone or as KB/KiB/… (all
# powers of 1024 here, as the settings have always read them; ByteSize would take "GB" as 10**9)
_SIZE = re.compile(r"(\d{1,16}(?:\.\d{1,6})?)\s*([KMGTP]?)(?:I?B)?", re.IGNORECASE | re.ASCII)
_BYTES = TypeAdapter(ByteSize)


def parse_size(value: str, setting: str = "PARITY_RUN_DISK_QUOTA") -> int:
    """'20G' -> bytes (through pydantic's ByteSize); a clear error naming the setting and the allowed forms."""
    found = _SIZE.fullmatch(value.strip())
    if found is None:
        raise ValueError(f"{setting}: {value!r} is not a size; expected bytes or a number with K, M, G "
                         "or T (e.g. 20G)")
    number, unit = found.groups()
    size = int(_BYTES.validate_python(f"{number}{unit.upper()}iB" if unit else number))
    if not 1 << 20 <= size <= MAX_QUOTA_BYTES:
        raise ValueError(f"{setting}: {value!r} must lie between 1M and 1P")
    return size


def _comma_separated(value: Any) -> Any:
    # PARITY_X="a, b,c" (or a list given in code) -> ["a", "b", "c"]: empty items dropped
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


# A list setting, written in the environment as comma-separated items (NoDecode: not as JSON).
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)]


class Settings(BaseSettings):
    """Service, scheduler and CLI configuration, read from PARITY_* variables."""

    model_config = SettingsConfigDict(env_prefix="PARITY_", extra="ignore")

    # None means: start (or reuse) the embedded Postgres under data_dir/pgdata.
    database_url: str | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    executor: Literal["slurm", "local", "auto"] = "auto"
    # submitit folders, job logs and checkpoints; must be shared between scheduler and Slurm nodes.
    run_folder: Path | None = None

    slurm_partition: str | None = None
    slurm_time_limit_min: int = Field(default=30, ge=1)
    slurm_cpus_per_task: int = Field(default=1, ge=1)
    # GPUs per node a `device: cuda` check may use (PARITY_GPUS); unset: detected (service/executors/gpus.py:
    # the local host's NVIDIA driver, or the Slurm partition's gres). 0 declares a CPU-only installation.
    gpus: int | None = Field(default=None, ge=0)
    # extra sbatch options separated by commas: KEY=VALUE, or a bare KEY for a flag ("account=ml,hold")
    slurm_extra_args: CommaList = []

    # A Python executable (or command prefix) that runs job phases when a run names no environment.
    job_python: str | None = None
    # Extra environment variable names a job may inherit, comma-separated (service/executors/launcher.py
    # has the allow-list; everything else, e.g. PARITY_DATABASE_URL, stays out of the jobs).
    job_env: CommaList = []
    # The Unix user builds and phases run as (service/executors/job_user.py); unset: the service's own
    # user (weaker: a job can then read what the service can, docs/security.md). Needs a root scheduler.
    job_user: str | None = None
    # One user per live job: how many of the pool <job_user>-0, -1, … (scripts/job-user.sh) jobs are
    # leased from (service/executors/job_leases.py); unset: every one that exists; 0: none, every job
    # runs as job_user itself (weaker: concurrent jobs share a uid, docs/security.md)
    job_users: int | None = Field(default=None, ge=0)
    # where the leases of the pool are kept: the pool's users are the host's, so every scheduler using
    # them shares this folder (replicas on other hosts: a folder they all see)
    job_lease_folder: Path = Path("/run/parity-job-users")
    # What one run attempt or build may write into its folder: bytes, or with a K/M/G/T suffix (powers
    # of 1024). Every job file is capped at this (RLIMIT_FSIZE); the reconciler fails a folder past it.
    run_disk_quota: str = "20G"
    # where each local job gets a cgroup of its own, killed whole when the job ends (nothing it started,
    # a setsid daemon included, outlives it): "auto" (a writable cgroup v2 hierarchy, as root), "off", or
    # the path of a cgroup v2 folder the scheduler may write (service/executors/job_cgroup.py)
    job_cgroup: str = "auto"
    # What a local job's cgroup allows (service/executors/job_cgroup.py): processes and threads at once
    # (pids.max; a fork bomb stops there) and memory (memory.max, with the K/M/G/T suffixes of the quota;
    # its tmpfs /dev/shm counts in it too); "max" for no cap
    job_pids_max: str = "4096"
    job_memory_max: str = "32G"
    # the size of a local job's own /dev/shm (a tmpfs, nosuid,nodev; torch's shared memory lives there)
    job_shm_size: str = "2G"
    # Isolations a local job may run without, comma-separated: cgroup (its processes killed whole), limits
    # (pids.max, memory.max), mounts (its own /tmp, /var/tmp, /dev/shm, nosuid), network (its own loopback
    # only), or "all". Anything promised and not set up stops every job from starting, naming what is
    # missing; a waived one is logged at every job. Unset: none waived when the scheduler is root, all when it
    # is not (a laptop: nothing can be isolated without root, the weaker mode docs/security.md describes).
    job_isolation_waive: str | None = None

    # what a submit token may build (service/environments/build_policy.py): project names (released
    # versions, pinned), git+https repository URLs (at a full commit), `artifact` (artifact:<sha256>)
    build_allow: CommaList = ["megatron-core", "artifact"]
    # the hosts a local build may reach (its only way out of its own network: service/executors/index_gateway.py),
    # `host` (ports 443 and 80) or `host:port`; the hosts of PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and uv's index
    # variables in the service's environment are added (build_hosts_allowed)
    build_hosts: CommaList = ["pypi.org", "files.pythonhosted.org", "github.com", "codeload.github.com"]
    # the Pythons a build may make its venv on, "3.11=/usr/bin/python3.11,3.12=/opt/py312/bin/python3.12"
    # (service/environments/interpreters.py): a build takes the lowest one its requirements' Requires-Python
    # accepts; unset, every python3.X found on PATH (or in pyenv's versions folder), the service's own always
    pythons: str | None = None

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Public base URL used in links handed to CI (triage pages, dashboard).
    public_url: str | None = None
    reads_require_token: bool = False
    # dashboard login: the key that signs session cookies (unset: derived per process, so sessions
    # end when the server restarts), how long a session lasts, and an optional trusted reverse proxy
    session_secret: str | None = None
    session_max_age_s: int = Field(default=12 * 3600, ge=60)
    # e.g. "X-Forwarded-User"; honoured only on requests whose peer address is in proxy_addresses
    proxy_user_header: str | None = None
    proxy_addresses: CommaList = []
    # notification channels: internal addresses (loopback, link-local, private) only when set; and, when
    # given, only these hosts (comma-separated names, or .suffix for a domain) — service/oncall/destinations.py
    notify_allow_private: bool = False
    notify_allow_hosts: CommaList = []
    # branches whose tracks live on (the overview's matrix columns); every other branch is a PR's, listed as
    # suite runs. Comma-separated patterns, `*` any run of characters.
    long_lived_tracks: CommaList = ["main", "master", "dev", "release*", "core_r*"]
    # notify when a check × track ends in an infrastructure error more than this many times in a row
    notify_infra_errors_after: int = Field(default=3, ge=1)
    # client side (`parity submit`): where the service is and the bearer token to use
    service_url: str | None = None
    token: str | None = None

    scheduler_poll_seconds: float = Field(default=2.0, gt=0)
    max_infra_retries: int = Field(default=2, ge=0)
    retry_backoff_seconds: float = Field(default=5.0, ge=0)
    phase_timeout_min: int = Field(default=60, ge=1)
    # Built environments no run has used for this many days have their virtualenv deleted.
    env_keep_days: float = Field(default=14.0, ge=0)
    # uploaded builds (POST /api/v1/artifacts): where they are stored (unset: <run folder>/artifacts, so every
    # Slurm node that builds from one sees it), the largest upload accepted, and how many days an artifact no
    # build asked for is kept
    artifact_folder: Path | None = None
    artifact_max_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    artifact_keep_days: float = Field(default=30.0, ge=0)
    # per-token quotas (admin tokens have none; 429 `quota_exceeded` naming the setting beyond them): the
    # artifacts one token's uploads keep stored, in number and in bytes (size as PARITY_RUN_DISK_QUOTA), and
    # the builds it may have pending or building at once. Queued runs: PARITY_MAX_QUEUED_PER_REQUESTER.
    token_max_artifacts: int = Field(default=100, ge=1)
    token_max_artifact_bytes: str = "10G"
    token_max_builds: int = Field(default=4, ge=1)
    # the detector-health self-test batch (service/selftest/batch.py); 0 turns it off
    selftest_interval_hours: float = Field(default=24.0, ge=0)
    # background work (self-test batches, scheduled track runs: service/core/checks.py BACKGROUND_LABELS)
    # yields to user work: at most this many such runs in flight at once (0 pauses them), never
    # claimed ahead of a user's run, on the local executor only in slots user work leaves free, and
    # on Slurm submitted with this `--nice` (a lower priority than user jobs, which have 0)
    background_max_running: int = Field(default=1, ge=0)
    background_slurm_nice: int = Field(default=1000, ge=0, le=2147483645)
    # a phase not running this long after submission (PENDING, or a state nobody can read) is
    # cancelled and retried as an infrastructure failure
    pending_timeout_s: float = Field(default=3600.0, gt=0)
    # a phase still running this long past its time limit (Slurm's or phase_timeout_min) is stopped
    phase_grace_s: float = Field(default=300.0, ge=0)
    # consecutive failed scheduler steps on one run (its data refused, not an outage) before it ends in error
    max_row_failures: int = Field(default=5, ge=1)

    # retention (service/runs/retention.py): checkpoints of failing runs, then whole run folders, in days
    keep_failed_days: float = Field(default=14, ge=0)
    keep_days: float | None = Field(default=90, ge=0)

    # admission (429 + Retry-After beyond these): runs queued or in flight in the whole service,
    # and runs one requester (token name) may have waiting in the queue
    max_in_flight: int = Field(default=500, ge=1)
    max_queued_per_requester: int = Field(default=100, ge=1)

    # local executor only: phase jobs running at once (Slurm queues by CPUs itself; local jobs would
    # all start together, and a sweep of 60 runs on a laptop then starves every one into its timeout)
    local_max_running: int = Field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2), ge=1)
    # warm workers per environment (service/core/pool_config.py has the grammar); empty: every attempt cold
    pool: str = ""
    # a suite run's checks share warm workers started on demand for its environment, whatever PARITY_POOL
    # says (service/runs/pool_dispatch.py): the imports are paid once per suite, not once per check.
    # suite_workers: the most such workers per environment and world size (checks run that many at once);
    # suite_worker_idle_s: how long one waits for its suite's next check before it is let go
    suite_warm: bool = True
    suite_workers: int = Field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2), ge=1, le=64)
    suite_worker_idle_s: int = Field(default=20, ge=0, le=3600)

    @field_validator("pool")
    @classmethod
    def _check_pool(cls, value: str) -> str:
        parse_pool(value)  # PoolConfigError (a ValueError) names the entry, the field and what is allowed
        return value

    def pool_entries(self) -> tuple[PoolEntry, ...]:
        """PARITY_POOL parsed."""
        return parse_pool(self.pool)

    @field_validator("slurm_extra_args")
    @classmethod
    def _check_extra_args(cls, value: list[str]) -> list[str]:
        for item in value:
            key = item.split("=", 1)[0].strip()
            if not key.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"expected KEY=VALUE or KEY items separated by commas, got {item!r}")
        return value

    @field_validator("long_lived_tracks")
    @classmethod
    def _track_patterns(cls, value: list[str]) -> list[str]:
        bad = [p for p in value if not re.fullmatch(r"[\w.*/-]+", p)]
        if bad:
            raise ValueError(f"PARITY_LONG_LIVED_TRACKS: {', '.join(map(repr, bad))}: a pattern is letters, digits, "
                             "'.', '_', '-', '/' and '*' (any run of characters)")
        return value

    @field_validator("run_disk_quota")
    @classmethod
    def _check_quota(cls, value: str) -> str:
        parse_size(value)
        return value

    @field_validator("job_memory_max", "job_shm_size", "job_pids_max")
    @classmethod
    def _check_job_limits(cls, value: str, info: Any) -> str:
        name = f"PARITY_{info.field_name.upper()}"
        if value.strip() == "max" and info.field_name != "job_shm_size":
            return "max"
        if info.field_name == "job_pids_max":
            if not value.strip().isdigit() or int(value) < 16:
                raise ValueError(f"{name}: {value!r} is not a number of processes (16 or more) or 'max'")
            return value.strip()
        parse_size(value, name)
        return value

    @field_validator("build_hosts")
    @classmethod
    def _check_build_hosts(cls, value: list[str]) -> list[str]:
        bad = [h for h in value if not BUILD_HOST.fullmatch(h.strip())]
        if bad:
            raise ValueError(f"PARITY_BUILD_HOSTS: {', '.join(map(repr, bad[:3]))}: an entry is a host name or IPv4 "
                             "address, optionally with :port (e.g. pypi.org, pypi.internal:8443)")
        return [h.strip().lower() for h in value]

    def build_hosts_allowed(self) -> list[str]:
        """PARITY_BUILD_HOSTS and the hosts of the package indexes the service's environment names for pip and uv."""
        found = list(self.build_hosts)
        for name in INDEX_VARIABLES:
            for url in os.environ.get(name, "").split():
                parts = urlsplit(url)
                if parts.scheme in ("http", "https") and parts.hostname:
                    found.append(f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname)
        return sorted(set(found))

    @field_validator("job_isolation_waive")
    @classmethod
    def _check_waive(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = {n.strip() for n in value.split(",") if n.strip()}
        bad = sorted(names - {*ISOLATIONS, "all"})
        if bad:
            raise ValueError(f"PARITY_JOB_ISOLATION_WAIVE: unknown {', '.join(map(repr, bad))}; allowed: "
                             f"{', '.join(ISOLATIONS)} or all")
        return value

    def waived_isolations(self) -> frozenset[str]:
        """The isolations PARITY_JOB_ISOLATION_WAIVE lets a local job go without (unset: all unless root)."""
        if self.job_isolation_waive is None:
            if os.geteuid() == 0:
                return frozenset()
            # not root: only a cgroup delegated to this user (PARITY_JOB_CGROUP names it) can still be had
            delegated = self.job_cgroup not in ("auto", "off")
            return frozenset(ISOLATIONS) - ({"cgroup"} if delegated else set())
        names = {n.strip() for n in self.job_isolation_waive.split(",") if n.strip()}
        return frozenset(ISOLATIONS) if "all" in names else frozenset(names)

    def job_memory_max_bytes(self) -> int | None:
        """PARITY_JOB_MEMORY_MAX in bytes (None: no cap)."""
        return None if self.job_memory_max == "max" else parse_size(self.job_memory_max, "PARITY_JOB_MEMORY_MAX")

    @field_validator("token_max_artifact_bytes")
    @classmethod
    def _check_artifact_quota(cls, value: str) -> str:
        parse_size(value, "PARITY_TOKEN_MAX_ARTIFACT_BYTES")
        return value

    @property
    def token_max_artifact_bytes_int(self) -> int:
        """PARITY_TOKEN_MAX_ARTIFACT_BYTES in bytes."""
        return parse_size(self.token_max_artifact_bytes, "PARITY_TOKEN_MAX_ARTIFACT_BYTES")

    @property
    def run_disk_quota_bytes(self) -> int:
        """PARITY_RUN_DISK_QUOTA in bytes."""
        return parse_size(self.run_disk_quota)

    @property
    def resolved_run_folder(self) -> Path:
        """The run folder, defaulting to data_dir/runs."""
        return self.run_folder or (self.data_dir / "runs")

    @property
    def resolved_artifact_folder(self) -> Path:
        """The artifact folder, defaulting to <run folder>/artifacts."""
        return self.artifact_folder or (self.resolved_run_folder / "artifacts")

    @property
    def base_url(self) -> str:
        """The URL people and CI use to reach this service."""
        return (self.public_url or f"http://{self.api_host}:{self.api_port}").rstrip("/")

    def build_allow_set(self) -> frozenset[str]:
        """PARITY_BUILD_ALLOW as a set: project names canonicalised, URLs without a trailing slash or .git."""
        from packaging.utils import canonicalize_name

        out = set()
        for item in self.build_allow:
            if item.startswith("git+"):
                out.add(item.rstrip("/").removesuffix(".git"))
            else:
                out.add(item if item == "artifact" else canonicalize_name(item))
        return frozenset(out)

    def notify_allow_host_set(self) -> frozenset[str]:
        """PARITY_NOTIFY_ALLOW_HOSTS as a set of lower-case names (empty: any public host)."""
        return frozenset(h.lower() for h in self.notify_allow_hosts)

    def job_env_names(self) -> frozenset[str]:
        """PARITY_JOB_ENV as a set of names."""
        return frozenset(self.job_env)

    def sbatch_extra(self) -> dict[str, str | bool]:
        """slurm_extra_args parsed into submitit's additional_parameters (a bare KEY is a flag)."""
        out: dict[str, str | bool] = {}
        for part in self.slurm_extra_args:
            key, sep, val = part.partition("=")
            out[key.strip()] = val.strip() if sep else True
        return out


@lru_cache
def get_settings() -> Settings:
    """Settings read once per process (tests call get_settings.cache_clear())."""
    return Settings()
