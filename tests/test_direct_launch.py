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
from impls.triton_rmsnorm import direct, rmsnorm
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


def test_unsupported_argument_type_is_an_error():
    with pytest.raises(TypeError, match="unsupported argument type"):
        _key("a string")


@pytest.mark.skipif(not ON_GPU, reason="direct launches happen only on a GPU")
def test_launches_after_the_first_go_direct_and_stay_correct():
    """Aligned, misaligned and single-row inputs through one cache: each specialization gets
    its own compiled kernel, and the check mode (set by conftest) compares every cached launch
    with Triton's own choice."""
    assert direct.check_enabled()
    hits = direct.cached_launches
    for shape, offset in [((256, 1024), 0), ((256, 1024), 1), ((1, 1024), 0), ((256, 1000), 3)]:
        wide = make_inputs((shape[0], shape[1] + offset), torch.bfloat16, DEVICE)
        inputs = dataclasses.replace(
            wide, x=wide.x[:, offset:], weight=wide.weight[offset:], dy=wide.dy[:, offset:]
        )
        for _ in range(2):  # the second call takes the cached path
            result = check_backend(get_backend("triton"), rmsnorm, inputs)
            assert result.passed, result.summary()
        assert direct.cached_launches > hits, f"{shape}, offset {offset}: no cached launch"
        hits = direct.cached_launches


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
