"""What a build job imports in its own process stays light: a gate pays it on every uploaded wheel.

The build job runs recipe.build_environment (submitit pickles the function; the job imports its module).
Merging the stdlib-only artifact line parser into the artifact store once pulled SQLAlchemy and the models
into every build (0.13 -> 0.7 s of imports, and the build then missed the scheduler's first look at it).
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("sqlalchemy", "fastapi", "starlette", "pydantic", "psycopg", "psycopg_pool", "models", "torch", "megatron",
         "uvicorn", "jinja2", "alembic")


def test_the_build_jobs_module_imports_no_service_stack() -> None:
    code = ("import json, sys; import service.environments.recipe; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
