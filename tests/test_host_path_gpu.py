"""The C++ host path (impls/triton_rmsnorm/host_path.py) on a GPU: a call it serves gives bitwise
the outputs of Python's path (the same kernels and parameters), forward, no-grad forward and
backward, at the layouts it takes; what it does not serve falls through to Python's path; it
launches on the current stream, inside CUDA-graph captures too; a double backward still
raises; its entries go when the tables change.

Builds the module first (about 40 s, once per source and torch version)."""

from __future__ import annotations

import pytest
import torch

from impls.triton_rmsnorm import direct, dispatch, host_path, launch, rmsnorm
from impls.triton_rmsnorm.function import DOUBLE_BACKWARD_ERROR
from tests.conftest import ON_GPU

pytestmark = pytest.mark.skipif(not ON_GPU, reason="the C++ host path launches on a GPU only")

EPS = 1e-6


@pytest.fixture(scope="module")
def host_on():
    was = host_path.current()  # on by default where built
    host_path.build()
    assert host_path.turn_on(), host_path.unavailable_reason()
    yield host_path.MODULE
    if was == "python":
        host_path.turn_off()


def _inputs(shape, dtype, w_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to("cuda", dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to("cuda", w_dtype or dtype)
    dy = torch.randn(shape, generator=gen).to("cuda", dtype)
    return x, w, dy


def _python_path(x, w, dy, offset=0.0, eps=EPS):
    """Python's path alone (the host path set aside for the call)."""
    with host_path.set_aside():
        return _fwd_bwd(x, w, dy, offset, eps)


def _fwd_bwd(x, w, dy, offset=0.0, eps=EPS):
    """y, dx, dw and the no-grad y; x and w keep their layouts (detached views, not copies)."""
    xg, wg = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    y = rmsnorm(xg, wg, eps, offset=offset)
    dx, dw = torch.autograd.grad(y, (xg, wg), dy)
    with torch.no_grad():
        y_nograd = rmsnorm(x, w, eps, offset=offset)
    return y, dx, dw, y_nograd


def _served(x, w, dy, offset=0.0, eps=EPS):
    """The outputs of calls the C++ module serves: the first call records and registers, the
    second must launch from C++: both forwards and the backward, none through Python's
    replays."""
    _fwd_bwd(x, w, dy, offset, eps)
    replayed, served = direct.replayed_launches, host_path.MODULE.served()
    outputs = _fwd_bwd(x, w, dy, offset, eps)
    assert direct.replayed_launches == replayed, "a call went through Python's replays"
    forwards, backwards = (a - b for a, b in zip(host_path.MODULE.served(), served, strict=True))
    assert (forwards, backwards) == (2, 1), "not every call was launched from C++"
    return outputs


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_same_bits(a, b):
    for name, p, q in zip(("y", "dx", "dw", "y no-grad"), a, b, strict=True):
        assert p.shape == q.shape and p.dtype == q.dtype, name
        assert torch.equal(_bits(p), _bits(q)), name


@pytest.mark.parametrize("shape", [(1, 4096), (64, 4096), (1024, 8192), (2048, 4096),
                                   (8, 8192), (2, 64, 2048), (3, 5, 7, 1024)])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_served_calls_give_pythons_bits(host_on, shape, dtype):
    x, w, dy = _inputs(shape, dtype)
    _assert_same_bits(_served(x, w, dy), _python_path(x, w, dy))


def test_fp32_weight_offset_and_other_eps_give_pythons_bits(host_on):
    x, w, dy = _inputs((256, 3072), torch.bfloat16, torch.float32)
    _assert_same_bits(_served(x, w, dy, offset=1.0, eps=1e-5),
                      _python_path(x, w, dy, offset=1.0, eps=1e-5))  # fmt: skip
    _assert_same_bits(_served(x, w, dy, eps=1e-3), _python_path(x, w, dy, eps=1e-3))


def test_strided_rows_and_a_strided_gradient(host_on):
    base, w, _ = _inputs((512, 6144), torch.bfloat16)
    x = base[:, 1024:5120]  # rows 6144 apart
    w = w[:4096].contiguous()
    dy = torch.randn(512, 8192, device="cuda", dtype=torch.bfloat16)[:, :4096]  # rows 8192 apart
    _assert_same_bits(_served(x, w, dy), _python_path(x, w, dy))
    dy_t = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16).t()  # copied, as in Python
    _assert_same_bits(_served(x, w, dy_t), _python_path(x, w, dy_t))


def test_served_calls_report_their_recording_calls_launch_configs(host_on):
    """The harness's launch column: a served call reports what its entry's recording call
    launched (take_launch_configs)."""
    x, w, dy = _inputs((2048, 4096), torch.bfloat16)
    launch.take_launch_configs()
    _fwd_bwd(x, w, dy)  # records (and registers) both directions
    recorded = launch.take_launch_configs()
    assert recorded, "the recording call launched no tuned kernel"
    _served(x, w, dy)
    assert launch.take_launch_configs() == recorded
    assert launch.take_launch_configs() == {}


def test_what_it_does_not_serve_takes_pythons_path(host_on):
    x, w, dy = _inputs((128, 4096), torch.float16)
    _served(x, w, dy)  # the plain call's layout has an entry
    with torch.no_grad():
        assert host_on.forward(x, w, EPS, 0.0) is not None
        assert host_on.forward(x.t().contiguous().t(), w, EPS, 0.0) is None  # Python copies it
        assert (
            host_on.forward(x.view(2, 64, 4096)[:, ::2], w, EPS, 0.0) is None
        )  # rows strided twice
        assert host_on.forward(x, w.to(torch.float32), EPS, 0.0) is None  # no entry for it
        assert host_on.forward(x, w[:2048], EPS, 0.0) is None  # w of another width
        assert host_on.forward(x, w, -1.0, 0.0) is None  # Python's path raises on it
        assert host_on.forward(x, w, float("nan"), 0.0) is None
    served = host_on.served()
    rmsnorm(x, w, EPS, residual=torch.randn_like(x))
    rmsnorm(x, w, EPS, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="eps"):
        rmsnorm(x, w, -1.0)
    assert host_on.served() == served


def test_double_backward_still_raises(host_on):
    x, w, dy = _inputs((64, 2048), torch.bfloat16)
    _served(x, w, dy)
    xg = x.clone().requires_grad_(True)
    y = rmsnorm(xg, w, EPS)
    assert "CppNode" in y.grad_fn.name()
    (dx,) = torch.autograd.grad(y, xg, dy, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(dx.sum(), xg)
    assert "double backward" in DOUBLE_BACKWARD_ERROR


def test_launches_on_the_current_stream_and_inside_a_capture(host_on):
    x, w, dy = _inputs((512, 4096), torch.bfloat16)
    expected = _python_path(x, w, dy)[3]
    _served(x, w, dy)
    forwards = host_on.served()[0]
    late = torch.zeros_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        torch.cuda._sleep(10_000_000)
        late.copy_(x)  # x's values reach `late` only on this stream, after the sleep
        y = rmsnorm(late, w, EPS)  # launched on another stream, it would read zeros
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(y, expected)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y_graph = rmsnorm(x, w, EPS)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_graph, expected)
    assert host_on.served()[0] == forwards + 2  # the stream's call and the captured one


def test_a_table_change_forgets_the_entries(host_on):
    x, w, dy = _inputs((64, 4096), torch.bfloat16)
    _served(x, w, dy)
    assert host_on.size() > 0
    dispatch.reload()
    assert host_on.size() == 0
    _assert_same_bits(_served(x, w, dy), _python_path(x, w, dy))
