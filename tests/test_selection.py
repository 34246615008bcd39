"""Selection end to end: real repositories, real pytest recording, the real CLI."""

from __future__ import annotations

import json

ALL = {
    "tests/test_norms.py::test_rms", "tests/test_norms.py::test_l1",
    "tests/test_model.py::test_forward", "tests/test_model.py::test_width",
    "tests/test_model.py::test_offsets", "tests/test_model.py::test_config_file",
    "tests/test_model.py::test_bias[1]", "tests/test_model.py::test_bias[2]",
}


def test_recording_covers_every_test(library):
    result = library.select()
    assert {t["id"] for t in result["tests"]} == ALL
    assert result["summary"]["selected"] == 0
    assert result["mode"] == "trace-diff"


def test_comment_docstring_and_whitespace_edits_select_nothing(library):
    library.edit("calc/norms.py", '"""Root mean square."""', '"""Root mean square (RMS)."""')
    library.edit("calc/norms.py", "    eps = EPS if",
                 "    # fall back to the default\n    eps = EPS if")
    library.edit("calc/model.py", "class Model:", "\n\nclass Model:  # the model")
    assert library.selected() == set()


def test_changed_function_selects_exactly_its_callers(library):
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)", "return sum(x for x in xs)")
    assert library.selected() == {"tests/test_norms.py::test_l1"}


def test_constant_imported_by_name_selects_its_readers(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    selected = library.selected()
    # rms reads EPS; model.py imports EPS by name (and forward calls rms).
    assert {"tests/test_norms.py::test_rms", "tests/test_model.py::test_forward"} <= selected
    assert "tests/test_norms.py::test_l1" not in selected
    assert "tests/test_model.py::test_config_file" not in selected


def test_class_attribute_change_selects_users_of_the_class(library):
    library.edit("calc/model.py", "bias = 0.5", "bias = 0.25")
    selected = library.selected()
    assert {"tests/test_model.py::test_bias[1]", "tests/test_model.py::test_bias[2]",
            "tests/test_model.py::test_forward"} <= selected
    assert not selected & {"tests/test_norms.py::test_rms", "tests/test_norms.py::test_l1"}


def test_dataclass_default_change_selects_tests_using_the_default(library):
    library.edit("calc/config.py", "width: int = 4", "width: int = 5")
    selected = library.selected()
    # The session fixture builds Config() with the defaults: every test using it depends on it.
    assert "tests/test_model.py::test_width" in selected
    assert "tests/test_model.py::test_forward" in selected
    assert "tests/test_norms.py::test_l1" not in selected


def test_session_fixture_code_is_credited_to_every_test_that_uses_it(library):
    library.edit("tests/conftest.py", "return Config()", "return Config(width=4)")
    selected = library.selected()
    users = {t for t in ALL if "test_model" in t and "config_file" not in t}
    assert users <= selected
    assert "tests/test_norms.py::test_rms" not in selected


def test_config_file_change_selects_the_tests_that_read_it(library):
    library.write({"configs/small.cfg": "width = 9\n"})
    result = library.select()
    selected = {t["id"] for t in result["tests"] if t["decision"] == "selected"}
    assert selected == {"tests/test_model.py::test_config_file"}
    reasons = next(t["reasons"] for t in result["tests"] if t["decision"] == "selected")
    assert any("configs/small.cfg" in r for r in reasons)


def test_import_time_function_change_selects_importers(library):
    library.edit("calc/model.py", "return [1, 2, 3]", "return [1, 2, 4]")
    selected = library.selected()
    assert "tests/test_model.py::test_offsets" in selected
    assert "tests/test_norms.py::test_rms" not in selected


def test_renamed_module_selects_its_users(library):
    library.git("mv", "calc/norms.py", "calc/norms2.py")
    selected = library.selected()
    assert {"tests/test_norms.py::test_rms", "tests/test_norms.py::test_l1",
            "tests/test_model.py::test_forward"} <= selected
    assert any("renamed" in r for t in library.select()["tests"] for r in t["reasons"])


def test_removed_module_selects_its_importers(library):
    (library.root / "calc/norms.py").unlink()
    selected = library.selected()
    assert {"tests/test_norms.py::test_rms", "tests/test_model.py::test_width"} <= selected


def test_new_test_is_selected_as_new(library):
    library.write({"tests/test_new.py": "def test_fresh():\n    assert True\n"})
    result = library.select()
    fresh = [t for t in result["tests"] if t["id"] == "tests/test_new.py::test_fresh"]
    assert fresh and fresh[0]["decision"] == "selected" and fresh[0]["new"]
    assert result["summary"]["selected"] == 1


def test_edited_test_is_selected_for_its_own_code(library):
    library.edit("tests/test_norms.py", "assert l1([-1, 2]) == 3", "assert l1([-1, 2, 0]) == 3")
    result = library.select()
    chosen = [t for t in result["tests"] if t["decision"] == "selected"]
    assert [t["id"] for t in chosen] == ["tests/test_norms.py::test_l1"]
    assert any("own code" in r for r in chosen[0]["reasons"])


def test_parametrize_list_change_selects_that_test(library):
    library.edit("tests/test_model.py", '[1, 2]', '[1, 2, 3]')
    selected = library.selected()
    assert {"tests/test_model.py::test_bias[1]", "tests/test_model.py::test_bias[2]"} <= selected
    assert "tests/test_norms.py::test_rms" not in selected


def test_failed_test_is_selected_until_it_passes(project):
    from conftest import LIBRARY

    project.write({**LIBRARY, "tests/test_flaky.py": "def test_fails():\n    assert False\n"})
    project.commit()
    proc = project.fastci("record", "-q", "--", "-q", "-p", "no:cacheprovider", check=False)
    assert proc.returncode == 1  # pytest's verdict passes through
    result = project.select()
    chosen = {t["id"]: t for t in result["tests"] if t["decision"] == "selected"}
    assert set(chosen) == {"tests/test_flaky.py::test_fails"}
    reasons = chosen["tests/test_flaky.py::test_fails"]["reasons"]
    assert any("failed in the last run" in r for r in reasons)


def test_dependency_manifest_change_selects_everything(library):
    library.edit("pyproject.toml", "dependencies = []", 'dependencies = ["numpy"]')
    result = library.select()
    assert result["mode"] == "all"
    assert "pyproject.toml" in result["select_all_reason"]
    assert result["summary"]["selected"] == len(ALL)


def test_requirements_file_change_selects_everything(library):
    library.write({"requirements.txt": "numpy==2.0\n"})
    assert library.selected() == ALL


def test_pytest_ini_change_selects_everything(library):
    library.write({"pytest.ini": "[pytest]\naddopts = -x\n"})
    result = library.select()
    assert result["mode"] == "all" and "pytest" in result["select_all_reason"]


def test_native_source_change_selects_everything(library):
    library.write({"csrc/kernel.cu": "__global__ void k() {}\n"})
    result = library.select()
    assert result["mode"] == "all" and "native" in result["select_all_reason"]


def test_conftest_module_body_change_selects_its_directory(library):
    library.write({
        "tests/unit/conftest.py": "LIMIT = 3\n",
        "tests/unit/test_unit.py": "def test_unit():\n    assert True\n",
    })
    library.commit("unit tests")
    library.record()
    library.edit("tests/unit/conftest.py", "LIMIT = 3",
                 "import os\nos.environ['X'] = '1'\nLIMIT = 3")
    selected = library.selected()
    assert selected == {"tests/unit/test_unit.py::test_unit"}


def test_unparseable_file_selects_its_dependants_and_says_why(library):
    library.edit("calc/norms.py", "def l1(xs):", "def l1(xs:")
    result = library.select()
    chosen = {t["id"]: t for t in result["tests"] if t["decision"] == "selected"}
    assert {"tests/test_norms.py::test_l1", "tests/test_norms.py::test_rms",
            "tests/test_model.py::test_forward"} <= set(chosen)
    assert any("does not parse" in r for r in chosen["tests/test_norms.py::test_l1"]["reasons"])


def test_unresolvable_module_statement_selects_importers(library):
    library.edit("calc/norms.py", 'EPS = 1e-6', 'EPS = 1e-6\nprint("loading norms")')
    selected = library.selected()
    assert {"tests/test_norms.py::test_rms", "tests/test_norms.py::test_l1",
            "tests/test_model.py::test_width"} <= selected  # all import calc.norms
    assert "tests/test_model.py::test_config_file" in selected  # test_model imports model->norms


def test_base_without_evidence_selects_everything_and_says_why(project):
    from conftest import LIBRARY

    project.write(LIBRARY)
    project.commit()
    result = project.select()
    assert result["mode"] == "all"
    assert "no evidence" in result["select_all_reason"]
    assert result["summary"]["selected"] == result["summary"]["total"] > 0


def test_nearest_ancestor_with_evidence_is_used(library):
    base = library.git("rev-parse", "HEAD")
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)", "return sum(x for x in xs)")
    library.commit("no evidence for this one")
    library.edit("calc/model.py", "bias = 0.5", "bias = 0.5  # same")
    result = library.select()
    assert result["base"] == base
    assert {t["id"] for t in result["tests"] if t["decision"] == "selected"} == \
        {"tests/test_norms.py::test_l1"}


def test_select_between_two_commits(library):
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)", "return sum(x for x in xs)")
    head = library.commit("l1 change")
    library.edit("calc/model.py", "bias = 0.5", "bias = 0.1")  # uncommitted: not in --head
    assert library.selected("--base", "HEAD~1", "--head", head) == {"tests/test_norms.py::test_l1"}


def test_evidence_from_another_environment_selects_everything(library):
    from fastci.runner.store import SqliteEvidenceStore

    store_path = library.root / ".fastci" / "evidence.db"
    with SqliteEvidenceStore(store_path) as store:
        store._db.execute("UPDATE snapshots SET env='0000', env_json=replace(env_json, "
                          "'\"python\": \"', '\"python\": \"2.7-')")
    result = library.select()
    assert result["mode"] == "all"
    assert "another environment" in result["select_all_reason"]


def test_ids_format_lists_selected_in_run_order(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    ids = library.fastci("select", "-q", "--format", "ids").stdout.split()
    data = library.select()
    ranked = [t["id"] for t in data["tests"] if t["decision"] == "selected"]
    assert ids == ranked
    assert [t["rank"] for t in data["tests"] if t["decision"] == "selected"] == \
        list(range(1, len(ranked) + 1))


def test_json_contract(library):
    library.edit("calc/norms.py", "EPS = 1e-6", "EPS = 1e-3")
    data = library.select()
    assert data["schema"] == "fastci.selection/1"
    assert set(data) >= {"base", "head", "mode", "select_all_reason", "tests", "summary"}
    for test in data["tests"]:
        assert set(test) >= {"id", "decision", "risk", "reasons", "expected_seconds", "rank"}
        assert test["decision"] in ("selected", "skipped")
        assert 0.0 <= test["risk"] <= 1.0
        assert test["reasons"], "every decision carries a reason"
    summary = data["summary"]
    assert summary["selected"] + summary["skipped"] == summary["total"] == len(data["tests"])
    json.dumps(data)


def test_default_base_is_the_merge_base_with_the_default_branch(library):
    base = library.git("rev-parse", "HEAD")
    library.git("checkout", "-q", "-b", "feature")
    library.edit("calc/norms.py", "return sum(abs(x) for x in xs)", "return sum(x for x in xs)")
    library.commit("feature work")
    library.git("checkout", "-q", "main")
    library.edit("calc/model.py", "bias = 0.5", "bias = 0.6")
    library.commit("main moves on, without evidence")
    library.git("checkout", "-q", "feature")
    result = library.select()
    assert result["base"] == base
    assert {t["id"] for t in result["tests"] if t["decision"] == "selected"} == \
        {"tests/test_norms.py::test_l1"}
