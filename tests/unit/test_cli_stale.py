"""The warm runner's check that the m27 code it imported is still the code on disk."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import m27.cli._stale as stale


def test_stamps_cover_the_imported_m27_modules_and_nothing_else() -> None:
    stamps = stale.code_stamps()
    assert stale.__file__ in stamps and sys.modules["m27"].__file__ in stamps
    m27_dir = str(Path(sys.modules["m27"].__file__ or "").parent)
    assert all(f.startswith(m27_dir) or "flows" in f for f in stamps)
    assert not any("site-packages/prefect" in f for f in stamps)
    assert stale.first_changed(stamps) is None


def test_a_touched_rewritten_or_removed_file_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("x = 1\n")
    for name, file in (("fakepkg", "__init__.py"), ("fakepkg.mod", "mod.py")):
        module = types.ModuleType(name)
        module.__file__ = str(pkg / file)
        sys.modules[name] = module
    try:
        stamps = stale.code_stamps(("fakepkg",))
        assert set(stamps) == {str(pkg / "__init__.py"), str(pkg / "mod.py")}
        assert stale.first_changed(stamps) is None
        st = os.stat(pkg / "mod.py")
        os.utime(pkg / "mod.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        assert stale.first_changed(stamps) == str(pkg / "mod.py")
        stamps = stale.code_stamps(("fakepkg",))
        (pkg / "mod.py").unlink()
        assert stale.first_changed(stamps) == str(pkg / "mod.py")
    finally:
        del sys.modules["fakepkg"], sys.modules["fakepkg.mod"]
