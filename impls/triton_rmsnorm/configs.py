"""Launch configurations of the tuned kernels (kernels.py): each kernel's configuration space,
its pruning for a launch, the heuristic configuration used without a table entry, and the check
that a table's configuration is in the space. No launches here (kernel_launch.py)."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import torch
import triton

from . import common, dispatch, kernels
from .common import WIDE_BLOCK_N, cdiv, next_power_of_2

NUM_WARPS_CHOICES = (1, 2, 4, 8, 16, 32)
#: Stages of the kernels with loops (each sets LOOP_STAGES: TunedKernel.pipelined). Triton's
#: pipeliner keeps S - 2 later steps' loads in flight while a step computes: at 2 stages it
#: issues the next step's loads after the current step's stores, no overlap (compiled on Triton
#: 3.6 and 3.9), so 2 is not tried.
NUM_STAGES_CHOICES = (1, 3, 4)
ROWS_PER_TILE_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: Rows per program (BLOCK_M) of the single-tile kernels: the tile holds about this many elements
#: (tuning tries this and twice this), so narrow rows are taken several at a time; rows of
#: TILE_TARGET or more elements go one per tile.
TILE_TARGET = 4096
#: The largest tile a single-tile program holds: [BLOCK_M, BLOCK_N] elements.
MAX_TILE = 65536


def rows_per_tile(kernel_name: str, block_n: int) -> int:
    """The heuristic BLOCK_M of a single-tile kernel: whole rows per tile, about TILE_TARGET
    elements (at least 1 row, at most the largest tuning choice)."""
    if not KERNELS[kernel_name].tiles:
        raise ValueError(f"kernel_name: {kernel_name} takes no tiles of rows")
    return max(1, min(ROWS_PER_TILE_CHOICES[-2], TILE_TARGET // block_n))


#: Programs per SM of the persistent looped forward (its grid): fewer rows in flight leave
#: more of each row in L2 for the second pass, more programs keep more bytes in flight. 16 gives
#: up to 2112 rows a program each on 132 SMs, as torch.compile's one program per row, which
#: once led our forward at a wide shape (docs/design.md, Forward).
PROGRAMS_PER_SM_CHOICES = (1, 2, 4, 8, 16)
#: Chunk widths the looped forward is tuned over (its BLOCK_N; WIDE_BLOCK_N untuned): wider
#: chunks win at some wide shapes (docs/design.md, Forward).
LOOPED_FORWARD_CHUNKS = (WIDE_BLOCK_N, 16384)
#: ... and without autotuning (about one program per row at the wide preset's shapes).
HEURISTIC_PROGRAMS_PER_SM = 8
#: The single-tile forward's grids, as (PROGRAMS_PER_SM, LOOP_STAGES): one program per tile
#: (PROGRAMS_PER_SM 0, no tile loop), or a persistent grid of that many programs per SM whose
#: tile loop is software-pipelined (3 or 4 stages; 1 would overlap nothing that more programs
#: would not). PROGRAMS_PER_SM shapes the grid; the kernel takes only whether it is persistent.
FORWARD_GRID_CHOICES = ((0, 1), *((p, s) for p in (1, 2, 4) for s in (3, 4)))
#: The shifted forward's grids (rmsnorm_fwd_shifted_kernel, always persistent: each program
#: keeps one residue class's w), as (PROGRAMS_PER_SM, LOOP_STAGES).
SHIFTED_FORWARD_GRID_CHOICES = ((4, 1), *((p, s) for p in (1, 2, 4) for s in (3, 4)))


def _loop_stages(kernel_name: str, stages: int) -> dict:
    return {"LOOP_STAGES": stages} if KERNELS[kernel_name].pipelined else {}


def _configs(kernel_name: str) -> list[triton.Config]:
    """The kernel's configuration space (TunedKernel: its grids or metas, warps, stages)."""
    kernel = KERNELS[kernel_name]
    if kernel.grids:
        return [
            triton.Config(
                {"BLOCK_M": m, "PROGRAMS_PER_SM": p, **_loop_stages(kernel_name, st)},
                num_warps=warps,
                num_stages=st,
            )
            for m in ROWS_PER_TILE_CHOICES
            for warps in NUM_WARPS_CHOICES
            for p, st in kernel.grids
        ]
    stages = NUM_STAGES_CHOICES if kernel.pipelined else (1,)
    metas = [{"BLOCK_M": m} for m in ROWS_PER_TILE_CHOICES] if kernel.tiles else kernel.metas
    return [
        triton.Config({**meta, **_loop_stages(kernel_name, st)}, num_warps=warps, num_stages=st)
        for meta in metas
        for warps in NUM_WARPS_CHOICES
        for st in stages
    ]


def _threads_fit(tile: int, num_warps: int, low: int, high: int) -> bool:
    """A tile of that many elements gives each of num_warps * 32 threads low to high of them."""
    return low <= tile / (32 * num_warps) <= high


def _prune_tiles(kernel_name: str):
    """Keep the tiles of BLOCK_M in {h, 2h} rows (h = rows_per_tile) with a sensible number of
    elements per thread; the forward also tries h/2 (more, shorter programs, which win at some
    narrow shapes: docs/design.md, Forward), drops 2h when it would leave
    fewer than 2 programs per SM, and drops persistent grids that would give no program a
    second tile (the same launch as one program per tile, with a pipeline that never fills)."""

    def prune(configs, named_args, **kwargs):
        low, high = KERNELS[kernel_name].elements_per_thread
        block_n = kwargs["BLOCK_N"]
        inputs = 2 if kwargs.get("HAS_RESIDUAL") else 1
        h = rows_per_tile(kernel_name, block_n)
        candidates = {h}
        if 2 * h * block_n <= MAX_TILE:
            candidates.add(2 * h)
        if "rows_per_program" in named_args:  # a backward's: no taller tile than its rows
            rows = next_power_of_2(named_args["rows_per_program"])
            candidates = {min(c, rows) for c in candidates}
        if kernel_name == "rmsnorm_fwd_kernel":
            m, device = named_args["M"], named_args["X"].device
            if 2 * h in candidates and cdiv(m, 2 * h) < 2 * common._programs_cap(device):
                candidates.discard(2 * h)
            if h > 1:
                candidates.add(h // 2)
        kept = [
            c
            for c in configs
            if c.kwargs["BLOCK_M"] in candidates
            and _threads_fit(c.kwargs["BLOCK_M"] * block_n, c.num_warps, low, high)
            and _persistent_grid_loops(c.kwargs, named_args, block_n, inputs)
        ]
        if kept:
            return kept
        # a tile too small for even one warp at the low end: the fewest warps
        fewest = min(c.num_warps for c in configs)
        smallest = min(candidates)
        return [c for c in configs if c.kwargs["BLOCK_M"] == smallest and c.num_warps == fewest]

    return prune


#: Shared memory a forward's pipelined loops may stage (the single-tile forward's tile loop:
#: LOOP_STAGES - 1 tiles of x, and r, in flight; the looped forward: _looped_forward_staging).
#: The H200 gives a program up to 227 KB; larger stagings fail to launch.
PIPELINE_SHARED_BYTES = 200 * 1024


def tile_loop_staging(config: dict, block_n: int, bytes_per_element: int) -> int:
    """Shared memory the single-tile forward's pipelined tile loop takes: LOOP_STAGES - 1 tiles
    in flight, bytes_per_element per tile element (x's size, twice with a residual's r)."""
    return (config["LOOP_STAGES"] - 1) * config["BLOCK_M"] * block_n * bytes_per_element


def _persistent_grid_loops(config: dict, named_args: dict, block_n: int, inputs: int) -> bool:
    """A config without a persistent grid, or one whose programs get more than one tile and
    whose staged tiles (inputs tensors of X's dtype) fit PIPELINE_SHARED_BYTES."""
    if config.get("PROGRAMS_PER_SM", 0) == 0:
        return True
    x, m = named_args["X"], named_args["M"]
    staged = tile_loop_staging(config, block_n, x.element_size() * inputs)
    programs = _tile_programs(m, config, x.device)  # the grid the launch would get
    return programs < cdiv(m, config["BLOCK_M"]) and staged <= PIPELINE_SHARED_BYTES


def _prune_looped_forward(configs, named_args, **kwargs):
    """The persistent looped forward: 8 to 32 elements per thread per chunk (BLOCK_N, a tuning
    choice here), of the PROGRAMS_PER_SM choices that already give every row its own program
    only the smallest, and stagings that fit PIPELINE_SHARED_BYTES (_looped_forward_staging).
    With a residual, no pipelined loops: the second pass reads h that the program's threads
    wrote in the first, ordered by a barrier for plain loads; asynchronous copies of it are
    left untried until measured correct on a GPU."""
    x, m = named_args["X"], named_args["M"]
    device, w_size = x.device, named_args["W"].element_size()
    enough = next(
        (p for p in PROGRAMS_PER_SM_CHOICES if p * common._programs_cap(device) >= m),
        PROGRAMS_PER_SM_CHOICES[-1],
    )
    return [
        c
        for c in configs
        if c.kwargs["PROGRAMS_PER_SM"] <= enough
        and _threads_fit(c.kwargs["BLOCK_N"], c.num_warps, 8, 32)
        and not (kwargs["HAS_RESIDUAL"] and c.kwargs["LOOP_STAGES"] > 1)
        and _looped_forward_staging(c.kwargs, x.element_size(), w_size) <= PIPELINE_SHARED_BYTES
    ]


def _looped_forward_staging(config: dict, x_size: int, w_size: int) -> int:
    """Shared memory the looped forward's pipelined loops take: LOOP_STAGES - 1 chunks of x and
    of w in flight (the first pass stages x, the second x and w, in the same buffers). On the
    H200 fp32 16384-wide chunks at 3 stages asked for 262144 bytes (2 x 16384 x (4 + 4)) and
    failed to launch; bf16 ones at 4 stages (3 x 16384 x (2 + 2)) ran. Compiled for sm_90
    (Triton 3.6 and 3.9), bf16 x with an fp32 w at 4 stages takes 3 x 16384 x (2 + 4)."""
    return (config["LOOP_STAGES"] - 1) * config["BLOCK_N"] * (x_size + w_size)


def _prune_shifted_forward(configs, named_args, **kwargs):
    """The shifted forward: BLOCK_M of h / 2, h and 2h rows (h = rows_per_tile), 4 to 64
    elements per thread, and staged tiles (LOOP_STAGES - 1 of them, x's, r's, and with MAY_WRAP
    each twice) within PIPELINE_SHARED_BYTES."""
    block_n = kwargs["BLOCK_N"]
    h = rows_per_tile("rmsnorm_fwd_shifted_kernel", block_n)
    heights = {max(1, h // 2), h} | ({2 * h} if 2 * h * block_n <= MAX_TILE else set())
    staged_bytes = named_args["X"].element_size() * (2 if kwargs["HAS_RESIDUAL"] else 1)
    staged_bytes *= 2 if kwargs["MAY_WRAP"] else 1
    kept = [
        c
        for c in configs
        if c.kwargs["BLOCK_M"] in heights
        and _threads_fit(c.kwargs["BLOCK_M"] * block_n, c.num_warps, 4, 64)
        and tile_loop_staging(c.kwargs, block_n, staged_bytes) <= PIPELINE_SHARED_BYTES
    ]
    return kept or [min(configs, key=lambda c: (c.kwargs["BLOCK_M"], c.num_warps))]


def _prune_warps(configs, named_args, **kwargs):
    """Split kernels (one BLOCK_N chunk per program): 8 to 64 elements per thread."""
    kept = [c for c in configs if _threads_fit(kwargs["BLOCK_N"], c.num_warps, 8, 64)]
    return kept or [max(configs, key=lambda c: c.num_warps)]


@dataclasses.dataclass(frozen=True)
class TunedKernel:
    """A kernel launched through kernel_launch._launch (kernels.py): what its configurations
    are made of, how a launch prunes them, and what its tuning is keyed on. A kernel joins
    the tuner, the heuristic and the table check by an entry in KERNELS.

    tiles: a single-tile kernel, BLOCK_M rows a tile (rows_per_tile: about TILE_TARGET
    elements), pruned to elements_per_thread a thread; grids: a single-tile forward's grids
    (PROGRAMS_PER_SM, LOOP_STAGES), which its launch's grid function reads; metas: the other
    kernels' launch keywords besides warps and stages; pipelined: its loops take LOOP_STAGES
    (tl.range's num_stages: Triton leaves a loop without dot products unpipelined whatever the
    launch's num_stages; it follows the config's num_stages, 1 without tuning), where a kernel
    without a loop compiles the same code at every num_stages and is tuned over warps only;
    prune: the launch's pruning of the space (None: every configuration is tried).
    The tuning key: the kernel, the dtypes of its varying tensors, its constexpr switches
    (each variant gets its own config), N and, for the kernels that take it, ROWS_BUCKET (M's
    bit length: a config tuned at one M can run far slower at another, docs/design.md,
    Dispatch), and the device."""

    name: str
    tiles: bool = False
    elements_per_thread: tuple[int, int] | None = None
    grids: tuple[tuple[int, int], ...] = ()
    metas: tuple[dict, ...] = ({},)
    pipelined: bool = True
    prune: object = None  # (configs, named_args, **constexprs) -> configs


def _tile_kernel(name: str, elements_per_thread: tuple[int, int], **fields) -> TunedKernel:
    return TunedKernel(name, tiles=True, elements_per_thread=elements_per_thread,
                       prune=fields.pop("prune", None) or _prune_tiles(name), **fields)  # fmt: skip


#: Every tuned kernel, by name.
KERNELS: dict[str, TunedKernel] = {
    k.name: k
    for k in (
        _tile_kernel("rmsnorm_fwd_kernel", (4, 64), grids=FORWARD_GRID_CHOICES),
        _tile_kernel(
            "rmsnorm_fwd_shifted_kernel",
            (4, 64),
            grids=SHIFTED_FORWARD_GRID_CHOICES,
            prune=_prune_shifted_forward,
        ),  # fmt: skip
        TunedKernel(
            "rmsnorm_fwd_looped_kernel",
            prune=_prune_looped_forward,
            metas=tuple(
                {"PROGRAMS_PER_SM": p, "BLOCK_N": chunk}
                for p in PROGRAMS_PER_SM_CHOICES
                for chunk in LOOPED_FORWARD_CHUNKS
            ),
        ),  # fmt: skip
        _tile_kernel("rmsnorm_bwd_kernel", (8, 32)),
        _tile_kernel("rmsnorm_bwd_shifted_kernel", (8, 32)),
        _tile_kernel("rmsnorm_bwd_two_role_kernel", (8, 32)),
        TunedKernel("rmsnorm_bwd_columns_kernel"),
        TunedKernel("rmsnorm_bwd_row_dot_kernel"),
        TunedKernel("rmsnorm_fwd_split_sumsq_kernel", pipelined=False, prune=_prune_warps),
        TunedKernel("rmsnorm_fwd_split_scale_kernel", pipelined=False, prune=_prune_warps),
        TunedKernel("rmsnorm_bwd_split_dot_kernel", pipelined=False, prune=_prune_warps),
    )
}


def _candidates(kernel_name: str, args: tuple, constexprs: dict) -> list[dict]:
    """The configurations tried for this launch, as launch keywords."""
    configs = _configs(kernel_name)
    prune = KERNELS[kernel_name].prune
    if prune is not None:
        named_args = dict(zip(getattr(kernels, kernel_name).arg_names, args, strict=False))
        configs = prune(configs, named_args, **constexprs)
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in configs]


def heuristic_num_warps(tile: int) -> int:
    """Warps for a tile of that many elements when not autotuning: ~256 elements per warp."""
    return max(1, min(32, tile // 256))


def _table_config(kernel_name: str) -> dict | None:
    """The dispatch table's configuration for this kernel in the running path (dispatch.py),
    if it has one and it is in the kernel's configuration space (_configs); else None (the
    heuristic). Not checked against the pruning of a launch's candidates: pruning is about
    speed at the tuned M (every configuration in the space runs at every M of one padded
    width), and a configuration that changed with M would change the bits with M (but for
    one_row_tiles, which changes BLOCK_M only where the bits stay)."""
    configs = getattr(dispatch._ACTIVE, "configs", None)
    config = configs.get(kernel_name) if configs else None
    if config is None:
        return None
    known = _IN_SPACE.get(id(config))
    if known is None or known[0] is not config:  # (the config is kept: its id stays its own)
        known = _IN_SPACE[id(config)] = (config, in_config_space(kernel_name, config))
        if not known[1]:  # said once a table entry: a hand edit that does not run is no secret
            warnings.warn(
                f"the dispatch table's configuration for {kernel_name} {dict(sorted(config.items()))} "
                "is not in the kernel's configuration space (configs.py): the heuristic "
                "configuration runs instead",
                RuntimeWarning,
                stacklevel=2,
            )
    return config if known[1] else None


def in_config_space(kernel_name: str, config: dict) -> bool:
    """Whether a configuration (launch keywords, as a table entry holds them) is one the tuner
    may pick for the kernel; one that is not is not launched (_table_config)."""
    return tuple(sorted(config.items())) in _config_space(kernel_name)


#: id(table configuration) -> (the configuration, whether it is in its kernel's space).
_IN_SPACE: dict[int, tuple] = {}


@functools.cache
def _config_space(kernel_name: str) -> frozenset:
    """Every configuration the tuner may pick for the kernel, as sorted launch-keyword items."""
    return frozenset(
        tuple(sorted({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}.items()))
        for c in _configs(kernel_name)
    )


def _kernel_grid_and_meta(kernel_name: str, grid, meta: dict) -> tuple:
    """(grid, launch keywords) for the kernel. The single-tile forwards' PROGRAMS_PER_SM is read
    by their grid functions and reaches the plain kernel only as PERSISTENT (PROGRAMS_PER_SM >
    0), the shifted one not at all; every other kernel launches its configuration as it is."""
    if not KERNELS[kernel_name].grids:
        return grid, meta
    grid = grid(meta) if callable(grid) else grid
    kernel_meta = {k: v for k, v in meta.items() if k != "PROGRAMS_PER_SM"}
    if kernel_name == "rmsnorm_fwd_kernel":
        kernel_meta["PERSISTENT"] = meta["PROGRAMS_PER_SM"] > 0
        kernel_meta["W_EARLY"] = not kernel_meta["PERSISTENT"] and common.loads_w_early(grid[0])
    return grid, kernel_meta


#: num_stages when a launch does not choose one (Triton's default).
TRITON_DEFAULT_STAGES = 3


def _heuristic_config(kernel_name: str, block_n: int) -> dict:
    """The launch configuration without autotuning: BLOCK_M by rows_per_tile, ~256 elements per
    warp, no software pipelining of a row loop (LOOP_STAGES 1)."""
    config = {}
    if KERNELS[kernel_name].tiles:
        config["BLOCK_M"] = rows_per_tile(kernel_name, block_n)
    if kernel_name == "rmsnorm_fwd_looped_kernel":
        config["PROGRAMS_PER_SM"] = HEURISTIC_PROGRAMS_PER_SM
        config["BLOCK_N"] = block_n  # the chunk: a tuning choice, WIDE_BLOCK_N untuned
    if kernel_name == "rmsnorm_fwd_kernel":
        config["PROGRAMS_PER_SM"] = 0  # one program per tile
    if kernel_name == "rmsnorm_fwd_shifted_kernel":
        config["PROGRAMS_PER_SM"] = SHIFTED_FORWARD_GRID_CHOICES[0][0]
    tile = config.get("BLOCK_M", 1) * block_n
    return {
        **config,
        **_loop_stages(kernel_name, 1),
        "num_warps": heuristic_num_warps(tile),
        "num_stages": TRITON_DEFAULT_STAGES,
    }


#: 16-byte loads: the widest vector a thread loads, which Triton's layout of a tile gives each
#: thread along the row where the row allows it.
_VECTOR_BYTES = 16


def one_row_tiles(config: dict, m: int, block_n: int, element_size: int, sms: int) -> dict:
    """The plain single-tile forward's configuration (the table's or the heuristic's) for a call
    of m rows: one row a tile where its tiles of config's BLOCK_M would leave SMs idle and the
    bits cannot change; config itself otherwise.

    At decode rows the table's tiles of 2 rows give fewer programs than SMs (16x8192: 8
    programs on 132 SMs), and one row a tile runs faster (docs/perf-log.md, twenty-fourth
    session). The bits are the same by construction where the tile's warps all lie along the row: a warp covers 32 threads
    x one 16-byte vector of columns, and when BLOCK_N holds num_warps of those, Triton's layout
    spreads the warps along the row and repeats the rows in each thread's registers, so each
    row is reduced by the same threads in the same order whatever BLOCK_M. With fewer columns
    the warps split the rows among them, and one row a tile would reduce a row over other
    threads (other bits): such configurations are kept. element_size: the smallest element of
    the tensors the tile loads (the widest vector in elements). A persistent grid
    (PROGRAMS_PER_SM > 0) is kept as it is.
    """
    block_m = config.get("BLOCK_M", 1)
    if block_m == 1 or config.get("PROGRAMS_PER_SM", 0) != 0 or cdiv(m, block_m) >= sms:
        return config
    if block_n < config["num_warps"] * 32 * (_VECTOR_BYTES // element_size):
        return config
    return {**config, "BLOCK_M": 1}


def _tile_programs(m: int, meta: dict, device: torch.device) -> int:
    """The single-tile forward's grid: one program per tile of BLOCK_M rows, or at most
    PROGRAMS_PER_SM per SM (a persistent grid) when that is set."""
    tiles = cdiv(m, meta["BLOCK_M"])
    per_sm = meta["PROGRAMS_PER_SM"]
    return tiles if per_sm == 0 else min(tiles, per_sm * common._programs_cap(device))
