"""Shared by the A/B probes: time each variant over its candidate configurations, pick each
variant's best, and count the output elements in which the variants' best configurations differ.

Timing is the product tuner's own (tuning._median_ms: a CUDA graph over rotating inputs, device
time only), each configuration twice, the variants in one order then the other, the better kept.
"""

import itertools
import json
import os

import torch

from impls.triton_rmsnorm import dispatch, launch, tuning

SINGLE_TILE_FORWARD = "rmsnorm_fwd_kernel"


def time_runs(runs: dict, arg_sets, stream, passes: int = 2) -> dict:
    """runs: name -> a callable of one argument set, launching what is timed. Device µs per
    call of each, the best of `passes` passes over all of them, every other pass in reverse
    order. A run that fails (launch, capture) is reported and timed as inf: the probe goes on.
    The caller has made stream wait for the inputs' producers."""
    times = {}
    for rep in range(passes):
        for name, run in list(runs.items())[:: 1 if rep % 2 == 0 else -1]:
            try:
                us = tuning._median_ms(run, arg_sets, stream) * 1e3
            except Exception as error:
                print(name, type(error).__name__, str(error)[:160], flush=True)
                us = float("inf")
            torch.cuda.current_stream().wait_stream(stream)
            times[name] = min(times.get(name, float("inf")), us)
    return times


def time_variants(variants: dict, arg_sets, stream) -> dict:
    """variants: name -> (kernel, [(config key, grid, meta)]); best of two interleaved passes
    per (name, config key)."""
    for kernel, launches in variants.values():
        launch._compile_in_parallel(kernel, arg_sets[0], [(g, me) for _, g, me in launches])
    stream.wait_stream(torch.cuda.current_stream())
    runs = {}
    for name, (kernel, launches) in variants.items():
        for key, grid, meta in launches:

            def run(a, kernel=kernel, grid=grid, meta=meta):
                kernel[grid](*a, **meta)

            runs[(name, key)] = run
    return time_runs(runs, arg_sets, stream)


def best_of(times: dict) -> dict:
    best = {}
    for (name, key), us in times.items():
        if name not in best or us < best[name][0]:
            best[name] = (us, key)
    return best


def count_differences(variants: dict, best: dict, args: tuple, outputs: dict) -> dict:
    """Exactly two variants, each run once on args at the configuration best names for it: how
    many elements of each output differ between them. Outputs are filled with NaN before each
    run, so an element a variant leaves unwritten counts as differing."""
    if len(variants) != 2:
        raise ValueError(f"count_differences compares two variants, got {len(variants)}")
    results = []
    for name, (kernel, launches) in variants.items():
        _, grid, meta = next(entry for entry in launches if entry[0] == best[name][1])
        for out in outputs.values():
            out.fill_(float("nan"))
        kernel[grid](*args, **meta)
        results.append({name: out.clone() for name, out in outputs.items()})
    first, second = results
    return {name: int((first[name] != second[name]).sum()) for name in outputs}


def forward_candidate_launches(args: tuple, n: int) -> list[tuple]:
    """The product tuner's candidates for the single-tile forward on args (contiguous rows, no
    residual), each as (configuration key, grid, launch keywords), the grid and keywords made as
    the product makes them (launch._kernel_grid_and_meta)."""
    x, m = args[0], args[0].shape[0]
    constexprs = {"BLOCK_N": launch.block_size(n), "HAS_RESIDUAL": False, "ROWS_CONTIGUOUS": True}

    def grid(meta):
        return (launch._tile_programs(m, meta, x.device),)

    launches = []
    for config in launch._candidates("rmsnorm_fwd_kernel", args, constexprs):
        launch_grid, meta = launch._kernel_grid_and_meta(
            "rmsnorm_fwd_kernel", grid, {**constexprs, **config}
        )
        launches.append((tuple(config.values()), launch_grid, meta))
    return launches


def forced_single_tile_forwards(x, w, variants, describe: dict, stream) -> list[dict]:
    """The plain single-tile forward of (x, w) at each of variants (a function of the table's
    configuration, as a default call launches it, giving name -> configuration), each forced
    through dispatch.override(forward="single_tile", forward_configs=...): a row per variant,
    describe's fields first, then the configuration, whether it ran as asked, whether y is
    bitwise the default call's, and (when it ran as asked) its device-only µs by the tuner's
    timer over rotating copies past the L2. Each row is printed as it is made."""
    launch.take_launch_configs()
    reference = launch.rmsnorm_forward(x, w, 1e-6)[0]
    table = launch.take_launch_configs()[SINGLE_TILE_FORWARD]
    arg_sets = tuning.rotating_arguments((x, w), tuning.l2_bytes(0))
    rows = []
    for name, config in variants(table).items():
        row = {**describe, "variant": name, "config": config}
        forced = {SINGLE_TILE_FORWARD: config}
        with dispatch.override(forward="single_tile", forward_configs=forced):
            y = launch.rmsnorm_forward(x, w, 1e-6)[0]
            ran = launch.take_launch_configs().get(SINGLE_TILE_FORWARD)
            row["ran_as_asked"] = ran == config
            row["same_bits"] = torch.equal(y, reference)
            if row["ran_as_asked"]:
                row["us"] = 1e3 * tuning._median_ms(
                    lambda a: launch.rmsnorm_forward(a[0], a[1], 1e-6), arg_sets, stream
                )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def shapes_argument(argv: list[str]) -> list[tuple[int, int]] | None:
    """The MxN shapes after --shapes in argv (up to the next --option), or None without it."""
    if "--shapes" not in argv:
        return None
    after = argv[argv.index("--shapes") + 1 :]
    texts = itertools.takewhile(lambda text: not text.startswith("--"), after)
    return [tuple(int(v) for v in text.lower().split("x")) for text in texts]  # fmt: skip


def write_json_atomically(path: str, data: dict) -> None:
    """data as indented JSON at path, through a temporary file replaced in one step: a probe cut
    short while writing keeps the previous version whole."""
    with open(path + ".part", "w") as out:
        json.dump(data, out, indent=1)
    os.replace(path + ".part", path)


def write_probe_json(path: str, **fields) -> None:
    """A probe's results with the GPU's name and the commit (RMSNORM_BENCH_COMMIT), written
    atomically: called after every shape, a call cut short keeps what ran."""
    record = {
        "gpu": torch.cuda.get_device_name(0),
        "commit": os.environ.get("RMSNORM_BENCH_COMMIT"),
    }
    write_json_atomically(path, {**record, **fields})
