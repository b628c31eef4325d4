"""Whether a checkpoint stage crashed inside the build's own code: a regression of the build, not a harness error.

A save or load that raises from Megatron-Core's own frames (an assertion in its sharded state dict, a
dist-checkpointing validation, a KeyError in an optimizer's load) is the build failing to checkpoint or to
resume: the PR broke it, as much as one that loads the wrong tensor. It is judged `fail`, naming the frame.
Everything else that crashes stays `error`: the harness's own frames (jobs/), torch's and gloo's (a rank
that died, a peer that closed), and the host's (a full disk, no memory, a timeout), since those say
nothing about the build. The traceback is the job's text: only parsed, never trusted beyond its frames.
"""

from __future__ import annotations

import re

from jobs.contract import ErrorRecord

# the stages whose exception, raised in the build's own frames, is the build's answer: its checkpoint save and
# load, and its import (a wheel whose megatron.core does not import cannot train, so cannot resume)
BUILD_STAGES = ("save", "load", "import")
# exception types that come from the host or the transport, whichever frame raised them
HOST_ERRORS = frozenset({
    "OSError", "IOError", "FileNotFoundError", "PermissionError", "MemoryError", "TimeoutError",
    "KeyboardInterrupt", "SystemExit", "DistBackendError", "DistNetworkError", "ConnectionError",
    "BrokenPipeError", "ConnectionResetError", "StageTimeout",
})
_FRAME = re.compile(r'File "([^"\n]+)", line \d+, in ([^\s]+)')
_BUILD = "/megatron/core/"
_TORCH = "/torch/"
_TRANSPORT = "/torch/distributed/"
_PASS_THROUGH = "/jobs/rank/cpu_shim.py"  # its wrappers forward torch calls on a CPU host unchanged


def raised_in_build(error: ErrorRecord) -> str | None:
    """The build's frame (`megatron/core/<path>:<function>`) a save, load or import stage's exception was raised in,
    or None."""
    if error.get("stage") not in BUILD_STAGES or str(error.get("type")) in HOST_ERRORS:
        return None
    # the innermost frames of the exception that ended the stage, without the harness's pass-through shim
    frames = [f for f in _FRAME.findall(str(error.get("traceback") or "")) if _PASS_THROUGH not in f[0]]
    # a tensor op that raised on what the build handed it (a shape, a dtype) is the build's: walk out of torch,
    # but never out of torch.distributed (a peer that died raises there, whoever called it)
    while frames and _TORCH in frames[-1][0] and _TRANSPORT not in frames[-1][0]:
        frames.pop()
    if not frames:
        return None
    path, function = frames[-1]
    at = path.rfind(_BUILD)
    if at < 0:
        return None
    return f"megatron/core/{path[at + len(_BUILD):]}:{function}"[:300]
