"""Coverage is measured against Megatron-Core's surface, not the engine's (jobs/surface_table.py).

Every field the installed build offers in the gate's areas is covered by a gate check, carries a written reason
why no CPU check must exercise it, or is an explicit known gap; a field nobody classified (new in a later build)
fails here. The megatron tests read the surface the way the service does, through `python -m jobs.rank.surface`
(so this module imports no engine code and its pure tests run without the engine).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from jobs import features, surface_table
from jobs.spec import RunSpec
from jobs.surface_table import CLASSIFIED, ENGINE, KNOWN_GAPS

REGENERATE = ".venv/bin/python -m jobs.surface_table --write docs/detection.md"


def _by_field(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['section']}.{r['field']}": r for r in rows}


def _without(specs: dict[str, RunSpec], feature: str) -> dict[str, RunSpec]:
    return {name: spec for name, spec in specs.items() if feature not in features.spec_features(spec)}


def test_a_field_nobody_classified_is_uncovered() -> None:
    surface = {"ddp": ["use_distributed_optimizer", "shiny_new_bucket_layout"]}
    rows = _by_field(surface_table.classify(surface, surface_table.gate_specs()))
    assert rows["ddp.use_distributed_optimizer"]["status"] == "covered"
    assert rows["ddp.shiny_new_bucket_layout"]["status"] == "uncovered"
    assert "classify it" in rows["ddp.shiny_new_bucket_layout"]["detail"]


def test_a_field_is_uncovered_once_no_gate_check_exercises_its_feature() -> None:
    gate = surface_table.gate_specs()
    surface = {"transformer": ["mtp_num_layers"]}
    row = surface_table.classify(surface, gate)[0]
    assert row["status"] == "covered" and row["detail"] == "megatron:mtp_num_layers" and row["checks"]
    # drop the checks that exercise the MTP head: the field is uncovered again, naming its feature
    row = surface_table.classify(surface, _without(gate, "megatron:mtp_num_layers"))[0]
    assert (row["status"], row["checks"]) == ("uncovered", [])
    assert row["detail"] == "megatron:mtp_num_layers: no gate check exercises it"


def test_an_engine_setting_is_covered_by_every_check_and_a_gpu_feature_by_its_reason() -> None:
    gate = surface_table.gate_specs()
    rows = _by_field(surface_table.classify({"optimizer": ["lr"], "transformer": ["fp8"]}, gate))
    assert rows["optimizer.lr"]["status"] == "covered" and rows["optimizer.lr"]["checks"] == sorted(gate)
    assert surface_table.classify({"optimizer": ["lr"]}, {})[0]["status"] == "uncovered"
    # FP8 is an engine feature only a GPU config has: its row carries the engine's own reason
    assert rows["transformer.fp8"]["status"] == "reason"
    assert rows["transformer.fp8"]["detail"].startswith("megatron:fp8: a GPU check")


def test_a_known_gap_is_a_gap_and_a_classified_field_the_build_lacks_is_stale() -> None:
    surface = {"ddp": ["check_for_large_grads", "use_distributed_optimizer"]}
    row = surface_table.classify(surface, surface_table.gate_specs())[0]
    assert (row["status"], row["detail"]) == ("gap", KNOWN_GAPS["ddp.check_for_large_grads"])
    stale = surface_table.stale(surface)
    assert "ddp.use_megatron_fsdp" in stale and "optimizer.lr" in stale
    assert "ddp.check_for_large_grads" not in stale and "ddp.use_distributed_optimizer" not in stale


def test_known_gaps_and_classified_fields_do_not_overlap() -> None:
    assert set(KNOWN_GAPS) & set(CLASSIFIED) == set()
    sections = {"ddp", "optimizer", "scheduler", "transformer", "training_state"}
    assert {key.split(".", 1)[0] for key in [*KNOWN_GAPS, *CLASSIFIED]} == sections


def test_every_feature_the_table_names_is_an_engine_feature() -> None:
    known = features.engine_features()
    unknown = {key: row.feature for key, row in CLASSIFIED.items() if row.feature not in ("", ENGINE, *known)}
    assert unknown == {}, "jobs/surface_table.py names features jobs/features.py does not know"


def test_a_gap_the_gate_now_closes_must_leave_known_gaps() -> None:
    # closing a gap is a change to the table: move the field from KNOWN_GAPS to its section with its feature
    coverage = features.coverage(surface_table.gate_specs())
    watched = {key: feature for key in KNOWN_GAPS if (feature := surface_table.closing_feature(key))}
    closed = {key: feature for key, feature in watched.items() if coverage.get(feature, {}).get("checks")}
    assert closed == {}, f"gate checks now exercise {closed}: move them from KNOWN_GAPS to CLASSIFIED"


def test_a_row_names_exactly_one_of_feature_or_reason() -> None:
    with pytest.raises(ValueError):
        surface_table.Row()
    with pytest.raises(ValueError):
        surface_table.Row(feature="parallel:tp", reason="both")


def test_the_markdown_table_has_one_row_per_field_and_replaces_between_its_markers() -> None:
    rows = surface_table.classify({"ddp": ["use_distributed_optimizer", "x|y"]}, surface_table.gate_specs())
    table = surface_table.markdown(rows)
    assert table.splitlines()[0] == "| section | field | status | checks or reason |"
    assert len(table.splitlines()) == 2 + len(rows)
    assert "`x\\|y`" in table  # a pipe inside a cell is escaped
    doc = f"intro\n{surface_table.BEGIN}\nold\n{surface_table.END}\nafter\n"
    written = surface_table.replace_table(doc, table)
    assert surface_table.table_in(written) == table and written.endswith(f"{surface_table.END}\nafter\n")
    with pytest.raises(ValueError):
        surface_table.replace_table("no markers", table)


@pytest.fixture(scope="module")
def installed_surface() -> dict[str, list[str]]:
    # `python -m jobs.rank.surface` in this environment: read_surface() on the installed build, as the service runs it
    return surface_table.read_surface_of(sys.executable)


@pytest.mark.megatron
def test_the_installed_build_offers_the_known_fields(installed_surface: dict[str, list[str]]) -> None:
    assert set(installed_surface) == {"ddp", "optimizer", "scheduler", "transformer", "training_state"}
    assert all(installed_surface.values()), installed_surface
    assert {"overlap_grad_reduce", "bucket_size", "use_distributed_optimizer"} <= set(installed_surface["ddp"])
    assert {"decoupled_lr", "lr", "loss_scale"} <= set(installed_surface["optimizer"])
    assert {"init_lr", "lr_warmup_steps"} <= set(installed_surface["scheduler"])
    assert "optimizer" not in installed_surface["scheduler"]
    transformer = set(installed_surface["transformer"])
    assert {"num_moe_experts", "mtp_num_layers", "fp16", "params_dtype", "expert_model_parallel_size"} <= transformer
    # outside the gate's areas: attention, init methods
    assert not transformer & {"num_attention_heads", "init_method", "kv_channels"}


@pytest.mark.megatron
def test_every_field_of_the_installed_build_is_classified(installed_surface: dict[str, list[str]]) -> None:
    rows = surface_table.classify(installed_surface, surface_table.gate_specs())
    uncovered = {f"{r['section']}.{r['field']}": r["detail"] for r in rows if r["status"] == "uncovered"}
    assert uncovered == {}, "classify these in jobs/surface_table.py (a feature, a reason or a known gap)"


@pytest.mark.megatron
def test_the_gap_rows_are_exactly_the_known_gaps_the_build_has(installed_surface: dict[str, list[str]]) -> None:
    rows = surface_table.classify(installed_surface, surface_table.gate_specs())
    present = {f"{section}.{name}" for section, names in installed_surface.items() for name in names}
    gaps = {f"{r['section']}.{r['field']}" for r in rows if r["status"] == "gap"}
    assert gaps == set(KNOWN_GAPS) & present


@pytest.mark.megatron
def test_the_documented_table_is_the_generated_one(installed_surface: dict[str, list[str]]) -> None:
    rows = surface_table.classify(installed_surface, surface_table.gate_specs())
    documented = surface_table.table_in(surface_table.DOC.read_text())
    assert documented == surface_table.markdown(rows), f"docs/detection.md's surface table is stale: run {REGENERATE}"
