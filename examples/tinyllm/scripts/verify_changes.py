"""Apply each patch in changes/ to a pristine copy of the project and run the suite.

For every entry of changes/changes.yaml this checks that the patch applies
with ``git apply`` and that the set of failing tests equals the recorded
``failing_tests`` (and ``expect_failures`` agrees with it). ``--write``
records the observed failures instead of checking them.

Usage: python scripts/verify_changes.py [--write] [name ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHANGES = ROOT / "changes" / "changes.yaml"
HEADER = """\
# Example changes against this tree, used to exercise test selection.
# Each patch applies with `git apply` from the project root to the pristine
# tree, independently of the others. Apply them in a standalone copy of the
# project: inside an enclosing git repository `git apply` silently skips
# paths outside the current directory (from that repository's root, use
# `git apply --directory=examples/tinyllm` instead). failing_tests are the
# pytest node ids that fail with the patch applied (CPU, TRITON_INTERPRET=1);
# they are recorded by `python scripts/verify_changes.py --write`.
"""


def failing_tests(patch: Path) -> list[str]:
    """Node ids failing (or erroring) with ``patch`` applied to a copy of ROOT."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "project"
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "changes", ".git"))
        subprocess.run(["git", "apply", "--check", str(patch)], cwd=work, check=True)
        subprocess.run(["git", "apply", str(patch)], cwd=work, check=True)
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
            cwd=work, env=env, stdout=subprocess.DEVNULL, check=False,
        )
        failed = []
        for case in ET.parse(report).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                module = case.get("classname").replace(".", "/") + ".py"
                failed.append(f"{module}::{case.get('name')}")
        return sorted(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record observed failures in changes.yaml")
    parser.add_argument("names", nargs="*", help="only these changes (default: all)")
    args = parser.parse_args()

    spec = yaml.safe_load(CHANGES.read_text())
    mismatches = 0
    for change in spec["changes"]:
        if args.names and change["name"] not in args.names:
            continue
        observed = failing_tests(ROOT / "changes" / change["patch"])
        print(f"{change['name']}: {len(observed)} failing")
        if args.write:
            change["failing_tests"] = observed
            change["expect_failures"] = bool(observed)
        elif observed != sorted(change["failing_tests"]) or change["expect_failures"] != bool(observed):
            mismatches += 1
            print(f"  MISMATCH: recorded {change['failing_tests']}, observed {observed}")
    if args.write:
        CHANGES.write_text(HEADER + yaml.safe_dump(spec, sort_keys=False, width=120))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
