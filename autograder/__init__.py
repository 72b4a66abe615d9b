"""The course autograder: ``python -m autograder`` grades the labs against the reference engine.

Layout: ``test_labNN_*.py`` are ordinary pytest files (one per lab) that reach the student's code
only through ``adapters/labNN.py`` (which also swap the student's component into the real engine,
run by ``engine_runs.py``); ``hidden/test_labNN_*.py`` are the hidden tests (instructor's edition
only); ``plugin.py`` holds the pytest hooks that wire in points and visibility (``points.py``),
per-test process isolation (``runner.py``), failure messages (``explain.py``) and the results file
(``results.py``); ``__main__.py`` runs pytest per lab and turns the results into scores
(``report.py``); ``generate.py`` writes ``labs/`` from ``solutions/``; ``release.py`` writes the
student edition and ``gradescope/`` a Gradescope autograder. The guide is ``README.md``.
"""
