"""Entry point of the topology MPI tests: ``mpiexec -n N python topology_probe.py [options]``.

Every rank builds the topology from the real job environment and prints one JSON line
(``{"rank": r, ...}``); tests/test_topology_mpi.py checks that all ranks agree. When the
ranks do not fit the cluster options, every rank prints ``{"rank": r, "exit": 2}`` and the
job ends through `exit_all`: rank 0's one line on stderr, exit status 2, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from fleet.runtime.launch.jobenv import read_job_env
from fleet.runtime.launch.process import exit_all
from fleet.runtime.launch.topology import TopologyError, bind_device, build_topology
from fleet.spec import ClusterSpec


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=1)
    parser.add_argument("--preprocessors", default="auto", help="per node: a count or 'auto'")
    parser.add_argument("--virtual", action="store_true", help="cluster.virtual_nodes: true")
    parser.add_argument("--ranks-per-node", type=int, default=None)
    return parser.parse_args(argv)


def cluster_of(args: argparse.Namespace) -> ClusterSpec:
    preprocessors = args.preprocessors if args.preprocessors == "auto" else int(args.preprocessors)
    return ClusterSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        preprocessors_per_node=preprocessors,
        virtual_nodes=args.virtual,
    )


def probe(world, cluster: ClusterSpec, ranks_per_node: int | None = None) -> dict:
    """This rank's view of the job: its environment and the whole topology it computed."""
    env = read_job_env(os.environ)
    topology = build_topology(world, cluster, env, ranks_per_node, timeout_s=60.0)
    rank = world.Get_rank()
    return {
        "rank": rank,
        "size": world.Get_size(),
        "env": {
            "launcher": env.launcher.value,
            "rank": env.rank,
            "size": env.size,
            "local_rank": env.local_rank,
            "local_size": env.local_size,
        },
        "nodes": topology.nodes,
        "node_of": [p.node for p in topology.placements],
        "roles": [p.role.value for p in topology.placements],
        "gpus": [p.gpu for p in topology.placements],
        "node_names": list(topology.node_names),
        "device": bind_device(topology.placement(rank), cluster, env),
        "describe": topology.describe(),
    }


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    args = parse_args(argv)
    try:
        report = probe(world, cluster_of(args), args.ranks_per_node)
    except TopologyError as exc:
        emit({"rank": world.Get_rank(), "exit": exc.exit_code})
        exit_all(world, exc.exit_code, f"fleet run: error: {exc}")
    emit(report)


def emit(record: dict) -> None:
    """One JSON line in one write: print() writes the newline separately when stdout is
    unbuffered (PYTHONUNBUFFERED), and mpiexec then interleaves other ranks' lines between."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
