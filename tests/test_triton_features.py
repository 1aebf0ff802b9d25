"""What production users need beyond the plain op: Gemma offset, mixed weight and output dtypes,
strided rows without a copy, torch.compile without graph breaks, a deterministic backward."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness.inputs import make_inputs
from harness.oracle import compare, reference
from impls.triton_rmsnorm import dispatch, rmsnorm
from impls.triton_rmsnorm.function import _rows
from tests.cases import DTYPE_NAMES
from tests.conftest import DEVICE
from tests.helpers import TOL
from tests.helpers import assert_matches_oracle as _assert_matches_oracle
from tests.helpers import grads as _grads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gemma_offset(dtype):
    inputs = make_inputs((64, 1000), dtype, DEVICE)
    w = (0.1 * torch.randn(1000)).to(DEVICE, dtype)  # Gemma stores w around 0 and uses 1 + w
    _assert_matches_oracle(inputs.x, w, inputs.dy, offset=1.0)


@pytest.mark.parametrize(
    "x_dtype, w_dtype, out_dtype",
    [(torch.bfloat16, torch.float32, None), (torch.bfloat16, torch.float32, torch.float32),
     (torch.float16, torch.float16, torch.float32), (torch.float32, torch.bfloat16, torch.bfloat16)],
    ids=lambda d: DTYPE_NAMES.get(d, "same"),
)  # fmt: skip
def test_weight_and_output_dtypes(x_dtype, w_dtype, out_dtype):
    inputs = make_inputs((48, 2048), x_dtype, DEVICE)
    w = inputs.weight.to(w_dtype)
    y, dx, dw = _assert_matches_oracle(inputs.x, w, inputs.dy, out_dtype=out_dtype)
    assert y.dtype == (out_dtype or x_dtype) and dx.dtype == x_dtype and dw.dtype == w_dtype


def test_strided_rows_run_without_a_copy():
    wide = make_inputs((64, 1536), torch.bfloat16, DEVICE).x
    x = wide[:, 256 : 256 + 1024]  # every row a slice of a wider row
    assert not x.is_contiguous() and x.stride() == (1536, 1)
    assert _rows(x).data_ptr() == x.data_ptr(), "the kernel would get a copy"
    inputs = make_inputs((64, 1024), torch.bfloat16, DEVICE)
    _assert_matches_oracle(x, inputs.weight, inputs.dy)


def test_backward_is_bitwise_deterministic():
    inputs = make_inputs((300, 2048), torch.bfloat16, DEVICE)
    first = _grads(inputs.x, inputs.weight, inputs.dy)
    for _ in range(2):
        again = _grads(inputs.x, inputs.weight, inputs.dy)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)


def test_torch_compile_fullgraph_runs_our_kernels_forward_and_backward():
    """fullgraph=True raises on any graph break; the custom op keeps our kernels in the graph."""
    import impls.triton_rmsnorm.launch as launch

    calls = {"fwd": 0, "bwd": 0}
    real_fwd, real_bwd = launch.rmsnorm_forward, launch.rmsnorm_backward

    def counting_fwd(*args, **kwargs):
        calls["fwd"] += 1
        return real_fwd(*args, **kwargs)

    def counting_bwd(*args, **kwargs):
        calls["bwd"] += 1
        return real_bwd(*args, **kwargs)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(256, 256, device=DEVICE, dtype=torch.float32)
            self.norm_weight = torch.nn.Parameter(torch.ones(256, device=DEVICE))

        def forward(self, x):
            return self.proj(rmsnorm(x, self.norm_weight, 1e-5)) * 2

    torch._dynamo.reset()
    model = Block()
    compiled = torch.compile(model, fullgraph=True)
    x = make_inputs((32, 256), torch.float32, DEVICE).x.requires_grad_(True)
    launch.rmsnorm_forward, launch.rmsnorm_backward = counting_fwd, counting_bwd
    try:
        out = compiled(x)
        out.sum().backward()
    finally:
        launch.rmsnorm_forward, launch.rmsnorm_backward = real_fwd, real_bwd
    assert calls["fwd"] >= 1 and calls["bwd"] >= 1, calls
    x_eager = x.detach().clone().requires_grad_(True)
    eager_out = model(x_eager)
    eager_out.sum().backward()
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(x.grad, x_eager.grad)


def test_strided_weight():
    """A weight that is a strided view (a column of a matrix) gives the right answer and grad."""
    inputs = make_inputs((32, 512), torch.bfloat16, DEVICE)
    table = torch.randn(512, 3, device=DEVICE, dtype=torch.bfloat16)
    w = table[:, 1]
    assert w.stride() == (3,)
    _assert_matches_oracle(inputs.x, w, inputs.dy)


@pytest.mark.skipif(DEVICE != "cuda", reason="measures the CUDA caching allocator's peak")
@pytest.mark.parametrize(
    "shape, forced",
    [((8192, 4096), None), ((64, 131072), None), ((512, 131072), None),
     ((2048, 32768), "held-row"), ((512, 131072), "held-group"), ((512, 2048), "two-role")],
    ids=["single-tile", "wide-split", "wide-columns", "held-row", "held-group", "two-role"],
)  # fmt: skip
def test_backward_allocates_only_dx_and_the_dw_partials(shape, forced):
    """Issue target: the backward allocates dx, <= SMs x N fp32 partials, O(N + M) besides (the
    held and two-role paths forced where this GPU runs them: the tests run with autotuning off,
    which keeps the default path). The two-role path allocates no partials at all."""
    from impls.triton_rmsnorm import launch

    force = contextlib.ExitStack()
    if forced is not None:
        x = torch.empty(shape, dtype=torch.bfloat16, device=DEVICE)
        offered = {"held-row": launch.backward_holds_row_on_chip,
                   "held-group": launch.backward_holds_row_in_group,
                   "two-role": lambda x, dy, w, dh: launch.backward_takes_two_roles(x, dy, dh),
                   }[forced]  # fmt: skip
        if not offered(x, x, x[0], None):
            pytest.skip(f"the {forced} backward does not run on this device")
        name = forced.replace("-", "_")  # the family's first configuration
        force.enter_context(dispatch.override(backward=name, offered_only=False))
    with force:
        _check_backward_allocations(shape, forced, launch)


def _check_backward_allocations(shape, forced, launch) -> None:
    m, n = shape
    inputs = make_inputs(shape, torch.bfloat16, DEVICE)
    x = inputs.x.detach().requires_grad_(True)
    w = inputs.weight.detach().requires_grad_(True)
    y = rmsnorm(x, w, 1e-5)
    launch.take_launch_configs()
    dy = inputs.dy
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # dx, the partials, O(M + N) vectors (dw, its cast, per-row sums), and the caching
    # allocator's rounding of each block up to 2 MiB.
    partials = 0 if forced == "two-role" else sms * n * 4
    allowed = dx.numel() * dx.element_size() + partials + 4 * (m + n) * 4
    allowed += 4 * (2 << 20)
    assert extra <= allowed, f"backward peak {extra} bytes > {allowed}"
    if forced is not None:
        kernel = {"held-row": "rmsnorm_bwd_held_row_kernel",
                  "held-group": "rmsnorm_bwd_held_group_kernel",
                  "two-role": "rmsnorm_bwd_two_role_kernel"}[forced]  # fmt: skip
        assert kernel in launch.take_launch_configs()


#: shape -> the tuned kernels it launches when every launch takes 4 programs at most (so that the
#: loops iterate on a GPU as they do under the interpreter).
_PIPELINED_CASES = {
    (1000, 128): {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"},  # 8 row steps, the last partial
    (523, 512): {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"},
    (5, 20000): {"rmsnorm_fwd_kernel", "rmsnorm_bwd_row_dot_kernel", "rmsnorm_bwd_columns_kernel"},
    (6, 70000): {"rmsnorm_fwd_looped_kernel", "rmsnorm_bwd_row_dot_kernel",
                 "rmsnorm_bwd_columns_kernel"},  # 18 chunks, the last partial
}  # fmt: skip


def _stages_fit(kernel_name, config, block_n, stages, staged_bytes_per_element):
    """The single-tile forward's pipelined tile loop stages whole tiles in shared memory (x, and
    r with a residual): the tuner prunes stagings over PIPELINE_SHARED_BYTES, so the tests leave
    those unpipelined."""
    from impls.triton_rmsnorm import launch

    if kernel_name != "rmsnorm_fwd_kernel":
        return True
    staged = launch.tile_loop_staging({**config, "LOOP_STAGES": stages}, block_n,
                                      staged_bytes_per_element)  # fmt: skip
    return staged <= launch.PIPELINE_SHARED_BYTES


def _pipelined_launches(pretend_device, reading_tables, monkeypatch, stages,
                        staged_bytes_per_element):  # fmt: skip
    """Untuned launches at LOOP_STAGES = stages, at most 4 programs per launch (as under the
    interpreter): the loops a tuner may pipeline, each walking several steps.
    staged_bytes_per_element: what the forward stages per tile element (x's size, twice with a
    residual)."""
    from impls.triton_rmsnorm import configs, kernel_launch, launch

    heuristic = kernel_launch._heuristic_config

    def pipelined(kernel_name, block_n):
        config = heuristic(kernel_name, block_n)
        fits = _stages_fit(kernel_name, config, block_n, stages, staged_bytes_per_element)
        if "LOOP_STAGES" in config and fits:
            config.update(LOOP_STAGES=stages, num_stages=stages)
        if kernel_name == "rmsnorm_fwd_kernel":
            config["PROGRAMS_PER_SM"] = 1  # a persistent grid: each program walks several tiles
        return config

    reading_tables(False)  # no table: the heuristic's config
    monkeypatch.setattr(kernel_launch, "_heuristic_config", pipelined)
    pretend_device(sm_count=4)
    monkeypatch.setattr(configs, "HEURISTIC_PROGRAMS_PER_SM", 1)
    launch.take_launch_configs()  # forget earlier tests' launches
    return launch


#: The direct single-tile forward tests' shape: 37 rows in tiles of 4, 10 tiles, the last one
#: partial; with _programs_cap patched to 2, a persistent grid has 2 programs of 5 tiles.
_TILE_TEST_M, _TILE_TEST_N, _TILE_TEST_BLOCK_M = 37, 1000, 4


def _launch_single_tile_forward(args, programs_per_sm, residual, **switches):
    """rmsnorm_fwd_kernel launched directly at _TILE_TEST_BLOCK_M rows a tile, unpipelined,
    through launch._kernel_grid_and_meta as the product launches it; returns (grid, meta)."""
    from impls.triton_rmsnorm import kernels, launch

    m, n = _TILE_TEST_M, _TILE_TEST_N
    config = {"BLOCK_M": _TILE_TEST_BLOCK_M, "PROGRAMS_PER_SM": programs_per_sm, "LOOP_STAGES": 1}
    grid, meta = launch._kernel_grid_and_meta(
        "rmsnorm_fwd_kernel", lambda meta: (launch._tile_programs(m, meta, DEVICE),),
        {"BLOCK_N": launch.block_size(n), "HAS_RESIDUAL": residual, **switches, **config},
    )  # fmt: skip
    kernels.rmsnorm_fwd_kernel[grid](*args, num_warps=4, num_stages=1, **meta)
    return grid, meta


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("programs_per_sm", [0, 1], ids=["per-tile", "persistent"])
def test_single_tile_forward_grids_match_the_oracle(
    pretend_device, monkeypatch, programs_per_sm, residual, offset
):
    """The single-tile forward's two code paths: one program per tile (PERSISTENT False: no
    tile loop, w loaded after the reduction), as the tuner and the untuned launch run it, and a
    persistent grid (each program walks several tiles, w loaded once before its loop; here
    unpipelined, test_pipelined_loops_match_the_oracle runs 3 and 4 stages). Under the
    interpreter _launch always takes a persistent grid, so this is where CI runs the per-tile
    path. 37 rows in tiles of 4: 10 tiles, the last one partial; the persistent grid has 2
    programs of 5 tiles. Outputs start as NaN, so a row left unwritten fails."""
    from harness.oracle import RESIDUAL_SUM_TOLERANCE, reference_residual
    from impls.triton_rmsnorm import launch

    pretend_device(sm_count=2)
    m, n = _TILE_TEST_M, _TILE_TEST_N
    a, b = make_inputs((m, n), torch.bfloat16, DEVICE), make_inputs((m, n), torch.bfloat16, DEVICE)
    x, w = a.x, a.weight

    def unwritten(like):
        return torch.full_like(like, float("nan"))

    r, h = (b.x, unwritten(x)) if residual else (x, x)
    y, rstd = unwritten(x), torch.full((m,), float("nan"), device=DEVICE)
    args = launch._single_tile_forward_args(x, w, y, rstd, r, h, (n,) * 4, a.eps, offset)
    grid, meta = _launch_single_tile_forward(args, programs_per_sm, residual)
    assert meta["PERSISTENT"] == (programs_per_sm > 0) and "PROGRAMS_PER_SM" not in meta
    assert grid == ((2,) if programs_per_sm else (10,))

    # y judged for the h the kernel wrote (the interpreter rounds h toward zero), h on its own
    if residual:
        ref = reference_residual(x, r, w, a.eps, offset=offset, normalized=h)
        checks = [("y", y, ref.y, TOL["y"]), ("h", h, ref.h, RESIDUAL_SUM_TOLERANCE)]
    else:
        checks = [("y", y, reference(x, w, a.eps, offset=offset).y, TOL["y"])]
    for name, got, want, tol in checks:
        report = compare(name, got, want, torch.bfloat16, tol, n)
        assert report.passed, report.summary()
    normalized = (h if residual else x).to(torch.float32)
    want_rstd = torch.rsqrt(normalized.square().mean(dim=-1) + a.eps)
    torch.testing.assert_close(rstd, want_rstd, rtol=1e-5, atol=0)


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama", "gemma"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_one_program_an_sm_loads_w_early_with_the_same_bits(
    pretend_device, monkeypatch, residual, offset
):
    """W_EARLY: one program per tile loads w before the reduction where the grid is at most one
    program an SM (10 tiles, 64 SMs), and after it where more programs than SMs can hide the
    latency (10 tiles, 2 SMs), never in a persistent grid; the arithmetic is the same, so y,
    rstd (and h) are bitwise the same either way."""
    from impls.triton_rmsnorm import launch

    m, n = _TILE_TEST_M, _TILE_TEST_N
    a, b = make_inputs((m, n), torch.bfloat16, DEVICE), make_inputs((m, n), torch.bfloat16, DEVICE)
    outputs = {}
    for sms, persistent in ((2, 0), (64, 0), (64, 1)):
        pretend_device(sm_count=sms)
        r, h = (b.x, torch.full_like(a.x, float("nan"))) if residual else (a.x, a.x)
        y = torch.full_like(a.x, float("nan"))
        rstd = torch.full((m,), float("nan"), device=DEVICE)
        args = launch._single_tile_forward_args(a.x, a.weight, y, rstd, r, h, (n,) * 4, a.eps,
                                                offset)  # fmt: skip
        _grid, meta = _launch_single_tile_forward(args, persistent, residual)
        assert meta["W_EARLY"] == (sms == 64 and not persistent), (sms, persistent, meta)
        outputs[(sms, persistent)] = (y, rstd, h if residual else None)
    late, early, looped = outputs[(2, 0)], outputs[(64, 0)], outputs[(64, 1)]
    for got in (early, looped):
        for one, other in zip(late, got, strict=True):
            assert one is None or torch.equal(one, other)
    assert not torch.isnan(early[0]).any()


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("programs_per_sm", [0, 1], ids=["per-tile", "persistent"])
def test_contiguous_rows_take_constant_strides(
    pretend_device, monkeypatch, programs_per_sm, residual
):
    """With ROWS_CONTIGUOUS the single-tile forward replaces the row strides it is passed by the
    constant N: given wrong strides (N + 24) on contiguous rows it writes the same bits as
    without the switch on the same values laid out N + 24 apart. The launch path sets the
    switch exactly when every row stride (x, y, and with a residual r and h) is N."""
    from impls.triton_rmsnorm import kernel_launch, launch

    pretend_device(sm_count=2)
    m, n = _TILE_TEST_M, _TILE_TEST_N
    a, b = make_inputs((m, n), torch.bfloat16, DEVICE), make_inputs((m, n), torch.bfloat16, DEVICE)

    def spaced(t):  # t's values in rows 24 elements apart
        wide = torch.zeros((m, n + 24), dtype=t.dtype, device=t.device)
        wide[:, :n] = t
        return wide[:, :n]

    def packed(t):  # t's values in contiguous rows at the start of a spaced layout's memory, so
        # that a kernel wrongly following the passed strides stays in bounds and reads wrong rows
        memory = torch.zeros(m * (n + 24), dtype=t.dtype, device=t.device)
        memory[: m * n] = t.reshape(-1)
        return memory[: m * n].view(m, n)

    outputs = []
    for contiguous in (True, False):
        layout = packed if contiguous else spaced
        x = layout(a.x)
        r = layout(b.x) if residual else x
        h = layout(torch.zeros_like(a.x)) if residual else x
        y = layout(torch.zeros_like(a.x))
        rstd = torch.empty((m,), device=DEVICE)
        # the switch must ignore the strides passed: pass the spaced layout's on contiguous rows
        strides = (n + 24,) * 4
        args = launch._single_tile_forward_args(x, a.weight, y, rstd, r, h, strides, a.eps, 0.0)
        _launch_single_tile_forward(args, programs_per_sm, residual, ROWS_CONTIGUOUS=contiguous)
        outputs.append((y.contiguous(), rstd, h.contiguous()) if residual else (y, rstd))
    for got, want in zip(outputs[0], outputs[1], strict=True):
        assert torch.equal(got.contiguous(), want.contiguous())
    ref = reference(a.x, a.weight, a.eps).y if not residual else None
    if ref is not None:  # and the bits are right, not merely equal
        assert compare("y", outputs[0][0], ref, torch.bfloat16, TOL["y"], n).passed

    launched = []
    monkeypatch.setattr(
        kernel_launch,
        "_note_launch",
        lambda kernel, grid, args, meta, config=None: launched.append(meta),
    )
    layouts = [(a.x, b.x, True), (spaced(a.x), spaced(b.x), False)]
    if residual:  # one strided tensor is enough to clear the switch
        layouts += [(a.x, spaced(b.x), False), (spaced(a.x), b.x, False)]
    for x, r, contiguous in layouts:
        launch.rmsnorm_forward(x, a.weight, a.eps, residual=r if residual else None)
        assert launched.pop()["ROWS_CONTIGUOUS"] is contiguous


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("shape", list(_PIPELINED_CASES), ids=lambda s: "x".join(map(str, s)))
def test_pipelined_loops_match_the_oracle(
    pretend_device, reading_tables, monkeypatch, stages, dtype, shape
):
    """Every software-pipelined loop at LOOP_STAGES > 1 (the tuner may pick them; an untuned
    launch runs 1) against the oracle: the single-tile forward's tile loop (persistent grid),
    the single-tile backward's row loop, the wide backward's row-dot and column loops, the
    looped forward's two chunk loops, each with a partial last step or chunk."""
    element = torch.finfo(dtype).bits // 8
    launch = _pipelined_launches(pretend_device, reading_tables, monkeypatch, stages, element)
    inputs = make_inputs(shape, dtype, DEVICE)
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    launched = launch.take_launch_configs()
    assert set(launched) == _PIPELINED_CASES[shape]
    block_n = launch.block_size(shape[1])
    for kernel_name, config in launched.items():
        if "LOOP_STAGES" in config and _stages_fit(kernel_name, config, block_n, stages, element):
            assert config["LOOP_STAGES"] == stages, kernel_name
    if dtype == torch.bfloat16:  # every bf16 forward tile here fits: its loop is pipelined
        forward = launched.get("rmsnorm_fwd_kernel", {"LOOP_STAGES": stages})
        assert forward["LOOP_STAGES"] == stages


@pytest.mark.parametrize(
    "stages, dtype",
    [(1, torch.bfloat16), (3, torch.bfloat16), (4, torch.bfloat16), (1, torch.float32)],
    ids=["1-bf16", "3-bf16", "4-bf16", "1-fp32"],
)
def test_looped_forward_at_its_wider_chunk_matches_the_oracle(
    pretend_device, reading_tables, monkeypatch, stages, dtype
):
    """The looped forward's other chunk width (LOOPED_FORWARD_CHUNKS, a tuning choice): 70000
    columns in 16384-wide chunks, the last partial, each program walking two rows. fp32 chunks
    of that width are tuned unpipelined only (their staging does not fit the shared memory:
    test_tuning.py)."""
    from impls.triton_rmsnorm import kernel_launch

    launch = _pipelined_launches(
        pretend_device, reading_tables, monkeypatch, stages, torch.finfo(dtype).bits // 8
    )
    chunk = max(launch.LOOPED_FORWARD_CHUNKS)
    pipelined = kernel_launch._heuristic_config

    def wide_chunks(kernel_name, block_n):
        config = pipelined(kernel_name, block_n)
        if kernel_name == "rmsnorm_fwd_looped_kernel":
            config["BLOCK_N"] = chunk
        return config

    monkeypatch.setattr(kernel_launch, "_heuristic_config", wide_chunks)
    inputs = make_inputs((8, 70000), dtype, DEVICE)
    _assert_matches_oracle(inputs.x, inputs.weight, inputs.dy)
    forward = launch.take_launch_configs()["rmsnorm_fwd_looped_kernel"]
    assert (forward["BLOCK_N"], forward["LOOP_STAGES"]) == (chunk, stages)


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("shape", [(5, 20000), (523, 512)], ids=lambda s: "x".join(map(str, s)))
def test_pipelined_loops_with_a_residual(
    pretend_device, reading_tables, monkeypatch, stages, shape
):
    """The residual add pipelined: the single-tile forward's tile loop writing h (persistent
    grid), and the backward's loops reading the gradient on h (HAS_DH_OUT): the wide
    backward's column loop at N = 20000, the single-tile backward's row loop at N = 512."""
    from tests.helpers import check_residual as _check

    launch = _pipelined_launches(
        pretend_device, reading_tables, monkeypatch, stages, 2 * 2
    )  # bf16 x and r
    _check(shape, torch.bfloat16)
    launched = launch.take_launch_configs()
    backward = "rmsnorm_bwd_columns_kernel" if shape[1] > 16384 else "rmsnorm_bwd_kernel"
    assert launched[backward]["LOOP_STAGES"] == stages
    forward = launched["rmsnorm_fwd_kernel"]
    if _stages_fit("rmsnorm_fwd_kernel", forward, launch.block_size(shape[1]), stages, 2 * 2):
        assert forward["LOOP_STAGES"] == stages


def test_w_early_issues_ws_loads_before_the_reduction_on_sm90():
    """Compiled for sm_90 (no GPU needed), the per-tile forward with W_EARLY issues w's loads
    with x's, before the reduction's first shuffle; without it only x's come first."""
    from tests import sm90_compile

    case = {"kernel": "fwd", "x": "bf16", "stages": 1, "block_n": 4096, "extra": False,
            "persistent": False, "hold": False, "warps": 8}  # fmt: skip
    late, early = sm90_compile.run([{**case, "w_early": False}, {**case, "w_early": True}])
    assert late["loads before the reduction"] == 2, late  # x: two 16-byte vectors a thread
    assert early["loads before the reduction"] == 4, early  # x and w


def test_store_rstd_off_writes_no_rstd_on_sm90():
    """Compiled for sm_90 (no GPU needed), the plain and the shifted single-tile forwards store
    one fp32 a row (rstd) by default and none with STORE_RSTD False (a forward no backward
    follows: launch.rmsnorm_forward's keep_rstd)."""
    from tests import sm90_compile

    plain = {"kernel": "fwd", "x": "bf16", "stages": 1, "block_n": 4096, "extra": False,
             "persistent": False, "hold": False, "warps": 8, "count_fp32_stores": True}  # fmt: skip
    shifted = {**plain, "kernel": "fwd_shifted", "wrap": True}
    off = {"constexprs": {"STORE_RSTD": False}}
    found = sm90_compile.run([plain, {**plain, **off}, shifted, {**shifted, **off}])
    assert [case["fp32 stores"] for case in found] == [1, 0, 1, 0], found
