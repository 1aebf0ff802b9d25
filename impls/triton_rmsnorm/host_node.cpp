// The C++ host path (host_path.py builds, loads and feeds it; docs/design.md, Host path).
//
// A call that Python's replays (replays.py) would repeat is served here instead: the same
// compiled kernels (their CUfunction), grids, options and parameters, registered by Python when
// it records a replay, launched with cuLaunchKernelEx from a C++ function and, for calls that
// need a gradient, a C++ autograd node. Python then costs one call into this module.
//
// Everything a launch depends on is in the key (as in the Python replay key): rows, width, row
// strides, dtypes, each pointer's 16-byte alignment, the device; only the tensors' addresses,
// eps and offset change between calls of one key. A call this module does not serve (no entry,
// a layout it does not describe, a value Python must reject) returns None, and Python's path
// takes it: that path validates, raises the clear errors, records and registers.
#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda.h>  // Triton's bundled header: types only; the driver is opened at run time
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// Error messages are built from strings (std::to_string for numbers): on the H200 machine's
// toolchain, formatting a number through an ostream in this module (TORCH_CHECK's variadic
// message) crashed the process instead of raising.

// ---- the driver -------------------------------------------------------------------------------

void* driver_symbol(const char* name) {
  static void* handle = dlopen("libcuda.so.1", RTLD_LAZY);
  TORCH_CHECK(handle != nullptr, "rmsnorm host path: cannot open libcuda.so.1");
  void* symbol = dlsym(handle, name);
  TORCH_CHECK(symbol != nullptr, std::string("rmsnorm host path: libcuda.so.1 has no ") + name);
  return symbol;
}

using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using DeviceGet = CUresult (*)(CUdevice*, int);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);
using CtxSetCurrent = CUresult (*)(CUcontext);

// As Triton's launcher does before a launch: a driver context current on this thread (the
// autograd engine's device thread may have none), the device's primary one.
void ensure_context(int ordinal) {
  static auto device_get = reinterpret_cast<DeviceGet>(driver_symbol("cuDeviceGet"));
  static auto get = reinterpret_cast<CtxGetCurrent>(driver_symbol("cuCtxGetCurrent"));
  static auto retain =
      reinterpret_cast<PrimaryCtxRetain>(driver_symbol("cuDevicePrimaryCtxRetain"));
  static auto set = reinterpret_cast<CtxSetCurrent>(driver_symbol("cuCtxSetCurrent"));
  CUcontext context = nullptr;
  TORCH_CHECK(get(&context) == CUDA_SUCCESS, "rmsnorm host path: cuCtxGetCurrent failed");
  if (context == nullptr) {
    CUdevice device;
    TORCH_CHECK(device_get(&device, ordinal) == CUDA_SUCCESS, "rmsnorm host path: cuDeviceGet failed");
    TORCH_CHECK(retain(&context, device) == CUDA_SUCCESS,
                "rmsnorm host path: cuDevicePrimaryCtxRetain failed");
    TORCH_CHECK(set(context) == CUDA_SUCCESS, "rmsnorm host path: cuCtxSetCurrent failed");
  }
}

// ---- launches ---------------------------------------------------------------------------------

// One kernel parameter, in the order Triton's launcher passes them: a tensor's address
// ('p', slot: its index among the call's tensors), the call's eps or offset as fp32 ('e', 'o'),
// or a value fixed at registration ('i' int32, 'l' int64, 'f' fp32 bits, 'b' int8, 'u' uint8).
struct Param {
  char kind;
  int64_t slot;
  int64_t value;
};

struct Launch {
  CUfunction function = nullptr;
  unsigned grid = 0, threads = 0, shared = 0;
  bool pdl = false;
  int64_t scratch = 0;  // null pointers Triton's launcher appends (global, profile scratch)
  std::vector<Param> params;
};

void run(const Launch& launch, const std::vector<const at::Tensor*>& tensors, double eps,
         double offset, int device) {
  ensure_context(device);
  const size_t n = launch.params.size();
  std::vector<uint64_t> storage(n + launch.scratch, 0);
  std::vector<void*> pointers(n + launch.scratch);
  for (size_t k = 0; k < n; ++k) {
    const Param& p = launch.params[k];
    switch (p.kind) {
      case 'p': storage[k] = reinterpret_cast<uint64_t>(tensors[p.slot]->data_ptr()); break;
      case 'e': { float v = static_cast<float>(eps); std::memcpy(&storage[k], &v, 4); break; }
      case 'o': { float v = static_cast<float>(offset); std::memcpy(&storage[k], &v, 4); break; }
      case 'i': { int32_t v = static_cast<int32_t>(p.value); std::memcpy(&storage[k], &v, 4); break; }
      case 'f': { uint32_t v = static_cast<uint32_t>(p.value); std::memcpy(&storage[k], &v, 4); break; }
      case 'b': { int8_t v = static_cast<int8_t>(p.value); std::memcpy(&storage[k], &v, 1); break; }
      case 'u': { uint8_t v = static_cast<uint8_t>(p.value); std::memcpy(&storage[k], &v, 1); break; }
      default: storage[k] = static_cast<uint64_t>(p.value);  // 'l'
    }
    pointers[k] = &storage[k];
  }
  for (size_t k = n; k < n + launch.scratch; ++k) pointers[k] = &storage[k];
  CUlaunchAttribute attributes[1];
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = launch.grid;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = launch.threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = launch.shared;
  const c10::Device cuda(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  config.hStream = static_cast<CUstream>(
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(cuda).native_handle());
  config.attrs = attributes;
  config.numAttrs = 0;
  if (launch.pdl) {
    attributes[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[0].value.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 1;
  }
  static auto launch_ex = reinterpret_cast<LaunchEx>(driver_symbol("cuLaunchKernelEx"));
  const CUresult result = launch_ex(&config, launch.function, pointers.data(), nullptr);
  TORCH_CHECK(result == CUDA_SUCCESS, "rmsnorm host path: cuLaunchKernelEx failed (" +
                                           std::to_string(static_cast<int>(result)) + ")");
}

Launch launch_of(const py::tuple& t, int64_t tensors) {
  // (function, grid, threads, shared, pdl, scratch, kinds, slots, values)
  Launch launch;
  launch.function = reinterpret_cast<CUfunction>(t[0].cast<uint64_t>());
  launch.grid = t[1].cast<unsigned>();
  launch.threads = t[2].cast<unsigned>();
  launch.shared = t[3].cast<unsigned>();
  launch.pdl = t[4].cast<bool>();
  launch.scratch = t[5].cast<int64_t>();
  const auto kinds = t[6].cast<std::string>();
  const auto slots = t[7].cast<std::vector<int64_t>>();
  const auto values = t[8].cast<std::vector<int64_t>>();
  TORCH_CHECK(kinds.size() == slots.size() && kinds.size() == values.size(),
              "rmsnorm host path: kinds, slots and values differ in length");
  for (size_t k = 0; k < kinds.size(); ++k) {
    TORCH_CHECK(kinds[k] != 'p' || (slots[k] >= 0 && slots[k] < tensors),
                "rmsnorm host path: a tensor slot out of range (" + std::to_string(slots[k]) + ")");
    TORCH_CHECK(std::string("peoifblu").find(kinds[k]) != std::string::npos,
                "rmsnorm host path: unknown parameter kind " + std::string(1, kinds[k]));
    launch.params.push_back({kinds[k], slots[k], values[k]});
  }
  return launch;
}

// ---- the entries ------------------------------------------------------------------------------

// forward: (1, M, N, x's row stride, x, w and y dtypes, keeps rstd, x and w alignments, device)
// backward: (2, M, N, x's and dy's row strides, x, w and dy dtypes, x, w, dy and rstd
// alignments, device)
using Key = std::array<int64_t, 14>;

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : key) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  std::vector<Launch> launches;
  int64_t partial_rows = 0;  // the backward's [partial_rows, N] fp32 dw partials (0: none)
  int64_t tag = -1;  // Python's name for the entry (its launch configurations: host_path.py)
};

std::atomic<int64_t> served_forwards{0}, served_backwards{0};  // calls launched from here
// the tags of the latest forward and backward entries served (-1: none since take_latest)
std::atomic<int64_t> latest_forward{-1}, latest_backward{-1};
std::shared_mutex entries_mutex;  // the autograd engine's threads read while Python registers
std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> entries;
// Python's backward, for a backward no entry serves: a strong reference never dropped (a
// py::object here would be released after the interpreter's teardown)
PyObject* backward_fallback = nullptr;

Key key_of(const std::vector<int64_t>& fields) {
  TORCH_CHECK(fields.size() <= 14, "rmsnorm host path: a key has at most 14 fields");
  Key key{};
  std::copy(fields.begin(), fields.end(), key.begin());
  return key;
}

std::shared_ptr<const Entry> find(const Key& key) {
  std::shared_lock<std::shared_mutex> lock(entries_mutex);
  auto it = entries.find(key);
  return it == entries.end() ? nullptr : it->second;
}

void add(const std::vector<int64_t>& fields, const py::list& launches, int64_t partial_rows,
         int64_t tag) {
  TORCH_CHECK(!fields.empty() && (fields[0] == 1 || fields[0] == 2),
              "rmsnorm host path: a key starts with 1 (forward) or 2 (backward)");
  const int64_t tensors = fields[0] == 1 ? 4 : 7;  // the call's tensors (Node's comment)
  auto entry = std::make_shared<Entry>();
  for (const auto& item : launches) {
    entry->launches.push_back(launch_of(item.cast<py::tuple>(), tensors));
  }
  TORCH_CHECK(!entry->launches.empty(), "rmsnorm host path: an entry without launches");
  entry->partial_rows = partial_rows;
  entry->tag = tag;
  std::unique_lock<std::shared_mutex> lock(entries_mutex);
  entries[key_of(fields)] = std::move(entry);
}

void clear() {
  std::unique_lock<std::shared_mutex> lock(entries_mutex);
  entries.clear();
}

size_t size() {
  std::shared_lock<std::shared_mutex> lock(entries_mutex);
  return entries.size();
}

int64_t alignment(const at::Tensor& t) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
}

int64_t dtype_code(const at::Tensor& t) { return static_cast<int64_t>(t.scalar_type()); }

bool on_current_device(const at::Tensor& x) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() ==
         x.get_device();
}

// x's rows as the kernels address them: [M, N] with a row stride. Only the layouts whose rows
// Python's path reads in place with one stride and no copy: 2-D with a unit last stride, or
// contiguous. M == 0: none (Python's path returns empty outputs).
bool rows_of(const at::Tensor& x, int64_t& m, int64_t& n, int64_t& stride) {
  if (x.dim() == 0) return false;
  n = x.size(-1);
  if (n == 0) return false;
  if (x.dim() == 2) {
    if (x.stride(1) != 1) return false;
    m = x.size(0);
    stride = x.stride(0);
  } else {
    if (!x.is_contiguous()) return false;
    m = x.numel() / n;
    stride = n;
  }
  return m > 0;
}

Key forward_key(const at::Tensor& x, const at::Tensor& w, int64_t m, int64_t n, int64_t stride,
                bool keep_rstd) {
  return key_of({1, m, n, stride, dtype_code(x), dtype_code(w), dtype_code(x), keep_rstd,
                 alignment(x), alignment(w), x.get_device()});
}

// ---- the autograd node ------------------------------------------------------------------------

// tensors of a forward launch: (x, w, y, rstd); of a backward launch: (dy, x, w, rstd, dx,
// partials, dw). Python builds the parameter templates with these slots (host_path.py).
class Node : public torch::autograd::Function<Node> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, double eps, double offset,
                            std::shared_ptr<const Entry> entry, int64_t m) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty({m}, x.options().dtype(at::kFloat));
    run(entry->launches[0], {&x, &w, &y, &rstd}, eps, offset, x.get_device());
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["offset"] = offset;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& rstd = saved[2];
    const double offset = ctx->saved_data["offset"].toDouble();
    const int64_t n = x.size(-1);
    const at::Tensor x2d = x.dim() == 2 ? x : x.view({-1, n});
    at::Tensor dy2d = grads[0].dim() == 2 ? grads[0] : grads[0].reshape({-1, n});
    if (dy2d.stride(1) != 1) dy2d = dy2d.contiguous();  // as Python's _rows
    const int64_t m = x2d.size(0);
    std::shared_ptr<const Entry> entry;
    if (!torch::autograd::GradMode::is_enabled() && on_current_device(x) &&
        dy2d.has_storage() && x2d.has_storage() && w.has_storage() && rstd.has_storage()) {
      entry = find(key_of({2, m, n, x2d.stride(0), dy2d.stride(0), dtype_code(x), dtype_code(w),
                           dtype_code(dy2d), alignment(x2d), alignment(w), alignment(dy2d),
                           alignment(rstd), x.get_device()}));
    }
    if (entry == nullptr) {  // Python's backward (it records, and registers what it can)
      py::gil_scoped_acquire gil;
      const bool rows_need_grad = ctx->needs_input_grad(0);
      TORCH_CHECK(backward_fallback != nullptr, "rmsnorm host path: no backward fallback set");
      py::tuple out = py::reinterpret_borrow<py::object>(backward_fallback)(
          dy2d, x2d, w, rstd, offset, rows_need_grad);
      at::Tensor dx2d = out[0].cast<at::Tensor>();
      at::Tensor dw = out[1].cast<at::Tensor>();
      return {dx2d.view(x.sizes()), dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    served_backwards.fetch_add(1, std::memory_order_relaxed);
    latest_backward.store(entry->tag, std::memory_order_relaxed);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor dw = at::empty_like(w);
    const int device = x.get_device();
    if (entry->partial_rows == 0) {  // one launch (its column programs write dw)
      run(entry->launches[0], {&dy2d, &x2d, &w, &rstd, &dx, &dw, &dw}, 0.0, offset, device);
    } else {
      at::Tensor partials = at::empty({entry->partial_rows, n}, x.options().dtype(at::kFloat));
      const std::vector<const at::Tensor*> tensors{&dy2d, &x2d, &w, &rstd, &dx, &partials, &dw};
      for (const Launch& launch : entry->launches) run(launch, tensors, 0.0, offset, device);
    }
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- the calls --------------------------------------------------------------------------------

// y for rmsnorm(x, w, eps, offset=offset) where an entry serves the call, else None. Needs a
// gradient (grad mode on and x or w requiring one): through the autograd node.
py::object forward(const at::Tensor& x, const at::Tensor& w, double eps, double offset) {
  int64_t m, n, stride;
  // a tensor without storage (a functorch wrapper outliving its transform) has no address
  if (!x.is_cuda() || !x.has_storage() || !w.has_storage()) return py::none();
  if (!rows_of(x, m, n, stride)) return py::none();
  if (w.dim() != 1 || w.size(0) != n || w.stride(0) != 1 || w.device() != x.device()) {
    return py::none();
  }
  if (!std::isfinite(eps) || eps < 0 || !std::isfinite(offset)) return py::none();
  if (!on_current_device(x)) return py::none();
  const bool grad =
      torch::autograd::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad());
  auto entry = find(forward_key(x, w, m, n, stride, grad));
  if (entry == nullptr) return py::none();
  served_forwards.fetch_add(1, std::memory_order_relaxed);
  latest_forward.store(entry->tag, std::memory_order_relaxed);
  if (grad) return py::cast(Node::apply(x, w, eps, offset, entry, m));
  at::Tensor y = at::empty(x.sizes(), x.options());
  run(entry->launches[0], {&x, &w, &y, &y}, eps, offset, x.get_device());
  return py::cast(y);
}

py::tuple served() { return py::make_tuple(served_forwards.load(), served_backwards.load()); }

py::tuple take_latest() {
  return py::make_tuple(latest_forward.exchange(-1), latest_backward.exchange(-1));
}

void set_backward_fallback(const py::object& fallback) {
  PyObject* old = backward_fallback;
  backward_fallback = fallback.inc_ref().ptr();
  Py_XDECREF(old);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &forward, "y where an entry serves the call, else None");
  module.def("add", &add, "register an entry: key fields, launches, partial rows, tag");
  module.def("clear", &clear, "forget every entry");
  module.def("size", &size, "the number of entries");
  module.def("dtype_code", &dtype_code, "the key's code of a tensor's dtype");
  module.def("served", &served, "(forwards, backwards) launched from here so far");
  module.def("take_latest", &take_latest,
             "the tags of the latest forward and backward entries served since the last take "
             "(-1: none), then forgets them");
  module.def("set_backward_fallback", &set_backward_fallback,
             "Python's backward, for a backward no entry serves");
}
