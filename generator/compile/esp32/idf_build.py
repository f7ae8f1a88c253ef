"""Building a generated ESP-IDF project with ESP-IDF's own idf.py, where ESP-IDF is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ...errors import ColibriError
from ..build import run_echoing


def find_idf() -> Path | None:
    """idf.py on PATH (ESP-IDF's export.sh puts it there), else $IDF_PATH/tools/idf.py."""
    found = shutil.which("idf.py")
    if found:
        return Path(found)
    idf_path = os.environ.get("IDF_PATH")
    if idf_path and (Path(idf_path) / "tools" / "idf.py").is_file():
        return Path(idf_path) / "tools" / "idf.py"
    return None


def idf_build(project_dir: Path, echo=None, min_version: str = "5.5.3") -> None:
    """Run `idf.py build` in project_dir, passing its output to `echo`; a failure is one ColibriError line.
    (min_version, the board's [idf] min_version, only goes into the message when ESP-IDF is missing.)"""
    project_dir = Path(project_dir)
    if not (project_dir / "CMakeLists.txt").is_file():
        raise ColibriError(f"{project_dir} is not an ESP-IDF project (no CMakeLists.txt): generate it first")
    idf = find_idf()
    if idf is None:
        raise ColibriError(
            f"ESP-IDF not found (no idf.py on PATH and IDF_PATH is not set): install ESP-IDF "
            f">= {min_version} and run '. $IDF_PATH/export.sh', or build {project_dir} on a machine that has it"
        )
    env = dict(os.environ, LC_ALL="C", TZ="UTC")
    env.setdefault("SOURCE_DATE_EPOCH", "0")
    returncode, lines = run_echoing(
        [str(idf), "-C", str(project_dir), "build"],
        env,
        echo or (lambda line: None),
        lambda strerror: f"cannot run {idf}: {strerror} (run '. $IDF_PATH/export.sh' first)",
        stdin=subprocess.DEVNULL,
    )
    if returncode != 0:
        errors = [ln.strip() for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE) and ln.strip()]
        tail = [ln.strip() for ln in lines if ln.strip()]
        detail = (errors or tail or ["no output"])[0 if errors else -1]
        raise ColibriError(f"idf.py build failed in {project_dir} (exit {returncode}): {detail[:300]}")
