"""What the PNG writers share: matplotlib without a display, and saving with a one-line error."""

from __future__ import annotations

from fleet.errors import UserError


def pyplot():
    """matplotlib.pyplot on the Agg backend (batch nodes have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str, what: str = "") -> None:
    """Save `fig` to `path` and close it; `what` prefixes the error (e.g. ``"--chart: "``).

    Raises:
        UserError: the file cannot be written.
    """
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UserError(f"{what}cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
