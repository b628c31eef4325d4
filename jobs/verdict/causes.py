"""Name what a resume lost: for each state difference, its section, its state-dict name and how (pure).

A state-diff signature (`model-weights-mismatch`, `optimizer-moments-mismatch`, …, `final-state-mismatch`)
says only which section moved. This module classifies every differing item:

- section: the human name of the snapshot section (`main` -> "main params", a `buffer:` item of `model`
  -> "buffers", …);
- name: the item as Megatron's state dict calls it (the model's state-dict key without the
  Float16Module `module.` prefix, `…/exp_avg` for a moment, `scheduler.num_steps`, `rng_state/torch_cpu`);
- how: `absent from the checkpoint` (the checkpoint holds no key for it: `checkpoint_contents`),
  `skipped by the load` (the load did not ask for it, or its restored value is the one the resume
  held before the load: `state_before_load`), `loaded wrong` (the restored value is neither the
  saved one nor the one before the load), `changed by the save` (saving changed the live state) or,
  for the final state only, `diverged after a matching restore` (restored exactly, apart later).

One line per signature names the first (most telling) item, e.g.
`optimizer-moments-mismatch: moments decoder.layers.0.mlp.linear_fc1.weight/exp_avg_sq loaded wrong (rank 0; +3 more)`;
it is made once here, stored with the result, and every surface shows it as is.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.contract import (
    CHECKPOINT_CONTENTS,
    STATE_AFTER_LOAD,
    STATE_AFTER_LOAD_RAW,
    STATE_AFTER_SAVE,
    STATE_AT_SAVE,
    STATE_BEFORE_LOAD,
    STATE_FINAL,
    PhaseDocument,
)
from jobs.signature_names import (
    FINAL_STATE_MISMATCH,
    LR_SCHEDULE_MISMATCH,
    PARAM_GROUP_IDENTITY_COLLISION,
    PARAM_GROUP_SCALARS_MISMATCH,
    SAVE_MUTATES_LIVE_STATE,
)
from jobs.verdict.state_diff import RESTORE_SIGNATURES, SECTIONS, snapshot_diffs

ABSENT = "absent from the checkpoint"
SKIPPED = "skipped by the load"
WRONG = "loaded wrong"
NOT_RESTORED = "not restored"  # a document without the pre-load snapshot cannot tell skipped from wrong
CHANGED_BY_SAVE = "changed by the save"
DIVERGED = "diverged after a matching restore"
# most telling first: what the checkpoint lacks explains everything after it
HOW_ORDER = (ABSENT, SKIPPED, WRONG, NOT_RESTORED, CHANGED_BY_SAVE, DIVERGED)

SECTION_LABELS = {
    "model": "model",
    "buffers": "buffers",
    "main": "main params",
    "moments": "moments",
    "steps": "optimizer step",
    "groups": "param groups",
    "scheduler": "scheduler",
    "iteration": "iteration",
    "rng": "RNG",
    "scaler": "scaler",
    "nonpersistent": "non-persistent buffers",
}
# sections the snapshot records but the restore diff never compares: a value lost there shows only
# later, in the final state, so a final-state difference looks there first
UNCOMPARED = ("nonpersistent",)
MAX_ITEMS = 12
MAX_LINE = 320
_LAYER = re.compile(r"\.(layers|local_experts)\.\d+\.")


def _probes(doc: PhaseDocument | None) -> dict[str, Any]:
    return dict((doc.get("probes") or {}) if doc else {})


def strip_wrapper(name: str) -> str:
    """The model's state-dict key: Float16Module's (and any other wrapper's) `module.` prefix removed."""
    while name.startswith("module."):
        name = name.removeprefix("module.")
    return name


def state_dict_name(section: str, item: str, chained: bool = False) -> tuple[str, str]:
    """(the human section, the item's name in Megatron's state dict) of one snapshot item."""
    if section == "model" and item.startswith("buffer:"):
        return SECTION_LABELS["buffers"], strip_wrapper(item.removeprefix("buffer:"))
    if section in ("model", "main", "nonpersistent"):
        return SECTION_LABELS[section], strip_wrapper(item.removeprefix("buffer:"))
    if section == "moments":
        param, _, key = item.rpartition("/")
        return SECTION_LABELS[section], f"{strip_wrapper(param)}/{key}"
    if section == "steps":
        return SECTION_LABELS[section], f"{strip_wrapper(item)}/step"
    if section in ("groups", "scaler"):
        m = re.match(r"o(\d+)\.(?:g(\d+)\.)?(.+)$", item)
        if m:
            opt = f"optimizer.chained_{m[1]}" if chained else "optimizer"
            where = f"param_groups.{m[2]}" if m[2] is not None else "grad_scaler"
            return SECTION_LABELS[section], f"{opt}.{where}.{m[3]}"
    if section == "scheduler":
        return SECTION_LABELS[section], f"scheduler.{item}"
    if section == "rng":
        return SECTION_LABELS[section], f"rng_state/{item}"
    return SECTION_LABELS.get(section, section), item


class Checkpoint:
    """What the checkpoint holds and what the load asked it for (the `checkpoint_contents` probe)."""

    def __init__(self, probe: dict[str, Any] | None) -> None:
        probe = probe or {}
        self.known = bool(probe.get("keys")) and not probe.get("incomplete")
        self.keys = set(probe.get("keys") or [])
        self.requested: list[dict[str, str]] = list(probe.get("requested") or [])
        # the layout-free view names its items by checkpoint key (one view for every rank): asked if any rank asked
        names = {name for rank in self.requested for name in rank}
        self.requested_keys = {key for rank in self.requested for key in rank.values()} - names
        self.optimizer = [k for k in self.keys if k.startswith("optimizer")]

    def key_of(self, section: str, item: str, rank: int) -> str | None:
        """The checkpoint key the load asked for a model item, if it asked."""
        if section not in ("model", "nonpersistent") or rank >= len(self.requested):
            return None
        if item not in self.requested[rank] and item in self.requested_keys:
            return item  # a view's item: the key itself
        return self.requested[rank].get(item)

    def _model_candidates(self, item: str) -> list[str]:
        name = strip_wrapper(item.removeprefix("buffer:"))
        # transformer layers (and experts) are saved stacked: decoder.layers.0.x -> decoder.layers.x
        return list(dict.fromkeys([name, _LAYER.sub(r".\1.", name)]))

    def holds(self, section: str, item: str, rank: int) -> bool | None:
        """Whether the checkpoint holds the item (None: the listing cannot tell)."""
        if not self.known:
            return None
        if section in ("model", "nonpersistent"):
            key = self.key_of(section, item, rank)
            if key is not None:
                return key in self.keys
            return any(c in self.keys for c in self._model_candidates(item))
        if section in ("main", "moments"):
            # Which key holds one param's main value or moment depends on the format and the layout
            # (per bucket, per param, gathered on DP rank 0, an expert's own DP group): a listing
            # without a key that looks like it proves nothing (at EP 2 and under dp_zero_gather_scatter
            # it named loaded state "absent"). Only a checkpoint with no optimizer state at all tells.
            return False if not self.optimizer else None
        if section in ("steps", "groups", "scaler"):
            # held inside the optimizer's common object in most formats: only its absence is telling
            return bool(self.optimizer)
        if section == "scheduler":
            return f"scheduler.{item}" in self.keys
        if section == "iteration":
            return "iteration" in self.keys
        if section == "rng":
            return "rng_state" in self.keys
        return None

    def asked(self, section: str, item: str, rank: int) -> bool | None:
        """Whether the load asked the checkpoint for a model item (None: not known for this section)."""
        if section not in ("model", "nonpersistent") or rank >= len(self.requested) or not self.requested[rank]:
            return None
        return item in self.requested[rank] or item in self.requested_keys


def _value(snapshots: list[dict[str, Any]] | None, rank: int, section: str, item: str) -> Any:
    snaps = snapshots or []
    if rank >= len(snaps) or not snaps[rank]:
        return None
    return (snaps[rank].get(section) or {}).get(item)


def how_restored(
    section: str, item: str, rank: int, saved: Any, restored: Any, before_load: list[dict[str, Any]] | None,
    ckpt: Checkpoint,
) -> str:
    """How an item whose restored value differs from the saved one was lost."""
    if ckpt.holds(section, item, rank) is False:
        return ABSENT
    if ckpt.asked(section, item, rank) is False:
        return SKIPPED
    if not before_load or not any(before_load):
        return NOT_RESTORED
    pre = _value(before_load, rank, section, item)
    if pre is not None and restored == pre and saved != pre:
        return SKIPPED
    return WRONG


def _row(section: str, item: str, rank: int, how: str, chained: bool, ckpt: Checkpoint, view: bool) -> dict[str, Any]:
    label, name = state_dict_name(section, item, chained)
    row: dict[str, Any] = {"section": label, "name": name, "how": how, "item": item}
    row["rank"] = None if view else rank
    # what says so: the checkpoint's listing (what it holds, what the load asked for) is evidence of its
    # own; a restored value equal to the one before the load can be chance (a norm weight still 1.0)
    strong = how == ABSENT or (how == SKIPPED and ckpt.asked(section, item, rank) is False)
    row["basis"] = "checkpoint listing" if strong else "values"
    key = ckpt.key_of(section, item, rank)
    if key is not None and key != name:
        row["checkpoint_key"] = key
    return row


def _chained(*snapshot_lists: list[dict[str, Any]] | None) -> bool:
    return any(k.startswith("o1.") for snaps in snapshot_lists for s in snaps or [] if s
               for sec in ("groups", "scaler") for k in (s.get(sec) or {}))


def _is_view(snapshots: list[dict[str, Any]] | None) -> bool:
    # a resharded run's one entry is the whole DP group's view (global_state.py), not rank 0's
    return bool(snapshots) and isinstance(snapshots[0], dict) and "view" in snapshots[0]  # type: ignore[index]


def _order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most telling first: what the checkpoint listing shows, then the commonest way the values say, by section.

    The commonest class leads because a value-based class can hold items by chance: main params re-derived
    from the loaded bf16 weights equal the fresh build's where the weight is still its init (1.0, 0.0).
    """
    sections = list(SECTION_LABELS.values())
    counts = _counts(rows)
    return sorted(rows, key=lambda r: (r.get("basis") != "checkpoint listing", -counts[r["how"]],
                                       HOW_ORDER.index(r["how"]) if r["how"] in HOW_ORDER else len(HOW_ORDER),
                                       sections.index(r["section"]) if r["section"] in sections else len(sections),
                                       r["rank"] if r["rank"] is not None else -1, r["name"]))


def restore_rows(baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> dict[str, list[dict[str, Any]]]:
    """{section: classified rows} for every item restored differently from what was saved."""
    saved = _probes(baseline).get(STATE_AT_SAVE)
    restored = _probes(resumed).get(STATE_AFTER_LOAD) or _probes(resumed).get(STATE_AFTER_LOAD_RAW)
    before = _probes(resumed).get(STATE_BEFORE_LOAD)
    ckpt = Checkpoint(_probes(resumed).get(CHECKPOINT_CONTENTS))
    chained, view = _chained(saved, restored), _is_view(saved)
    out: dict[str, list[dict[str, Any]]] = {}
    for section, diffs in snapshot_diffs(saved, restored).items():
        out[section] = []
        for d in diffs:
            how = how_restored(section, d["name"], d["rank"], d["before"], d["after"], before, ckpt)
            out[section].append(_row(section, d["name"], d["rank"], how, chained, ckpt, view))
    return out


def _uncompared_losses(baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> list[dict[str, Any]]:
    """Items of the sections a restore is not judged on whose restored value is not the saved one.

    A non-persistent buffer is not checkpointed by design; one that held state across the save
    (its saved value is not what the resume holds) is what a final-state difference points to first.
    """
    saved = _probes(baseline).get(STATE_AT_SAVE)
    restored = _probes(resumed).get(STATE_AFTER_LOAD) or _probes(resumed).get(STATE_AFTER_LOAD_RAW)
    before = _probes(resumed).get(STATE_BEFORE_LOAD)
    ckpt = Checkpoint(_probes(resumed).get(CHECKPOINT_CONTENTS))
    rows = []
    for section, diffs in snapshot_diffs(saved, restored, sections=UNCOMPARED).items():
        for d in diffs:
            if d["before"] is None or d["after"] is None:
                continue
            how = ABSENT if ckpt.holds(section, d["name"], d["rank"]) is not True else \
                how_restored(section, d["name"], d["rank"], d["before"], d["after"], before, ckpt)
            rows.append(_row(section, d["name"], d["rank"], how, False, ckpt, _is_view(saved)))
    return rows


def final_rows(
    baseline: PhaseDocument | None, resumed: PhaseDocument | None, sections: list[str] | None
) -> list[dict[str, Any]]:
    """Classified rows of the final-state difference: what the resume lost at the load first, then the rest."""
    final_b, final_r = _probes(baseline).get(STATE_FINAL), _probes(resumed).get(STATE_FINAL)
    restored = restore_rows(baseline, resumed)
    lost_at_load = {(r["item"], r["rank"]): r["how"] for rows in restored.values() for r in rows}
    ckpt = Checkpoint(_probes(resumed).get(CHECKPOINT_CONTENTS))
    chained, view = _chained(final_b, final_r), _is_view(final_b)
    rows = _uncompared_losses(baseline, resumed)
    for section, diffs in snapshot_diffs(final_b, final_r).items():
        if sections is not None and section not in sections:
            continue
        for d in diffs:
            rank = None if view else d["rank"]
            how = lost_at_load.get((d["name"], rank))
            if how is None:
                how = ABSENT if ckpt.holds(section, d["name"], d["rank"]) is False else DIVERGED
            rows.append(_row(section, d["name"], d["rank"], how, chained, ckpt, view))
    return rows


def save_rows(baseline: PhaseDocument | None) -> list[dict[str, Any]]:
    """Classified rows of what saving changed in the live run."""
    before, after = _probes(baseline).get(STATE_AT_SAVE), _probes(baseline).get(STATE_AFTER_SAVE)
    ckpt, chained, view = Checkpoint(None), _chained(before, after), _is_view(before)
    return [_row(s, d["name"], d["rank"], CHANGED_BY_SAVE, chained, ckpt, view)
            for s, diffs in snapshot_diffs(before, after).items() for d in diffs]


def _clip(name: str, room: int) -> str:
    return name if len(name) <= room else "…" + name[-max(room - 1, 8):]


def cause_line(slug: str, rows: list[dict[str, Any]]) -> str:
    """`slug: section name how (rank r; +k more)`, the first row being the most telling, bounded.

    `+k more` counts the other items lost (on any rank); the first item's ranks are named.

    When the items were lost in more than one way, the tail counts each: `(rank 0; +31 more: 27 loaded
    wrong, 5 skipped by the load)`.
    """
    first = rows[0]
    # the same item lost alike on other ranks is one item: `(ranks 0, 1)`, not `+1 more`
    same = [r for r in rows if (r["section"], r["name"], r["how"]) == (first["section"], first["name"], first["how"])]
    ranks = sorted({r["rank"] for r in same if r["rank"] is not None})
    more = len(rows) - len(same)
    if first["rank"] is None:
        where = "all ranks, one view"
    elif len(ranks) == 1:
        where = f"rank {ranks[0]}"
    else:
        where = "ranks " + ", ".join(map(str, ranks)) if len(ranks) <= 4 else f"{len(ranks)} ranks"
    counts = _counts(rows)
    ways = ": " + ", ".join(f"{n} {how}" for how, n in counts.items()) if len(counts) > 1 else ""
    tail = f" ({where}; +{more} more{ways})" if more else f" ({where})"
    fixed = f"{slug}: {first['section']}  {first['how']}{tail}"
    return f"{slug}: {first['section']} {_clip(first['name'], MAX_LINE - len(fixed))} {first['how']}{tail}"


def _rows_for(slug: str, found: dict[str, Any], restored: dict[str, list[dict[str, Any]]],
              baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> list[dict[str, Any]]:
    if slug == FINAL_STATE_MISMATCH:
        sections = found.get("sections")
        return final_rows(baseline, resumed, list(sections) if isinstance(sections, list) else None)
    if slug == SAVE_MUTATES_LIVE_STATE:
        return save_rows(baseline)
    rows = [r for section, name in RESTORE_SIGNATURES.items() if name == slug for r in restored.get(section, [])]
    if rows or not isinstance(found.get("items"), list):
        return rows
    # evidence from another probe of the same section (param groups right after optimizer.load_state_dict)
    section = str(found.get("section") or "")
    ckpt = Checkpoint(_probes(resumed).get(CHECKPOINT_CONTENTS))
    before = _probes(resumed).get(STATE_BEFORE_LOAD)
    return [_row(section, d["name"], d["rank"],
                 how_restored(section, d["name"], d["rank"], d.get("before"), d.get("after"), before, ckpt),
                 False, ckpt, False)
            for d in found["items"] if isinstance(d, dict) and "name" in d and "rank" in d and section in SECTIONS]


STATE_SIGNATURES = frozenset({*RESTORE_SIGNATURES.values(), FINAL_STATE_MISMATCH, SAVE_MUTATES_LIVE_STATE})


def annotate(evidence: dict[str, Any], baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> dict[str, str]:
    """Add `lost` (the classified items, most telling first) to every state-diff signature's evidence;
    return {signature: its cause line}."""
    restored = restore_rows(baseline, resumed)
    lines: dict[str, str] = {}
    for slug in sorted(STATE_SIGNATURES & set(evidence)):
        found = evidence[slug]
        if not isinstance(found, dict):
            continue
        rows = _order(_rows_for(slug, found, restored, baseline, resumed))
        if not rows:
            continue
        found["lost"] = {"count": len(rows), "hows": _counts(rows), "items": rows[:MAX_ITEMS]}
        lines[slug] = cause_line(slug, rows)
    return lines


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """{how: how many rows}, in the rows' order."""
    out: dict[str, int] = {}
    for r in rows:
        out[r["how"]] = out.get(r["how"], 0) + 1
    return out


def scalar_cause_lines(evidence: dict[str, Any]) -> dict[str, str]:
    """Cause lines of the findings that are not a lost tensor: a param-group identity collision and a
    scalar an optimizer applied differently (what on-call reads first, before the state items they move)."""
    lines: dict[str, str] = {}
    collision = evidence.get(PARAM_GROUP_IDENTITY_COLLISION)
    if isinstance(collision, dict) and collision.get("collisions"):
        first = collision["collisions"][0]
        (a, b), (bounds_a, bounds_b) = first["groups"], first["lr_bounds"]
        keys = ", ".join(collision.get("identifier_keys") or [])
        more = len(collision["collisions"]) - 1
        lines[PARAM_GROUP_IDENTITY_COLLISION] = (
            f"{PARAM_GROUP_IDENTITY_COLLISION}: optimizer {first['optimizer']} groups {a} and {b} (max/min lr "
            f"{_bounds(bounds_a)} vs {_bounds(bounds_b)}) share this build's identity keys ({keys}): the load "
            f"gave both one group's settings" + (f" (+{more} more)" if more else "")
        )
    for signature, scalar in ((LR_SCHEDULE_MISMATCH, "lr"), (PARAM_GROUP_SCALARS_MISMATCH, "weight_decay")):
        found = (evidence.get(signature) or {}).get(f"applied_{scalar}") if isinstance(evidence.get(signature),
                                                                                      dict) else None
        if found and found.get("items"):
            item = found["items"][0]
            more = found["count"] - 1
            lines[signature] = (
                f"{signature}: group {item['group']} applied {scalar} {_num(item['resumed'])} at step {item['step']} "
                f"where the uninterrupted run applied {_num(item['baseline'])}" + (f" (+{more} more)" if more else "")
            )
    return lines


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, (int, float)) else "nothing (no such group)"


def _bounds(pair: list[Any]) -> str:
    return "/".join(_num(v) for v in pair)
