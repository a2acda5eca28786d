"""What every rank's environment holds: the allow-listed variables of the submitting shell, the network
block's NCCL variables, the collective timeout and the profile's own variables."""

from __future__ import annotations

import os
from typing import Dict, Optional

from hpcdl.config.cluster import ClusterConfig
from hpcdl.config.secrets import is_secret
from hpcdl.config.network import NetworkConfig


def network_environment(network: NetworkConfig) -> dict[str, str]:
    """The variables the network block sets for every rank."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if not network.fast_multinode_gpu:
        env.update(NCCL_IB_DISABLE="1", NCCL_NET_GDR_LEVEL="LOC")
    for name, value in (("NCCL_SOCKET_IFNAME", network.socket_ifname), ("NCCL_IB_HCA", network.ib_hca),
                        ("NCCL_NET_GDR_LEVEL", network.net_gdr_level), ("NCCL_DEBUG", network.debug)):
        if value is not None:
            env[name] = value
    if network.ib_disable is not None:
        env["NCCL_IB_DISABLE"] = "1" if network.ib_disable else "0"
    env.update(network.extra)
    return env


def exported_environment(profile: ClusterConfig, environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables a job gets from the submitting shell: the allow-list, never a secret."""
    environ = dict(os.environ if environ is None else environ)
    return {name: environ[name] for name in profile.export if name in environ and not is_secret(name)}


def job_environment(profile: ClusterConfig) -> Dict[str, str]:
    """The variables hpcdl sets for every rank: the network block, the collective timeout, the profile's env."""
    return {**network_environment(profile.network),
            "HPCDL_COLLECTIVE_TIMEOUT_S": str(profile.collective_timeout_s), **profile.env}
