"""The runtime's share of a partitioned grid on one node of a cluster (runtime/rt_snurhac.c:
UMCTL_RT_GPUS = the cluster's GPUs, UMCTL_RT_NODE_GPUS, UMCTL_RT_NODE), on the fake CUDA runtime:
each node's process runs exactly its slabs of partition()'s cut, on its local GPUs, so that the
nodes together run every thread block once."""

from __future__ import annotations

import numpy as np
import pytest

from umctl.controller.snurhac import partition

from test_runtime import stats
from test_snurhac_live import run_part


def run_node(built, grid, nodes: int, per_node: int, node: int):
    return run_part(built, grid, nodes * per_node, devices=per_node,
                    extra={"UMCTL_RT_NODE_GPUS": str(per_node), "UMCTL_RT_NODE": str(node)})


@pytest.mark.parametrize("grid,nodes,per_node", [((7, 3, 1), 2, 2), ((1, 1, 5), 4, 1), ((2, 9, 1), 3, 2)])
def test_nodes_run_their_slabs_and_together_every_block(built, grid, nodes, per_node):
    _, parts = partition(grid, nodes * per_node)
    ran = np.zeros(int(np.prod(grid)), int)
    for node in range(nodes):
        res, err = run_node(built, grid, nodes, per_node, node)
        assert res["rc"] == 0 and res["dev_after"] == 0
        owner, hits = np.array(res["owner"]), np.array(res["hits"])
        mine = np.zeros(len(owner), bool)
        for k in range(per_node):
            tbs = parts[node * per_node + k]
            mine[tbs] = True
            assert (owner[tbs] == k).all(), (node, k)          # slab n*M+k on local GPU k
        assert (hits[mine] == 2).all() and (hits[~mine] == 0).all() and (owner[~mine] == -1).all()
        ran += hits
        assert stats(err)["partitioned"] == "2"
    assert (ran == 2).all()


def test_node_outside_the_cluster_is_a_clean_single_launch(built):
    res, err = run_node(built, (7, 3, 1), 2, 2, 2)     # node 2 of a 2-node cluster
    assert "outside UMCTL_RT_GPUS" in err and stats(err)["partitioned"] == "0"
    assert set(res["hits"]) == {2}
