"""The examples in the main verbs' docstrings run as written and print what they show (doctest)."""

import doctest

import pytest

import gkl_jax as gk

MAIN_VERBS = {
    "fit": gk.fit, "bound": gk.bound, "predict": gk.predict, "save": gk.save,
    "laplace": gk.laplace, "ep": gk.ep, "local": gk.local, "double_loop": gk.double_loop, "ais": gk.ais,
    "gp.predict": gk.gp.predict, "gp.fit_hyperparameters": gk.gp.fit_hyperparameters,
    "multiclass.GPClassifier": gk.multiclass.GPClassifier,
}
SLOW = {"ais", "gp.fit_hyperparameters"}     # 10-30 s of compilation each: not in the quick subset


def _examples(obj):
    return [t for t in doctest.DocTestFinder(recurse=False).find(obj) if t.examples]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(MAIN_VERBS)])
def test_main_verb_example_runs_and_prints_what_it_shows(name):
    tests = _examples(MAIN_VERBS[name])
    assert tests, f"{name}'s docstring has no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
