"""The repro commands carry every spec field: parsed back by the real `parity` parser, they give the same spec."""

from __future__ import annotations

import shlex
from dataclasses import fields

from jobs.spec import RunSpec
from service.cli.client.shape_arg import parse_shape
from service.cli.client.submit import build_body
from service.cli.engine.run_local import spec_values
from service.cli.main import build_parser
from service.web.dashboard.reproduce import local_command, submit_command

# every field away from its default, so a dropped option shows as a difference
FULL = {
    "config": "moe-fp32-router", "dp": 4, "steps": 7, "save_step": 3, "sharding": "fully_sharded_model_space",
    "seed": 7, "tolerance": "bf16", "workarounds": ["realign-param-index", "restore-adam-step"],
    "mutants": ["zero-exp-avg-sq"], "isolation": "job", "resume_dp": 2, "nodes": 2,
    "shape": {"num_layers": 3}, "tp": 1, "pp": 1, "ep": 2, "async_save": True, "fully_parallel": True,
    "device": "cuda", "resume_tp": 2, "resume_pp": 2, "resume_ep": 1,
}


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "parity"
    return words[1:]


def test_every_field_of_runspec_is_in_the_full_spec() -> None:
    # a field added to RunSpec must be added here (and then needs an option on run-local and submit)
    assert {f.name for f in fields(RunSpec)} == set(FULL)


def test_local_command_parses_back_to_the_same_spec() -> None:
    spec = {**FULL, "mutants": []}  # a mutant name must exist in the catalogue for RunSpec; checked below
    args = build_parser().parse_args(_argv(local_command(spec, environment="mcore-next")))
    assert args.environment == "mcore-next"
    values = spec_values(args, parse_shape(args.shape))
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()} == {**spec}


def test_local_command_names_every_option_the_spec_has() -> None:
    args = build_parser().parse_args(_argv(local_command(FULL, python="/opt/mcore/bin/python")))
    assert args.python == "/opt/mcore/bin/python"
    values = spec_values(args, parse_shape(args.shape))
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()} == FULL


def test_submit_command_parses_back_to_the_same_spec() -> None:
    command = submit_command(FULL, environment="mcore-next", labels={"branch": "main"}, base_url="http://h:8742")
    args = build_parser().parse_args(_argv(command))
    body = build_body(args)
    got = {k: v for k, v in body["spec"].items()}
    assert got == {k: v for k, v in FULL.items() if v not in (None, [], {})}
    assert body["environment"] == "mcore-next" and args.url == "http://h:8742"
