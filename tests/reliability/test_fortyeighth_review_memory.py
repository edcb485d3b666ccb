"""Issue 15, forty-eighth hostile review (memory: bounded inputs): tests.

1. ``fedprivopt deploy local --nodes 64`` (also ``deploy_local(nodes=64)``) on a machine of
   23 GiB. Before: taken (``--nodes`` was only in ``[1, 64]``), where a node (SuperNode,
   SuperExec, ClientApp with torch and the task) holds 423 MB of proportional set size for the
   toy task (1.71 GB for 2 nodes, 3.40 GB for 6): 64 nodes about 28 GB. Now
   ``deploy.local_checks.check_nodes`` bounds ``--nodes`` by the physical memory over
   ``NODE_MEMORY`` (512 MiB), as ``compare --jobs`` is bounded: rc 2, one line, nothing written.
"""

from __future__ import annotations

import pytest

from fedprivopt.deploy import local_checks


def test_1_deploy_nodes_bounded_by_memory(monkeypatch, tmp_path):
    monkeypatch.setattr(local_checks, "physical_memory", lambda: 4 * 2**30)
    assert local_checks.check_nodes(8) == 8  # 4 GiB over 512 MiB
    with pytest.raises(ValueError, match=r"--nodes must be an integer in \[1, 8\] on this machine"):
        local_checks.check_nodes(9)
    from fedprivopt.deploy.local import deploy_local

    out = tmp_path / "D"
    with pytest.raises(ValueError, match=r"--nodes .*\[1, 8\]"):
        deploy_local(nodes=9, tls=False, out=str(out))
    assert not out.exists()
    monkeypatch.setattr(local_checks, "physical_memory", lambda: 0)  # unknown: the fixed bound
    assert local_checks.check_nodes(64) == 64
