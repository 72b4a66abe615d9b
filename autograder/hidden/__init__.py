"""Hidden tests: instructor's edition only (``python -m autograder.release`` drops this folder).

``test_labNN_topic.py`` here holds the hidden tests of lab NN: graded with the visible ones by
``python -m autograder`` and on Gradescope, where students see them after the due date. They check
contract points the visible tests leave open, and together they are worth ``HIDDEN_POINTS`` of the
lab's 100 (``autograder/points.py``). A package, so their module names never clash with the visible
files of the same name.
"""
