"""labs/ is what ``python -m autograder.generate`` last wrote from solutions/, and the generator turns
solution regions into loud stubs. Both editions run this file: the check reads the hashes recorded in
``labs/.generated.json``, never the lab files themselves (a student's edits never fail it), and in the
student edition, which has no solutions/, it checks that every recorded lab is there. The tests that
need solutions/ are in test_generate_from_solutions.py (instructor-only)."""

from __future__ import annotations

import pytest

from autograder.generate import GenerateError, differences, make_stub


def test_labs_are_generated_from_solutions():
    problems = differences()
    assert not problems, (
        "labs/ is out of date: " + "; ".join(problems) + ". Run `python -m autograder.generate` (it keeps edited "
        "labs unless --force, which saves a copy in labs/.backup/ first)"
    )


def test_make_stub_replaces_regions_and_keeps_the_rest():
    src = (
        '"""Contract."""\n'
        "import torch\n\n\n"
        "def f(x):\n"
        '    """Docstring kept."""\n'
        '    # BEGIN SOLUTION hint="add one"\n'
        "    y = x + 1\n"
        "    return y\n"
        "    # END SOLUTION\n\n\n"
        "class C:\n"
        "    def g(self):\n"
        "        # BEGIN SOLUTION\n"
        "        return 2\n"
        "        # END SOLUTION\n"
    )
    out = make_stub(src, "07")
    assert '    """Docstring kept."""\n    raise NotImplementedError("Lab 07: add one")\n' in out
    assert '        raise NotImplementedError("Lab 07: implement this part;' in out
    assert "y = x + 1" not in out and "return 2" not in out
    assert out.startswith('"""Contract."""\nimport torch\n')
    namespace: dict = {}
    exec(compile(out, "<stub>", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="Lab 07: add one"):
        namespace["f"](1)


@pytest.mark.parametrize(
    "src, problem",
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", "never closed"),
        ("def f():\n    return 1\n    # END SOLUTION\n", "without a BEGIN"),
        ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    # END SOLUTION\n", "inside the region"),
        ("def f():\n    # BEGIN SOLUTION hint=oops\n    return 1\n    # END SOLUTION\n", "malformed marker"),
    ],
)
def test_make_stub_rejects_broken_markers(src, problem):
    with pytest.raises(GenerateError, match=problem):
        make_stub(src, "01")
