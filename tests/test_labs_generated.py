"""labs/ is exactly what ``python -m autograder.generate`` writes from solutions/, and the
generator turns solution regions into loud stubs."""

from __future__ import annotations

import ast
import re

import pytest

from autograder.generate import LABS_DIR, SOLUTIONS_DIR, GenerateError, differences, expected_labs, make_stub


def test_labs_are_generated_from_solutions():
    problems = differences()
    assert not problems, (
        "labs/ is out of date with solutions/: " + "; ".join(problems) + ". Run `python -m autograder.generate` "
        "(never edit labs/ by hand)"
    )


def test_every_region_becomes_a_stub_with_a_hint():
    for name, text in expected_labs().items():
        lab = re.match(r"lab(\d\d)_", name).group(1)
        solution = (SOLUTIONS_DIR / name).read_text()
        regions = solution.count("# BEGIN SOLUTION")
        stubs = re.findall(r'raise NotImplementedError\("Lab (\d\d): ([^"]+)"\)', text)
        assert regions > 0, f"solutions/{name} has no # BEGIN SOLUTION region: the lab would be complete already"
        assert len(stubs) == regions, f"labs/{name}: {len(stubs)} stubs for {regions} solution regions"
        assert {n for n, _ in stubs} == {lab}, f"labs/{name}: stubs must say 'Lab {lab}:', got {stubs}"
        assert "SOLUTION" not in text, f"labs/{name} still contains a solution marker"
        doc = ast.get_docstring(ast.parse(text))
        assert doc and f"python -m autograder lab{lab}" in doc, (
            f"labs/{name} must start with a docstring stating the contract and the grading command"
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


def test_labs_folder_is_committed_next_to_solutions():
    assert sorted(p.name for p in LABS_DIR.glob("lab*.py")) == sorted(expected_labs())
