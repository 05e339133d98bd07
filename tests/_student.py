"""What every lab's check tests share about right solutions written the ways students write them."""


def assert_student_solution_passes(checks: dict, solutions: dict, question: str, name: str, capsys):
    """``solutions[question][name]`` passes ``checks[question]`` with its pass line (which is shown)."""
    assert set(solutions) == set(checks)
    checks[question](solutions[question][name])
    out = capsys.readouterr().out
    assert out.startswith(f"{question} passed: "), out
    print(out)
