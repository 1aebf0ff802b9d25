"""How many clusters of a compiled kernel the GPU holds at once: the driver's
cuOccupancyMaxActiveClusters, called through ctypes (torch and Triton do not expose it).

    from cluster_occupancy import max_active_clusters
    compiled = kernel[grid](..., num_ctas=8)
    max_active_clusters(compiled, cluster=8, warps=8)
"""

import ctypes

_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class _AttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", ctypes.c_uint * 3)]


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


def max_active_clusters(compiled, cluster: int, warps: int) -> int:
    """compiled: what a Triton or Gluon launch returns (its .function is the CUfunction)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    attribute = _Attribute(id=_CLUSTER_DIMENSION)
    attribute.value.cluster_dim[0], attribute.value.cluster_dim[1] = cluster, 1
    attribute.value.cluster_dim[2] = 1
    config = _LaunchConfig()
    config.grid[0], config.grid[1], config.grid[2] = cluster, 1, 1
    config.block[0], config.block[1], config.block[2] = 32 * warps, 1, 1
    config.shared_bytes = compiled.metadata.shared
    config.attrs = ctypes.pointer(attribute)
    config.num_attrs = 1
    count = ctypes.c_int(0)
    status = cuda.cuOccupancyMaxActiveClusters(
        ctypes.byref(count), ctypes.c_void_p(compiled.function), ctypes.byref(config)
    )
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters returned CUresult {status}")
    return count.value
