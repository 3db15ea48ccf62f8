"""bench.compare_trees: what it refuses before starting any cluster."""

from __future__ import annotations

import pytest

from bench import compare_trees


def test_a_base_that_is_not_a_source_tree_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        compare_trees.main([str(tmp_path)])
    assert exited.value.code == 2
    assert f"base {tmp_path} is not a localcluster source tree" in capsys.readouterr().err
