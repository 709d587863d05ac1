"""Where the grammar, templates and standard library live, in a checkout and in an installed wheel.

In a checkout (or an editable install) they sit at the repository root; a wheel carries copies
under `axdsl/_data/` (see pyproject.toml). The package-internal copy wins when present.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_DATA = PACKAGE_DIR / "_data"
_ROOT = PACKAGE_DIR.parent


def _find(name: str) -> Path:
    for base in (_DATA, _ROOT):
        candidate = base / name
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"axdsl installation is missing its {name}/ directory")


def grammar_path() -> Path:
    return _find("grammar") / "axdsl.lark"


def templates_dir() -> Path:
    return _find("templates")


def std_dir() -> Path:
    """The standard library of layers, written in .axl; `import "std/x.axl"` reads from here."""
    return PACKAGE_DIR / "std"
