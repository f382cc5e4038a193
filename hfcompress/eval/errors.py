"""The evaluation harness's errors (below every other eval module: no import cycles)."""


class EvalError(ValueError):
    """Bad input to the evaluation harness (the CLI prints it without a traceback)."""


class TaskError(EvalError):
    """A task name that cannot be evaluated (unknown, or its data is unreachable)."""
