"""Errors a user can cause. The CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input: a spec field, a data file, a checkpoint, a command-line value.

    The message is one line that names what is wrong, e.g.
    ``models[3].params.blocks: expected 4 positive integers, got [3, 0, 6, 3]``.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class UserCodeError(UserError):
    """The user's own code (a user model's builder or forward) raised, or called ``sys.exit``.

    Attributes:
        subject: whose code, e.g. ``"family 'mynets:tiny'"``.
        problem: what it did, e.g. ``"the builder called sys.exit(0)"``.
    """

    def __init__(self, subject: str, problem: str):
        super().__init__(f"{subject}: {problem}")
        self.subject, self.problem = subject, " ".join(problem.split())
