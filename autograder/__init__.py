"""The course autograder: ``python -m autograder`` grades the labs against the reference engine.

Layout: ``test_labNN_*.py`` are ordinary pytest files (one per lab) that reach the student's code
only through ``adapters/labNN.py`` (which also swap the student's component into the real engine,
run by ``engine_runs.py``); ``plugin.py`` holds the pytest hooks that wire in points
(``points.py``), per-test process isolation (``runner.py``), failure messages (``explain.py``) and
the results file (``results.py``); ``__main__.py`` runs pytest per lab and turns the results into
scores; ``generate.py`` writes ``labs/`` from ``solutions/``.
"""
