"""The cached direct launch (impls/triton_rmsnorm/direct.py): its specialization key must tell
apart exactly the arguments Triton's binder tells apart, or a wrong binary runs silently."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from harness.checks import check_backend
from harness.inputs import make_inputs
from impls import get_backend
from impls.triton_rmsnorm import (
    common,
    configs,
    direct,
    dispatch,
    kernel_launch,
    launch,
    replays,
    rmsnorm,
)
from tests.conftest import DEVICE, ON_GPU

INTS = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, 2**63]
FLOATS = [0.0, 1.0, 1e-6]


def _tensors():
    base = torch.zeros(64, dtype=torch.bfloat16)
    # CPU allocations are 64-byte aligned: offsets of 1 and 4 elements are not 16-byte aligned
    return [
        base,
        base[1:],
        base[4:],
        base[8:],
        torch.zeros(8, dtype=torch.float32),
        torch.zeros(16, dtype=torch.float16)[2:],
    ]


def _triton_specialization():
    """Triton's own specializer (triton >= 3.4 exports it from its C++ core), else skip."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this triton has no native_specialize_impl")

    def specialize(value, specialize_value, align):
        return native_specialize_impl(BaseBackend, value, False, specialize_value, align)

    return specialize


def _key(value, constexpr=False, specialize=True, align=True):
    """The direct launch's key for one argument, through a keyer made for value's type."""
    return direct._make_keyer([(constexpr, specialize, align)], (value,))(value)


@pytest.mark.parametrize("specialize_value", [True, False])
@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("kind", ["int", "float", "tensor"])
def test_key_separates_exactly_what_triton_specializes(specialize_value, align, kind):
    triton_key = _triton_specialization()
    values = {"int": INTS, "float": FLOATS, "tensor": _tensors()}[kind]
    keyer = direct._make_keyer([(False, specialize_value, align)], (values[0],))
    ours = [keyer(v) for v in values]
    theirs = [triton_key(v, specialize_value, align) for v in values]
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        same_ours, same_theirs = ours[i] == ours[j], theirs[i] == theirs[j]
        assert same_ours == same_theirs, (
            f"{a!r} vs {b!r}: Triton specializes them as {theirs[i]} / {theirs[j]}, "
            f"the direct-launch key as {ours[i]} / {ours[j]}"
        )


def test_keys_of_several_arguments_separate_what_triton_separates():
    """Guards and terms of several arguments combined: a tensor, a specialized int, an
    unspecialized int and a float, in every combination of a few values each."""
    triton_key = _triton_specialization()
    rules = [(False, True, True), (False, True, True), (False, False, True), (False, True, True)]
    tensors, ints, floats = _tensors()[:3], [1, 16, 17, 2**31], [1e-6, 0.5]
    samples = list(itertools.product(tensors, ints, ints, floats))
    keyer = direct._make_keyer(rules, samples[0])
    ours = [keyer(*args) for args in samples]
    theirs = [
        tuple(triton_key(a, spec, align) for a, (_, spec, align) in zip(args, rules, strict=True))
        for args in samples
    ]
    for i, j in itertools.combinations(range(len(samples)), 2):
        assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (samples[i], samples[j])


def test_a_keyer_sends_other_argument_types_to_tritons_path():
    """Made at a kernel's first launch for its argument types; another type gives no key (None,
    or AttributeError for a non-tensor where a tensor was), so that launch takes Triton's path."""
    int_keyer = direct._make_keyer([(False, True, True)], (16,))
    assert int_keyer(16.0) is None
    assert int_keyer(True) is None
    float_keyer = direct._make_keyer([(False, True, True)], (1e-6,))
    assert float_keyer(1) is None
    tensor_keyer = direct._make_keyer([(False, True, True)], (torch.zeros(4),))
    with pytest.raises(AttributeError):
        tensor_keyer(3)


def test_no_launch_hook_by_default_and_a_set_one_is_seen(monkeypatch):
    """Triton keeps an empty hook chain in each slot: that is no hook. A hook added to it, or
    set in place of it, sends launches through Triton's own path (profilers read the hooks)."""
    from triton import knobs

    assert not direct._hooks_installed()
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        hook = lambda metadata: None  # noqa: E731
        chain.add(hook)
        try:
            assert direct._hooks_installed()
        finally:
            chain.remove(hook)
        assert not direct._hooks_installed()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", lambda metadata: None)
    assert direct._hooks_installed()


def test_constexpr_arguments_key_on_their_value():
    assert _key(64, constexpr=True) != _key(128, constexpr=True)


def test_trailing_parameters_left_out_take_their_defaults():
    """A launch's meta may leave out a defaulted constexpr (the single-tile forward's
    ROWS_CONTIGUOUS): the direct launch and a Replay pass its default, as Triton's binder
    does; a parameter with no default and no value is a clear error."""
    from impls.triton_rmsnorm import kernels

    kernel = kernels.rmsnorm_fwd_kernel
    leading = kernel.arg_names.index("ROWS_BUCKET") + 1
    meta = {"BLOCK_M": 1, "BLOCK_N": 64, "HAS_RESIDUAL": False, "PERSISTENT": False,
            "LOOP_STAGES": 1}  # fmt: skip
    # ROWS_CONTIGUOUS, HOLD_STORAGE_FORM, W_EARLY, HEADS, STRIDE_X_OUTER, STORE_RSTD,
    # WAIT_FOR_PRIOR_GRID
    defaults = [False, False, False, 1, 0, True, False]
    assert direct._trailing(kernel, leading, meta) == [1, 64, False, False, 1, *defaults]
    given = direct._trailing(kernel, leading, {**meta, "ROWS_CONTIGUOUS": True})
    assert given[kernel.arg_names.index("ROWS_CONTIGUOUS") - leading] is True
    replay = direct.Replay(kernel, None, (1,), meta, leading)
    assert replay.tail == (1, 64, False, False, 1, *defaults)
    with pytest.raises(TypeError, match="no value for parameter BLOCK_N"):
        direct._trailing(kernel, leading, {k: v for k, v in meta.items() if k != "BLOCK_N"})


def test_unsupported_argument_type_is_an_error():
    with pytest.raises(TypeError, match="unsupported argument type"):
        _key("a string")


@pytest.mark.skipif(not ON_GPU, reason="direct launches happen only on a GPU")
def test_launches_after_the_first_go_direct_and_stay_correct(python_host_path):
    """Aligned, misaligned and single-row inputs through one cache: each specialization gets
    its own compiled kernel, and the check mode (set by conftest) compares every cached launch
    with Triton's own choice."""
    assert direct.check_enabled()
    hits = direct.cached_launches + direct.replayed_launches
    for shape, offset in [((256, 1024), 0), ((256, 1024), 1), ((1, 1024), 0), ((256, 1000), 3)]:
        wide = make_inputs((shape[0], shape[1] + offset), torch.bfloat16, DEVICE)
        inputs = dataclasses.replace(
            wide, x=wide.x[:, offset:], weight=wide.weight[offset:], dy=wide.dy[:, offset:]
        )
        for _ in range(2):  # the second call takes the cached path
            result = check_backend(get_backend("triton"), rmsnorm, inputs)
            assert result.passed, result.summary()
        launched = direct.cached_launches + direct.replayed_launches
        assert launched > hits, f"{shape}, offset {offset}: no cached launch"
        hits = launched


@pytest.mark.skipif(not ON_GPU, reason="direct launches happen only on a GPU")
def test_check_mode_catches_a_key_that_ignores_alignment(monkeypatch):
    """Negative control: a key blind to pointer alignment reuses an aligned binary for a
    misaligned input; the check mode must raise."""
    monkeypatch.setattr(direct, "_COMPILED", {})
    monkeypatch.setattr(direct, "_KEYERS", {})
    real = direct._arg_terms

    def blind(name, value, *rule):
        guard, terms = real(name, value, *rule)
        return guard, terms[:1] if isinstance(value, torch.Tensor) else terms  # dtype only

    monkeypatch.setattr(direct, "_arg_terms", blind)
    base = torch.randn(64, 2049, device=DEVICE, dtype=torch.bfloat16)
    weight = torch.ones(2048, device=DEVICE, dtype=torch.bfloat16)
    rmsnorm(base[:, :2048], weight)
    with pytest.raises(RuntimeError, match="specialization key misses something"):
        rmsnorm(base[:, 1:], weight)


# ---- replays (launch.py): later calls of a signature repeat its recorded launches --------------


def _strided(shape, dtype, offset, row_pad=0):
    """[M, N] rows starting `offset` elements into a wider buffer (misaligned when odd), each
    row N + offset + row_pad elements apart."""
    m, n = shape
    base = torch.randn(m, n + offset + row_pad, device=DEVICE, dtype=dtype)
    return base[:, offset : offset + n]


def test_replay_keys_separate_what_decides_a_launch():
    """Alignment, row stride, shape, dtypes, output dtype and residual gradient each change the
    key; the values of the data do not. Misaligned variants keep the row stride of the aligned
    one (offset 1 with row pad 0 against offset 0 with row pad 1), so alignment alone differs."""
    x = _strided((8, 64), torch.bfloat16, 0, row_pad=1)
    w = torch.ones(64, device=DEVICE, dtype=torch.bfloat16)
    key = launch._forward_replay_key(x, w, None)
    assert key == launch._forward_replay_key(torch.randn(8, 65, device=DEVICE,
                                                         dtype=torch.bfloat16)[:, :64], w, None)  # fmt: skip
    for other in [
        (_strided((8, 64), torch.bfloat16, 1), w, None),  # misaligned x
        (x, torch.ones(65, device=DEVICE, dtype=torch.bfloat16)[1:], None),  # misaligned w
        (_strided((8, 64), torch.bfloat16, 0, row_pad=16), w, None),  # row stride
        (_strided((9, 64), torch.bfloat16, 0, row_pad=1), w, None),  # M
        (x.float(), w, None),
        (x, w.float(), None),
        (x, w, torch.float32),
    ]:
        assert launch._forward_replay_key(*other) != key
    rstd = torch.ones(8, device=DEVICE)
    dy = _strided((8, 64), torch.bfloat16, 0, row_pad=1)
    bkey = launch._backward_replay_key(dy, x, w, rstd, None)
    assert bkey == launch._backward_replay_key(
        _strided((8, 64), torch.bfloat16, 0, row_pad=1), x, w, rstd.clone(), None
    )
    for other in [
        (_strided((8, 64), torch.bfloat16, 1), x, w, rstd, None),  # misaligned dy
        (_strided((8, 64), torch.bfloat16, 0, row_pad=16), x, w, rstd, None),  # dy row stride
        (dy, _strided((8, 64), torch.bfloat16, 1), w, rstd, None),  # misaligned x
        (dy, x, w, torch.ones(9, device=DEVICE)[1:], None),  # misaligned rstd
        (dy, x, w, rstd.half(), None),  # rstd's dtype
        (dy, x, w, rstd, dy),  # a residual's gradient
        (dy.float(), x, w, rstd, None),
    ]:
        assert launch._backward_replay_key(*other) != bkey


_REPLAY_CASES = (
    [
        ((256, 1024), torch.bfloat16, 0, 1, None),
        ((256, 1024), torch.bfloat16, 1, 0, None),  # misaligned rows, same row stride
        ((256, 1024), torch.bfloat16, 0, 8, None),  # another row stride
        ((256, 1024), torch.bfloat16, 0, 1, torch.float32),
        ((3, 4096), torch.float16, 0, 0, None),
        ((1000, 96), torch.float32, 2, 0, None),
    ]
    if ON_GPU
    else [
        ((16, 256), torch.float32, 0, 1, None),
        ((16, 256), torch.float32, 1, 0, None),
        ((16, 256), torch.float32, 0, 1, torch.float16),
        ((5, 96), torch.float16, 2, 0, None),
    ]
)


def test_replays_give_the_first_calls_bits(python_host_path):
    """Forward and backward, three calls per signature: the first records, the later two replay
    (on a GPU, check mode, set by conftest, asks Triton for each replay's binary; under the
    interpreter a replay relaunches through Triton, which tests its key, arguments and
    allocations) and give the first call's bits. Signatures that differ only in alignment, row
    stride or output dtype, run one after the other, each get their own replay."""
    assert direct.check_enabled() == ON_GPU
    for shape, dtype, offset, row_pad, out_dtype in _REPLAY_CASES:
        x = _strided(shape, dtype, offset, row_pad).requires_grad_(True)
        w = torch.randn(shape[1], device=DEVICE, dtype=dtype, requires_grad=True)
        dy = torch.randn(shape, device=DEVICE, dtype=out_dtype or dtype)
        before = direct.replayed_launches
        results = []
        for _ in range(3):
            y = rmsnorm(x, w, 1e-6, out_dtype=out_dtype)
            results.append((y, *torch.autograd.grad(y, (x, w), dy)))
        for later in results[1:]:
            assert all(torch.equal(a, b) for a, b in zip(results[0], later, strict=True))
        # calls 2 and 3 replay one forward launch and two backward launches each
        assert direct.replayed_launches - before == 6, (shape, offset, row_pad, out_dtype)


def test_forward_replays_on_their_own(python_host_path):
    """Inference calls replay the forward alone: exactly one replayed launch per later call."""
    x = _strided((8, 512) if not ON_GPU else (64, 2048), torch.float32, 1)
    w = torch.randn(x.shape[1], device=DEVICE)
    before = direct.replayed_launches
    with torch.no_grad():
        first = rmsnorm(x, w)
        for _ in range(2):
            assert torch.equal(rmsnorm(x, w), first)
    assert direct.replayed_launches - before == 2


@pytest.mark.parametrize("shape", [(8, 512), (9, 4097)])  # plain; odd rows: shifted kernel
def test_a_forward_no_backward_follows_writes_no_rstd(shape, python_host_path):
    """Under no_grad the single tile writes no rstd (STORE_RSTD False, one allocation fewer):
    launch.rmsnorm_forward returns None for it, y has the grad-mode call's bits, at the first
    call and at its replays, whose key keeps the two apart."""
    x = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(shape[1], device=DEVICE, dtype=torch.bfloat16)
    kept, rstd, _ = launch.rmsnorm_forward(x, w, 1e-6)
    assert rstd is not None and rstd.shape == (shape[0],)
    assert launch._forward_replay_key(x, w, None, False) != launch._forward_replay_key(x, w, None)
    before = direct.replayed_launches
    for _ in range(3):  # the first records, the later two replay
        y, none, _ = launch.rmsnorm_forward(x, w, 1e-6, keep_rstd=False)
        assert none is None and torch.equal(y, kept)
    assert direct.replayed_launches - before == 2
    with torch.no_grad():
        assert torch.equal(rmsnorm(x, w, 1e-6), kept)
    _, again, _ = launch.rmsnorm_forward(x, w, 1e-6)  # the kept-rstd replay is its own
    assert torch.equal(again, rstd)


@pytest.mark.skipif(not ON_GPU, reason="check mode verifies compiled kernels: GPU only")
def test_check_mode_catches_a_replay_key_that_ignores_alignment(monkeypatch):
    """Negative control: a replay key blind to x's alignment replays an aligned binary for a
    misaligned input; the check mode must raise."""
    real = launch._forward_replay_key

    def blind(x, weight, out_dtype, keep_rstd=True):
        key = real(x, weight, out_dtype, keep_rstd)
        return key[:7] + key[8:]  # drops x's alignment

    monkeypatch.setattr(launch, "_forward_replay_key", blind)
    base = torch.randn(64, 2049, device=DEVICE, dtype=torch.bfloat16)
    weight = torch.ones(2048, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            rmsnorm(base[:, :2048], weight)
        with pytest.raises(RuntimeError, match="replay key misses something"):
            rmsnorm(base[:, 1:], weight)


@pytest.mark.skipif(not ON_GPU, reason="tuning needs a GPU to time configs")
def test_replays_after_tuning(monkeypatch, python_host_path):
    """Tuning on (dispatch.tuning), the first call tunes and launches the tuned configuration,
    recording nothing; the second records the entry's launches and the later two replay them,
    all with the first call's bits."""
    x = torch.randn(384, 2048, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    before = direct.replayed_launches
    results = []
    with dispatch.tuning() as table:
        for call in range(4):
            y = rmsnorm(x, w)
            results.append((y, *torch.autograd.grad(y, (x, w), dy)))
            if call == 0:
                tuned = dict(kernel_launch._TUNED)
                assert tuned and len(table) == 2, "the first call did not tune"
                assert not replays.recorded()
                launch.take_launch_configs()  # the first call's measured paths: every candidate
    for later in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], later, strict=True))
    launched = launch.take_launch_configs()
    # calls 3 and 4 replay the forward's launch and the backward's two (the single tile and its
    # dw reduction) or one (the two-role kernel, where the first call measured it faster)
    backward_launches = 1 if "rmsnorm_bwd_two_role_kernel" in launched else 2
    assert direct.replayed_launches - before == 2 + 2 * backward_launches
    # the tuned forward configuration, as a call of 384 rows launches it (configs.one_row_tiles)
    sms = common._programs_cap(x.device)
    forward_tuned = [configs.one_row_tiles(c, 384, 2048, 2, sms)
                     for key, c in tuned.items() if key[0] == "rmsnorm_fwd_kernel"]  # fmt: skip
    assert launched["rmsnorm_fwd_kernel"] in forward_tuned
