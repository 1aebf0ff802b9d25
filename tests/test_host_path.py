"""The C++ host path (impls/triton_rmsnorm/host_path.py, host_node.cpp) on a CPU: what a recorded
call registers with it (each kernel parameter in its place), and the built module's
bookkeeping. Its launches run on a GPU only (tests/test_host_path_gpu.py)."""

from __future__ import annotations

import inspect
import shutil
import threading
import time
import types
import warnings

import pytest
import torch
from torch.utils.cpp_extension import is_ninja_available

from impls.triton_rmsnorm import direct, dispatch, host_path, kernels, launch, replays
from impls.triton_rmsnorm.function import rmsnorm
from tests.conftest import ON_GPU

T = host_path._Tensor

#: These tests record calls of CPU tensors, which run through the interpreter (CPU machines).
cpu_calls = pytest.mark.skipif(ON_GPU, reason="records CPU calls: the interpreter's machines")


def test_parameter_template_packs_each_kind_in_signature_order():
    signature = ["*fp16", "constexpr", "i32", "fp32", "i64", "u64", "i1", "u8", "fp32", "fp32"]
    args = (T(3), 128, 7, 0.5, -3, 2**63 + 5, True, 200, host_path.EPS, host_path.OFFSET)
    kinds, slots, values = host_path.parameter_template(signature, args)
    assert kinds == "pifllbueo"
    assert slots[0] == 3
    assert values[:6] == [0, 7, 0x3F000000, -3, 2**63 + 5 - 2**64, 1]
    assert values[6] == 200


@pytest.mark.parametrize(
    "signature, args, message",
    [
        (["*fp16"], (5,), "without a tensor slot"),
        (["i32"], (T(0),), "a tensor where"),
        (["i32"], (host_path.EPS,), "not fp32"),
        (["fp64"], (1.0,), "parameter type fp64"),
        (["i32", "i32"], (1,), "1 arguments for a signature of 2"),
    ],
)
def test_parameter_template_refuses_what_it_cannot_describe(signature, args, message):
    with pytest.raises(host_path.Unsupported, match=message):
        host_path.parameter_template(signature, args)


_POINTERS = {"X", "W", "Y", "RSTD", "R", "H", "DY", "DX", "DW_PARTIAL", "DH_OUT", "DW"}


def _declared_signature(kernel) -> dict[str, str]:
    """The kernel's parameters as its compiled signature lists them, from its declaration:
    constexprs, pointers (by name), fp32 eps and offset, i32 the rest."""
    out = {}
    for name, parameter in inspect.signature(kernel.fn).parameters.items():
        if "constexpr" in str(parameter.annotation):
            out[name] = "constexpr"
        elif name in _POINTERS:
            out[name] = "*fp16"
        else:
            out[name] = "fp32" if name in ("eps", "offset") else "i32"
    return out


def _compiled(kernel):
    """Stands in for the compiled kernel a GPU replay holds (the interpreter's have none)."""
    meta = types.SimpleNamespace(num_warps=4, shared=1024, num_ctas=1, launch_pdl=True,
                                 launch_cooperative_grid=False, global_scratch_size=0,
                                 profile_scratch_size=0)  # fmt: skip
    signature = _declared_signature(kernel)
    return types.SimpleNamespace(function=0xABC, metadata=meta,
                                 src=types.SimpleNamespace(signature=signature))  # fmt: skip


def _by_name(kernel, template) -> dict[str, tuple]:
    """A launch template's (kind, slot, value) per parameter name of the kernel."""
    _function, _grid, _threads, _shared, _pdl, _scratch, kinds, slots, values = template
    names = [n for n, ty in _declared_signature(kernel).items() if ty != "constexpr"]
    assert len(names) == len(kinds)
    return {name: (kinds[i], slots[i], values[i]) for i, name in enumerate(names)}


class _Module:
    """Stands in for the built module: dtype codes, and what register adds."""

    def __init__(self):
        self.added, self.cleared, self.asked = [], 0, []
        self.latest = (-1, -1)

    def forward(self, x, w, eps, offset):
        self.asked.append((tuple(x.shape), eps, offset))
        return None  # no entry: Python's path serves the call

    def dtype_code(self, t):
        return {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}[t.dtype]

    def add(self, fields, templates, partial_rows, tag):
        self.added.append((fields, templates, partial_rows, tag))

    def take_latest(self):
        latest, self.latest = self.latest, (-1, -1)
        return latest

    def clear(self):
        self.cleared += 1


@pytest.fixture
def fake_module(monkeypatch):
    module = _Module()
    monkeypatch.setattr(host_path, "MODULE", module)
    monkeypatch.setattr(host_path, "_LOADED", module)
    return module


def _recorded_call(m: int, n: int, grad: bool):
    """Run one call on the CPU (the interpreter) and return its recorded replays per direction."""
    replays.forget()
    x = torch.randn(m, n, dtype=torch.bfloat16, requires_grad=grad)
    w = torch.rand(n, dtype=torch.float32, requires_grad=grad)
    y = rmsnorm(x, w, 1e-6)
    if grad:
        y.backward(torch.randn_like(y))
    return {key[0]: (_as_if_cuda(key), value) for key, value in replays.recorded().items()}


def _as_if_cuda(key: tuple) -> tuple:
    """A CPU call's replay key as a CUDA x's would read (its is_cuda, before the device)."""
    return (*key[:-2], True, key[-1])


@cpu_calls
@pytest.mark.parametrize("grad", [True, False])
def test_forward_entry_puts_each_tensor_and_scalar_in_its_parameter(fake_module, grad):
    recorded = _recorded_call(8, 256, grad)
    key, ((replay,), _configs, extra) = recorded["fwd"]
    replay.compiled = _compiled(kernels.rmsnorm_fwd_kernel)
    fields, (template,), partial_rows = host_path.forward_entry(fake_module, key, [replay], extra)
    assert fields == [1, 8, 256, 256, 15, 6, 15, int(grad), key[7], key[8], -1]
    assert partial_rows == 0
    assert template[:6] == (0xABC, replay.grid[0], 128, 1024, True, host_path.SCRATCH_POINTERS)
    params = _by_name(kernels.rmsnorm_fwd_kernel, template)
    slots = {name: params[name][1] for name in ("X", "W", "Y", "RSTD", "R", "H")}
    assert slots == {"X": 0, "W": 1, "Y": 2, "RSTD": 3 if grad else 2, "R": 0, "H": 0}
    assert params["eps"][0] == "e" and params["offset"][0] == "o"
    assert params["M"] == ("i", 0, 8)
    assert params["stride_x_row"] == ("i", 0, 256) and params["stride_y_row"] == ("i", 0, 256)
    assert params["ROWS_BUCKET"] == ("i", 0, (8).bit_length())


@cpu_calls
def test_backward_entry_puts_each_tensor_in_its_parameter(fake_module):
    recorded = _recorded_call(8, 256, grad=True)
    key, (launches, _configs, extra) = recorded["bwd"]
    for replay in launches:
        replay.compiled = _compiled(replay.kernel)
    fields, templates, partial_rows = host_path.backward_entry(fake_module, key, launches, extra)
    assert fields[:8] == [2, 8, 256, 256, 256, 15, 6, 15] and fields[-1] == -1
    main = launches[0].kernel
    params = _by_name(main, templates[0])
    if main is kernels.rmsnorm_bwd_two_role_kernel:
        assert partial_rows == 0 and len(templates) == 1
        assert params["DW"][:2] == ("p", 6)
    else:
        assert main is kernels.rmsnorm_bwd_kernel
        assert partial_rows == extra[0] and len(templates) == 2
        assert params["DW_PARTIAL"][:2] == ("p", 5)
        reduce = _by_name(launches[1].kernel, templates[1])
        assert reduce["DW_PARTIAL"][:2] == ("p", 5) and reduce["DW"][:2] == ("p", 6)
        assert reduce["rows"] == ("i", 0, partial_rows)
    slots = {name: params[name][1] for name in ("X", "W", "DY", "RSTD", "DX", "DH_OUT")}
    assert slots == {"X": 1, "W": 2, "DY": 0, "RSTD": 3, "DX": 4, "DH_OUT": 0}
    assert params["offset"][0] == "o"
    assert params["rows_per_program"] == ("i", 0, extra[1])


@cpu_calls
def test_register_adds_described_replays_only(fake_module):
    recorded = _recorded_call(8, 256, grad=True)
    key, ((replay,), configs, extra) = recorded["fwd"]
    host_path.register(key, [replay], configs, extra)  # the interpreter's: no compiled kernel
    host_path.register(("tag", *key), [replay], configs, extra)  # a kernel test's override
    assert fake_module.added == []
    replay.compiled = _compiled(kernels.rmsnorm_fwd_kernel)
    host_path.register(key, [replay], configs, extra)
    assert len(fake_module.added) == 1
    replay.compiled.metadata.launch_cooperative_grid = True
    host_path.register(key, [replay], configs, extra)
    assert len(fake_module.added) == 1


@cpu_calls
def test_a_call_recorded_with_the_path_set_aside_is_registered(fake_module):
    """Python's replays record a key once: one recorded inside set_aside must reach the module
    too, or the C++ path never serves it (a test's Python-path reference call made first)."""
    recorded = _recorded_call(8, 256, grad=False)
    key, ((replay,), configs, extra) = recorded["fwd"]
    replay.compiled = _compiled(kernels.rmsnorm_fwd_kernel)
    with host_path.set_aside():
        assert host_path.current() == "python"
        host_path.register(key, [replay], configs, extra)
    assert len(fake_module.added) == 1 and host_path.current() == "cpp"


def test_set_aside_nests_and_keeps_a_turn_off_made_inside(fake_module):
    with host_path.set_aside():
        with host_path.set_aside():
            assert host_path.current() == "python"
        assert host_path.current() == "python"  # the outer block still open
    assert host_path.current() == "cpp"
    with host_path.set_aside():
        host_path.turn_off()
    assert host_path.current() == "python" and host_path.MODULE is None


@cpu_calls
def test_launch_configs_of_served_calls_are_their_recording_calls(fake_module):
    """take_launch_configs reports the configurations of the latest forward and backward
    entries the module served, as their recording calls launched them."""
    recorded = _recorded_call(8, 256, grad=True)
    tags = {}
    for direction in ("fwd", "bwd"):
        key, (launches, _configs, extra) = recorded[direction]
        for replay in launches:
            replay.compiled = _compiled(replay.kernel)
        configs = {f"{direction}_kernel": {"num_warps": 4 if direction == "fwd" else 8}}
        host_path.register(key, list(launches), configs, extra)
        tags[direction] = fake_module.added[-1][3]
    assert tags["fwd"] != tags["bwd"]
    launch.take_launch_configs()
    assert launch.take_launch_configs() == {}  # nothing served
    fake_module.latest = (tags["fwd"], -1)
    assert launch.take_launch_configs() == {"fwd_kernel": {"num_warps": 4}}
    assert launch.take_launch_configs() == {}  # taken
    fake_module.latest = (tags["fwd"], tags["bwd"])
    assert launch.take_launch_configs() == {"fwd_kernel": {"num_warps": 4},
                                            "bwd_kernel": {"num_warps": 8}}  # fmt: skip
    replays.forget()  # the entries forgotten: so are their tags' configurations
    fake_module.latest = (tags["fwd"], tags["bwd"])
    assert launch.take_launch_configs() == {}


@cpu_calls
def test_recording_a_replay_registers_it_and_a_table_change_forgets(fake_module, monkeypatch):
    assert host_path.register in replays.ON_RECORD and host_path.forget in replays.ON_FORGET
    seen = []
    monkeypatch.setattr(replays, "ON_RECORD", [lambda key, *_: seen.append(key[0])])
    _recorded_call(8, 256, grad=True)
    assert sorted(seen) == ["bwd", "fwd"]
    cleared = fake_module.cleared
    dispatch.reload()
    assert fake_module.cleared == cleared + 1


@cpu_calls
def test_a_table_change_during_a_registration_forgets_it_after(monkeypatch):
    """Another thread changes the tables while a recording registers: the change (its
    generation step, the caches' clearing and the forget) waits for the registration to end,
    then forgets it, so no stale entry is left."""
    order, changer, moved = [], [], []
    generation = dispatch.GENERATION[0]

    def registering(key, *_):
        if key[0] != "fwd" or changer:
            return
        changer.append(threading.Thread(target=dispatch.reload))
        changer[0].start()
        time.sleep(0.2)  # the change, unless it waits, runs now
        moved.append(dispatch.GENERATION[0] != generation)
        order.append("registered")

    monkeypatch.setattr(replays, "ON_RECORD", [registering])
    monkeypatch.setattr(replays, "ON_FORGET", [lambda: order.append("forgotten")])
    _recorded_call(8, 256, grad=False)
    changer[0].join(timeout=10)
    assert moved == [False]
    assert order == ["forgotten", "registered", "forgotten"]  # _recorded_call forgets first
    assert replays.recorded() == {}


@cpu_calls
def test_a_recording_never_starts_inside_a_table_change(monkeypatch):
    """A recording's generation is read outside any change: one that starts while a change
    has stepped GENERATION but not yet cleared the caches (which still hold the old tables'
    choices) waits until the change is over, then chooses from the new tables."""
    replays.forget()
    chose, in_change = threading.Event(), threading.Event()
    real_choose = dispatch.choose

    def choose(*args, **kwargs):
        if in_change.is_set():
            chose.set()
        return real_choose(*args, **kwargs)

    monkeypatch.setattr(dispatch, "choose", choose)
    seen_in_change = []

    class ChangingTables(dict):
        def clear(self):  # _forget_lookups: after GENERATION's step, before the caches go
            if not in_change.is_set():
                in_change.set()
                recorder.start()
                seen_in_change.append(chose.wait(0.5))  # the recorder must not get this far
            super().clear()

    monkeypatch.setattr(dispatch, "_TABLES", ChangingTables())

    def record():
        rmsnorm(torch.randn(8, 256, dtype=torch.bfloat16), torch.rand(256), 1e-6)

    recorder = threading.Thread(target=record)
    dispatch.reload()
    recorder.join(10)
    assert seen_in_change == [False] and chose.is_set()  # it chose, after the change


@cpu_calls
def test_a_failing_registration_warns_once_and_never_fails_the_call(fake_module, monkeypatch):
    def broken(fields, templates, partial_rows, tag):
        raise TypeError("a cast the module refused")

    monkeypatch.setattr(fake_module, "add", broken)
    monkeypatch.setattr(host_path, "_REGISTER_WARNED", False)
    recorded = _recorded_call(8, 256, grad=False)
    key, ((replay,), configs, extra) = recorded["fwd"]
    replay.compiled = _compiled(kernels.rmsnorm_fwd_kernel)
    with pytest.warns(UserWarning, match="was not registered"):
        host_path.register(key, [replay], configs, extra)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        host_path.register(key, [replay], configs, extra)  # once only


@cpu_calls
def test_a_call_asks_the_module_first_where_it_may_serve(fake_module, monkeypatch):
    x, w = torch.randn(4, 64), torch.rand(64)
    rmsnorm(x, w, 1e-5)
    rmsnorm(x, w, 1e-5, offset=1.0)
    assert fake_module.asked == [((4, 64), 1e-5, 0.0), ((4, 64), 1e-5, 1.0)]
    rmsnorm(x, w, 1e-5, residual=torch.randn(4, 64))  # Python's path, as is:
    rmsnorm(x, w, 1e-5, out_dtype=torch.float16)
    rmsnorm(x, w, 1)  # an int eps (Python's path checks and converts it)
    with dispatch.override(forward="single_tile"):
        rmsnorm(x, w, 1e-5)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        rmsnorm([1.0], w, 1e-5)

    class Subclass(torch.Tensor):  # its __torch_function__ would be bypassed in C++
        pass

    rmsnorm(x.as_subclass(Subclass), w, 1e-5)
    with monkeypatch.context() as patched:
        patched.setattr(direct, "tritons_path_required", lambda: True)  # a launch hook, say
        rmsnorm(x, w, 1e-5)
    assert len(fake_module.asked) == 2
    rmsnorm(x, torch.nn.Parameter(w), 1e-5)  # a module's weight
    assert len(fake_module.asked) == 3


@cpu_calls
def test_forward_entry_refuses_two_level_rows_and_another_out_dtype(fake_module):
    recorded = _recorded_call(8, 256, grad=True)
    key, ((replay,), _configs, _extra) = recorded["fwd"]
    with pytest.raises(host_path.Unsupported):
        host_path.forward_entry(fake_module, key, [replay], True)
    other = (*key[:5], torch.float32, *key[6:])
    with pytest.raises(host_path.Unsupported):
        host_path.forward_entry(fake_module, other, [replay], None)


def test_the_source_is_package_data():
    pyproject = (host_path.SOURCE.parents[2] / "pyproject.toml").read_text()
    (data,) = [
        line for line in pyproject.splitlines() if line.startswith('"impls.triton_rmsnorm" =')
    ]
    assert f'"{host_path.SOURCE.name}"' in data and host_path.SOURCE.exists()


def test_turning_on_without_a_gpu_or_a_build_warns_and_stays_off(monkeypatch, tmp_path):
    monkeypatch.setenv("RMSNORM_TRITON_HOST_DIR", str(tmp_path))
    monkeypatch.setattr(host_path, "MODULE", None)
    with pytest.warns(UserWarning, match="the C\\+\\+ host path is off"):
        assert host_path.turn_on() is False
    assert host_path.MODULE is None
    reason = host_path.unavailable_reason()
    assert reason is not None
    if not ON_GPU:  # the CPU tests run the kernels through the interpreter
        assert reason.startswith("TRITON_INTERPRET=1")


def test_a_bad_setting_names_the_variable_and_what_it_takes(monkeypatch):
    monkeypatch.setenv(host_path.ENV, "on")
    with pytest.raises(ValueError, match="RMSNORM_TRITON_HOST: expected 'cpp', 'python' or unset"):
        host_path.turn_on_as_set()


def _as_if_built_here(monkeypatch, tmp_path):
    """A host where the module is built for this torch and source, under a Triton the path
    knows, outside the interpreter; loading it gives a stand-in module; any CUDA call fails."""
    monkeypatch.setenv("RMSNORM_TRITON_HOST_DIR", str(tmp_path))
    host_path.built_path().parent.mkdir(parents=True)
    host_path.built_path().write_bytes(b"")
    monkeypatch.setattr(host_path.triton, "__version__", host_path.TRITON_VERSIONS[0] + ".0")
    monkeypatch.setattr(host_path.common, "interpreting", lambda: False)
    module = _Module()
    module.set_backward_fallback = lambda fallback: None
    monkeypatch.setattr(host_path, "load_built", lambda: module)

    def no_cuda():
        raise AssertionError("a CUDA call at import")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(host_path, "MODULE", None)
    monkeypatch.setattr(host_path, "_LOADED", None)
    return module


def test_unset_turns_the_path_on_where_built_without_a_cuda_call(monkeypatch, tmp_path):
    module = _as_if_built_here(monkeypatch, tmp_path)
    monkeypatch.delenv(host_path.ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_path.turn_on_as_set() is True
    assert host_path.MODULE is module and host_path.current() == "cpp"


def test_python_keeps_the_built_path_off(monkeypatch, tmp_path):
    _as_if_built_here(monkeypatch, tmp_path)
    monkeypatch.setenv(host_path.ENV, "python")
    assert host_path.turn_on_as_set() is False
    assert host_path.MODULE is None and host_path.current() == "python"


@pytest.mark.parametrize("missing", ["build", "triton", "interpreter"])
def test_unset_stays_off_silently_where_not_built_or_not_known(monkeypatch, tmp_path, missing):
    _as_if_built_here(monkeypatch, tmp_path)
    monkeypatch.delenv(host_path.ENV, raising=False)
    if missing == "build":
        host_path.built_path().unlink()
    elif missing == "triton":
        monkeypatch.setattr(host_path.triton, "__version__", "3.5.1")
    else:
        monkeypatch.setattr(host_path.common, "interpreting", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_path.turn_on_as_set() is False
    assert host_path.MODULE is None
    assert host_path.unavailable_reason(check_device=False) is not None


@pytest.mark.parametrize("error", [RuntimeError("Could not determine home directory."),
                                   PermissionError(13, "Permission denied")])  # fmt: skip
def test_an_unreadable_build_folder_keeps_the_import_working(monkeypatch, tmp_path, error):
    """No home directory (a container's uid without a passwd entry, HOME unset) or a build
    folder that cannot be read: unset, the path stays off silently; with cpp, a warning."""
    _as_if_built_here(monkeypatch, tmp_path)

    def unreadable():
        raise error

    monkeypatch.setattr(host_path, "build_directory", unreadable)
    monkeypatch.delenv(host_path.ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_path.turn_on_as_set() is False
    monkeypatch.setenv(host_path.ENV, "cpp")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(UserWarning, match="its build folder cannot be read"):
        assert host_path.turn_on_as_set() is False
    assert host_path.MODULE is None


def test_cpp_warns_where_the_path_cannot_be_on(monkeypatch, tmp_path):
    _as_if_built_here(monkeypatch, tmp_path)
    host_path.built_path().unlink()
    monkeypatch.setenv(host_path.ENV, "cpp")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(
        UserWarning, match="RMSNORM_TRITON_HOST=cpp: the C\\+\\+ host path is off \\(not built"
    ):
        assert host_path.turn_on_as_set() is False
    assert host_path.MODULE is None


_CAN_BUILD = shutil.which("c++") is not None and is_ninja_available()


@pytest.fixture(scope="module")
def built_module():
    """The real module, built once (about a minute on two cores; the build directory is kept)."""
    if not _CAN_BUILD:
        pytest.skip("no C++ compiler or ninja: the C++ host path cannot be built here")
    host_path.build()
    return host_path.load_built()


def test_built_module_keeps_entries_and_serves_no_cpu_call(built_module):
    # On a GPU the module may be the one the package turned on at import (one per process), and
    # the process's earlier calls were served by it: count from here.
    served = built_module.served()
    built_module.take_latest()
    codes = {built_module.dtype_code(torch.empty(0, dtype=d))
             for d in (torch.float16, torch.bfloat16, torch.float32)}  # fmt: skip
    assert len(codes) == 3
    built_module.clear()
    template = (0xABC, 4, 128, 0, False, 2, "pe", [0, 0], [0, 0])
    built_module.add([1, 8, 256, 256, 15, 15, 15, 1, 0, 0, 0], [template], 0, 7)
    built_module.add([1, 8, 256, 256, 15, 15, 15, 1, 0, 0, 0], [template], 0, 7)  # replaces
    assert built_module.size() == 1
    x, w = torch.randn(8, 256), torch.rand(256)
    assert built_module.forward(x, w, 1e-6, 0.0) is None  # a CPU x: Python's path serves it
    built_module.clear()
    assert built_module.size() == 0
    with pytest.raises(RuntimeError, match="differ in length"):
        built_module.add([1], [(0xABC, 4, 128, 0, False, 2, "pe", [0], [0, 0])], 0, 7)
    with pytest.raises(RuntimeError, match="at most 14 fields"):
        built_module.add([1, *range(14)], [template], 0, 7)
    with pytest.raises(RuntimeError, match="tensor slot out of range"):
        built_module.add([1], [(0xABC, 4, 128, 0, False, 2, "pe", [4, 0], [0, 0])], 0, 7)
    with pytest.raises(RuntimeError, match="starts with 1"):
        built_module.add([3], [template], 0, 7)
    assert built_module.served() == served
    assert built_module.take_latest() == (-1, -1)  # nothing served


def test_built_module_loads_from_its_file_without_building(built_module, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = host_path.load_built()
    assert again is not None and again.__name__ == built_module.__name__
