"""One adapter per lab: the only way the tests reach a student's code. Each exposes exactly the
interface its tests use and loads the lab module lazily (inside the test, never at collection),
so a broken submission fails tests instead of breaking the grader. A lab's swap-in (the real
engine running the student's component) lives in its adapter too."""
