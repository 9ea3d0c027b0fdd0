"""Plain-text tables, the one renderer the command line and the text report share."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def text_table(header: Sequence[object], rows: Sequence[Sequence[object]], *,
               left: Collection[int] | None = None) -> str:
    """Columns separated by two spaces, a dashed line under the header, trailing spaces cut.

    Columns whose index is in ``left`` are left-aligned and the others right-aligned; by default
    (``left=None``) a column is right-aligned when every cell below the header is a number.
    """
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    n = len(cells[0])
    widths = [max(len(row[i]) for row in cells) for i in range(n)]
    if left is None:
        left = {i for i in range(n) if len(cells) == 1 or not all(_is_number(row[i]) for row in cells[1:])}

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])])
