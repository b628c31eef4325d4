"""Every config as plain data, for the API's and the CLI's listings: its parameters, the shape fields a spec
may override and the parallel layouts it can run with.

Its own module because it reads the config catalogue (jobs/configs.py) and the rules that take a config
(jobs/shape.py, jobs/parallel_layout.py): kept in jobs/configs.py it made those three import each other.
Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from jobs.configs import config_names, get_config
from jobs.parallel_layout import config_layouts
from jobs.shape import shape_fields


def list_configs() -> list[dict[str, Any]]:
    """Return every config as plain data: name, description, why, parameters, expected, shape fields, layouts."""
    return [
        {
            "name": c.name,
            "description": c.description,
            "why": c.why,
            "parameters": c.parameters,
            "expected": dict(c.expected),
            # the Megatron-Core settings the config switches on (what a production run would set)
            "megatron": c.megatron_settings,
            # beyond CPU Megatron-Core: a GPU check, run where a GPU is present ([] on CPU)
            "requires": list(c.requires),
            # what a spec's `shape` may override on this preset: range, description, preset value
            "shape_fields": shape_fields(c),
            "layouts": config_layouts(c),  # tp / pp / ep sizes this config can run with
        }
        for c in (get_config(n) for n in config_names())
    ]
