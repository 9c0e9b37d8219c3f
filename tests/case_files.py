"""What the tests of translated case files (cases/fla-tests, cases/tops-tests) share."""

from pathlib import Path


def header(path: Path) -> str:
    """The file's leading comment block."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)
