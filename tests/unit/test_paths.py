"""`paths.real_file` resolves as os.path.realpath does, with its directories cached."""

import os

from fastci.runner.record.paths import real_file


def test_real_file_resolves_links_of_directories_and_of_the_file_itself(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    outside = tmp_path / "site"
    outside.mkdir()
    (outside / "linked_dir").symlink_to(repo / "pkg")  # an installed package linked in
    (outside / "linked.py").symlink_to(repo / "pkg" / "mod.py")  # one file linked in
    (outside / "plain.py").write_text("y = 2\n")
    monkeypatch.chdir(outside)
    names = [str(outside / "linked_dir" / "mod.py"), str(outside / "linked.py"),
             str(outside / "plain.py"), "linked.py", "linked_dir/../plain.py",
             str(repo / "pkg" / "mod.py"), str(outside / "missing.py")]
    for _ in range(2):  # the second time from the cache
        for name in names:
            assert real_file(name) == os.path.realpath(name), name
    assert real_file(str(outside / "linked.py")) == str((repo / "pkg" / "mod.py").resolve())
