"""Install a real (tiny) distribution into a folder on sys.path, for entry-point tests.

A `NAME-VERSION.dist-info` folder with METADATA and entry_points.txt is exactly what pip
writes; `importlib.metadata` finds it on sys.path like any installed package, so tests of
plugin loading go through the real discovery, not a mock.
"""

from __future__ import annotations

from pathlib import Path


def install_dist(root: Path, name: str, entry_points: dict[str, dict[str, str]],
                 modules: dict[str, str] | None = None, version: str = "1.0") -> Path:
    """Write `modules` ({"pkg_mod": source}) and the dist-info of `name` into `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in (modules or {}).items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info
