"""The cluster profile's network block: NCCL / InfiniBand / GPUDirect settings for every rank.

MATLAB's PARALLEL_SERVER_FAST_MULTINODE_GPU_COMMUNICATION becomes
``fast_multinode_gpu``; the rest are NCCL's own variables. NVLink multicast
(NCCL_NVLS_ENABLE) stays off: hpcdl never sets it to 1.
"""

from __future__ import annotations

from dataclasses import field
from typing import Dict, Optional

from hpcdl.config.secrets import check_variable_names
from hpcdl.errors import ConfigError
from hpcdl.config.fields import check_types, options, require_choice

DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def refuse_nvls(variables: Dict[str, str], where: str) -> None:
    """ConfigError when ``variables`` would turn NVLink multicast on, wherever they come from."""
    if variables.get("NCCL_NVLS_ENABLE", "0") != "0":
        raise ConfigError(f"{where}: NCCL_NVLS_ENABLE must stay 0 (NVLink multicast can take shared GPUs "
                          "out of service)")


@options("cluster.network")
class NetworkConfig:
    """How ranks talk across nodes."""

    fast_multinode_gpu: bool = True
    """NCCL over InfiniBand with GPUDirect RDMA where present; false: sockets only (IB and GDR off)."""
    socket_ifname: Optional[str] = None
    """NCCL_SOCKET_IFNAME: interfaces for bootstrap and socket transport (e.g. ib0, ^lo,docker)."""
    ib_hca: Optional[str] = None
    """NCCL_IB_HCA: InfiniBand adapters to use (e.g. mlx5_0,mlx5_1)."""
    ib_disable: Optional[bool] = None
    """NCCL_IB_DISABLE; null leaves NCCL's default."""
    net_gdr_level: Optional[str] = None
    """NCCL_NET_GDR_LEVEL (LOC, PIX, PXB, PHB, SYS)."""
    debug: Optional[str] = None
    """NCCL_DEBUG: VERSION, WARN, INFO or TRACE."""
    extra: Dict[str, str] = field(default_factory=dict)
    """Any further variables for every rank (NCCL_*, UCX_*, FI_*); names as in cluster.env (no secrets)."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.debug is not None:
            require_choice(self, "debug", DEBUG_LEVELS)
        check_variable_names(self.extra, "cluster.network.extra")
        refuse_nvls(self.extra, "cluster.network.extra")
