"""The course autograder: ``python -m autograder`` grades the labs against the reference engine.

Layout: ``test_labNN_*.py`` are ordinary pytest files (one per lab) that reach the student's code
only through ``adapters/labNN.py``; ``plugin.py`` adds points, per-test process isolation and the
results file; ``__main__.py`` runs pytest per lab and turns the results into scores;
``generate.py`` writes ``labs/`` from ``solutions/``.
"""
