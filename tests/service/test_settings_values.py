"""Settings read sizes through pydantic's ByteSize (K/M/G/T as powers of 1024, as documented) and
comma-separated settings as lists, from the environment as an operator writes them."""

from __future__ import annotations

import pytest

from service.core.settings import Settings, parse_size


def test_sizes_read_as_powers_of_1024_through_bytesize() -> None:
    assert parse_size("20G") == 20 << 30 == parse_size("20GiB") == parse_size("20 gb")
    assert parse_size("512M") == 512 << 20 and parse_size("1.5G") == 3 << 29
    assert parse_size(str(2 << 20)) == 2 << 20
    with pytest.raises(ValueError, match="PARITY_RUN_DISK_QUOTA: 'lots' is not a size"):
        parse_size("lots")


def test_comma_separated_settings_are_lists(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PARITY_JOB_ENV", "HF_HOME, WANDB_MODE,,")
    monkeypatch.setenv("PARITY_LONG_LIVED_TRACKS", "main,release*")
    monkeypatch.setenv("PARITY_SLURM_EXTRA_ARGS", "account=ml,hold")
    monkeypatch.setenv("PARITY_NOTIFY_ALLOW_HOSTS", "Hooks.Example.com")
    settings = Settings(run_folder=tmp_path)
    assert settings.job_env == ["HF_HOME", "WANDB_MODE"] and settings.job_env_names() == {"HF_HOME", "WANDB_MODE"}
    assert settings.long_lived_tracks == ["main", "release*"]
    assert settings.sbatch_extra() == {"account": "ml", "hold": True}
    assert settings.notify_allow_host_set() == {"hooks.example.com"}
    assert Settings(run_folder=tmp_path, build_allow=["megatron-core"]).build_allow_set() == {"megatron-core"}
    monkeypatch.setenv("PARITY_LONG_LIVED_TRACKS", "main,bad track")
    with pytest.raises(ValueError, match="PARITY_LONG_LIVED_TRACKS: 'bad track'"):
        Settings(run_folder=tmp_path)
