"""Megatron-Core's rerun state machine, run as Megatron-LM's trainer runs it (the `rerun_state_machine` config field).

Production trains with `check_for_nan_in_grad` on (each bucket's grad norm validated before its reduction,
through the machine) and `--rerun-mode validate_results`: every step's forward-backward runs inside
`should_run_forward_backward`, which would rerun it in place when a validation failed, and
`should_checkpoint_and_exit` may ask for a checkpoint or an exit. The machine's state goes into the
checkpoint (`state_dict`) and is restored by the load, which asks for its sharded part only where the common
entry says a rerun is under way (`load_template`, Megatron-LM's order); what a resume
must give back is compared in the snapshot (`fields()`). Its `current_iteration` counts steps since the
process started, upstream's design for reporting, so a resumed process restarts it: never compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KEY = "rerun_state_machine"  # its entry in the checkpoint's common state, as Megatron-LM names it


def start() -> None:
    """Install a machine in validate_results mode for this process (before the model is built)."""
    from megatron.core.rerun_state_machine import RerunMode, initialize_rerun_state_machine

    initialize_rerun_state_machine(mode=RerunMode.VALIDATE_RESULTS)


def _machine() -> Any:
    from megatron.core.rerun_state_machine import get_rerun_state_machine

    return get_rerun_state_machine()


def run_step(forward_backward: Callable[[], Any]) -> Any:
    """Run one step's forward-backward under the machine; refuse to go on where it asks for an exit."""
    machine = _machine()
    result = None
    while machine.should_run_forward_backward(None):  # no data iterator: batches are keyed by step
        result = forward_backward()
    _checkpoint, should_exit, code = machine.should_checkpoint_and_exit()
    if should_exit:
        raise RuntimeError(f"the rerun state machine asked the job to exit (code {code}): a validation failed")
    return result


def state_dict() -> Any:
    """What Megatron-LM saves of the machine (None while no rerun is under way)."""
    return _machine().state_dict(None, "torch_dist")


def load_template(saved: Any) -> dict[str, Any]:
    """What a load must ask the checkpoint for, as Megatron-LM's load_checkpoint asks: the machine's whole state
    (`force=True`, its per-rank ShardedObject included) where the checkpoint's common entry says a rerun is under
    way, else nothing (a resume on another layout ignores the machine's state, as Megatron-LM does)."""
    machine = _machine()
    if not machine.validate_state_dict(saved):
        return {}
    return {KEY: machine.state_dict(None, "torch_dist", force=True)}


def load(saved: Any) -> None:
    """Restore the machine from a checkpoint's entry, as Megatron-LM's load_checkpoint does: only where the load
    asked for its per-rank part (`load_template`: not on another layout, where Megatron-LM ignores it)."""
    machine = _machine()
    if machine.validate_state_dict(saved) and isinstance(saved, dict) and "sharded" in saved:
        machine.load_state_dict(saved)


def fields() -> dict[str, str]:
    """The machine's state a resume must give back, as snapshot text."""
    machine = _machine()
    saved = machine.state_dict(None, "torch_dist")
    return {
        f"{KEY}.mode": str(machine.get_mode()),
        f"{KEY}.state": str(machine.state),
        f"{KEY}.checkpoint": "none" if saved is None else str(saved.get("state")),
    }
