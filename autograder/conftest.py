"""Fixtures of the lab tests and the autograder plugin's hooks (see ``plugin.py``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from autograder.plugin import (  # noqa: F401  (pytest finds hooks by name in a conftest)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_runtest_setup,
)

os.environ.setdefault("OMP_NUM_THREADS", "1")

# derandomized: every grading run sees the same examples; no database written into the repo. A student's
# failure is shrunk to its smallest example; MINISGL_AG_NO_SHRINK=1 (the instructor's suite, grading hundreds
# of mutants that only need to fail) skips shrinking: the same tests fail, with a larger example.
_SHRINK = [] if os.environ.get("MINISGL_AG_NO_SHRINK") == "1" else [Phase.shrink]
settings.register_profile(
    "autograder",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    phases=[Phase.explicit, Phase.generate, *_SHRINK],  # no "explain" phase: it costs seconds per failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("autograder")


@pytest.fixture(scope="session")
def tiny_llama():
    from autograder.models import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen3():
    from autograder.models import tiny_model

    return tiny_model("qwen3")
