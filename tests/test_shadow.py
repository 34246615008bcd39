"""Shadow mode and the audit: select, run everything, record what the selection missed."""

from __future__ import annotations

import json

FILES = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_calc.py": '''
        import os

        from pkg.calc import add, mul


        def test_add():
            assert add(1, 2) == 3


        def test_mul():
            assert mul(2, 3) == 6


        def test_environment():
            # Depends on something no evidence can see: the selection cannot know.
            assert os.environ.get("BREAK") != "1"
    ''',
}


def test_shadow_runs_everything_and_the_audit_reports_what_escaped(project):
    project.write(FILES)
    project.commit("calc")
    project.record()
    project.edit("pkg/calc.py", "return a * b", "return b * a")
    env = {"FASTCI_MODE": "shadow", "BREAK": "1"}
    run = project.fastci("run", "-q", "--json", "report.json", check=False, env=env)
    assert run.returncode == 1
    report = json.loads((project.root / "report.json").read_text())
    assert report["summary"]["ran"] == 3  # everything ran ...
    assert report["summary"]["selected"] == 1  # ... though the selection was test_mul
    assert "would have run 1 and missed 1 failure(s): tests/test_calc.py::test_environment" \
        in run.stdout
    audit = project.fastci("audit", check=False)
    assert audit.returncode == 1  # a failure escaped the selection
    assert "ESCAPED tests/test_calc.py::test_environment" in audit.stdout
    assert "1 audited runs in the store: 1 escaped failure(s) of 1" in audit.stdout
    [entry] = json.loads(project.fastci("audit", "--json", "--since-days", "1",
                                        check=False).stdout)
    assert entry["kind"] == "shadow" and entry["missed"] == ["tests/test_calc.py::test_environment"]
    assert entry["selected"] == 1 and entry["total"] == 3


def test_an_audit_without_runs_says_how_to_get_some(project):
    project.write(FILES)
    project.commit("calc")
    project.record()
    audit = project.fastci("audit")
    assert "no audited runs" in audit.stdout and 'mode = "shadow"' in audit.stdout
    bad = project.fastci("audit", "--since-days", "-1", check=False)
    assert bad.returncode == 2 and "must not be negative" in bad.stderr
