/* The Python binding's native half: attn's C API over DLPack arrays. Arrays
 * from any framework arrive through nanobind's ndarray with no copy, in host
 * memory or on the context's device, with their strides in elements (which
 * is what attn_tensor takes). python/attn/__init__.py holds the Python API
 * (keywords, output allocation, default contexts); this file describes the
 * arrays as attn_tensors, fills attn_params and calls the library with the
 * GIL released. A failed call raises attn.Error with the status and
 * attn_errmsg()'s sentence. */
#include <attn.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

/* A failure, raised in Python as attn.Error(status, message). */
struct Failure {
  int status;
  std::string message;
};

[[noreturn]] void fail(int status, std::string message) {
  throw Failure{status, std::move(message)};
}

std::string device_label(int backend, int index) {
  return std::string(attn_backend_name(static_cast<attn_backend>(backend))) + ":" +
         std::to_string(index);
}

nb::dict device_dict(const attn_device_info &d) {
  nb::dict r;
  r["backend"] = attn_backend_name(d.backend);
  r["index"] = d.index;
  r["is_gpu"] = d.is_gpu != 0;
  r["name"] = d.name;
  r["version"] = d.version;
  r["memory_bytes"] = d.memory_bytes;
  r["compute_capability"] = nb::make_tuple(d.compute_major, d.compute_minor);
  r["compute_units"] = d.compute_units;
  return r;
}

/* An attn_context. Python threads may share the object, but the library
 * takes one call per context at a time (ATTN_EBUSY otherwise); the count of
 * calls inside keeps close() from freeing the context under one of them. */
class Context {
 public:
  explicit Context(std::optional<std::string> spec) {
    attn_context *c = nullptr;
    int rc;
    {
      nb::gil_scoped_release nogil;
      rc = attn_context_create(spec ? spec->c_str() : nullptr, &c);
    }
    if (rc != ATTN_OK) {
      std::string msg = c ? attn_errmsg(c) : attn_strerror(rc);
      attn_context_free(c);
      fail(rc, msg);
    }
    ctx_ = c;
  }
  ~Context() {
    attn_context_free(ctx_);
  }
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;

  /* Enters a call: the context stays open until leave(). */
  attn_context *enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ctx_) fail(ATTN_EINVAL, "the context is closed");
    users_++;
    return ctx_;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    users_--;
  }

  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_ > 0) fail(ATTN_EBUSY, "the context cannot be closed while a call is inside it");
    attn_context_free(ctx_);
    ctx_ = nullptr;
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return ctx_ == nullptr;
  }

  /* Raises for a status other than ATTN_OK, with the context's sentence.
   * ATTN_EBUSY leaves the sentence to the call that is running, so it gets
   * one of its own. */
  static void check(attn_context *ctx, int rc) {
    if (rc == ATTN_OK) return;
    if (rc == ATTN_EBUSY)
      fail(rc,
           "the context is in use by a call from another thread; give each thread a "
           "context of its own");
    fail(rc, attn_errmsg(ctx));
  }

  std::optional<uintptr_t> stream;

 private:
  attn_context *ctx_ = nullptr;
  std::mutex mu_;
  int users_ = 0;
};

/* Holds a context for one call (see Context::enter). */
class Use {
 public:
  explicit Use(Context &c) : c_(c), ctx_(c.enter()) {}
  ~Use() {
    c_.leave();
  }
  Use(const Use &) = delete;
  Use &operator=(const Use &) = delete;
  attn_context *get() const {
    return ctx_;
  }
  void check(int rc) const {
    Context::check(ctx_, rc);
  }

 private:
  Context &c_;
  attn_context *ctx_;
};

bool is_numpy_bfloat16(nb::handle obj) {
  if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "numpy.ndarray") != 0) return false;
  nb::object name = obj.attr("dtype").attr("name");
  return nb::isinstance<nb::str>(name) && nb::cast<std::string>(name) == "bfloat16";
}

std::string dtype_label(const nb::dlpack::dtype &dt) {
  static const char *const codes[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  const char *code = dt.code < sizeof codes / sizeof *codes ? codes[dt.code] : "?";
  return std::string(code) + std::to_string(dt.bits);
}

/* One call into the library: its context, and the arrays it was given
 * described as attn_tensors, which live (with the arrays and any device
 * buffer wrapping them) until the call is over. */
class Call {
 public:
  explicit Call(Context &c) : use_(c) {}
  ~Call() {
    for (attn_buffer *b : wraps_)
      attn_buffer_free(b);
  }
  Call(const Call &) = delete;
  Call &operator=(const Call &) = delete;

  attn_context *ctx() const {
    return use_.get();
  }
  void check(int rc) const {
    use_.check(rc);
  }

  /* An array the call reads (output false) or writes; NULL for None. */
  const attn_tensor *tensor(nb::handle obj, const char *name, bool output) {
    if (obj.is_none()) return nullptr;
    nb::object src = nb::borrow(obj);
    bool bf16 = false;
    /* NumPy has no bfloat16 of its own and exports ml_dtypes' neither through
     * DLPack nor the buffer protocol: its bits travel as uint16. */
    if (is_numpy_bfloat16(obj)) {
      src = obj.attr("view")("uint16");
      bf16 = true;
    }
    if (output) {
      nb::ndarray<> a;
      if (!nb::try_cast(src, a, false)) {
        nb::ndarray<nb::ro> r;
        if (nb::try_cast(src, r, false))
          fail(ATTN_EINVAL, std::string(name) + ": the array is read-only, but the call writes it");
        not_an_array(obj, name);
      }
      outputs_.push_back(a);
      return describe(a, const_cast<void *>(static_cast<const void *>(a.data())), name, bf16);
    }
    nb::ndarray<nb::ro> a;
    if (!nb::try_cast(src, a, false)) not_an_array(obj, name);
    inputs_.push_back(a);
    return describe(a, const_cast<void *>(static_cast<const void *>(a.data())), name, bf16);
  }

 private:
  [[noreturn]] static void not_an_array(nb::handle obj, const char *name) {
    std::string type = Py_TYPE(obj.ptr())->tp_name;
    throw nb::type_error((std::string(name) +
                          ": expected an array (NumPy, PyTorch, CuPy, JAX: anything with "
                          "__dlpack__ or the buffer protocol), got " +
                          type)
                             .c_str());
  }

  template <class Array>
  const attn_tensor *describe(const Array &a, void *first, const char *name, bool bf16) {
    attn_tensor t;
    std::memset(&t, 0, sizeof t);
    nb::dlpack::dtype dt = a.dtype();
    using code = nb::dlpack::dtype_code;
    if (dt.lanes != 1) {
      fail(ATTN_EDTYPE, std::string(name) + ": vector dtypes (lanes) are not supported");
    } else if (bf16 && dt.code == static_cast<uint8_t>(code::UInt) && dt.bits == 16) {
      t.dtype = ATTN_BF16;
    } else if (dt.code == static_cast<uint8_t>(code::Float) && dt.bits == 32) {
      t.dtype = ATTN_F32;
    } else if (dt.code == static_cast<uint8_t>(code::Float) && dt.bits == 16) {
      t.dtype = ATTN_F16;
    } else if (dt.code == static_cast<uint8_t>(code::Bfloat) && dt.bits == 16) {
      t.dtype = ATTN_BF16;
    } else if (dt.code == static_cast<uint8_t>(code::Int) && dt.bits == 32) {
      t.dtype = ATTN_I32;
    } else {
      fail(ATTN_EDTYPE, std::string(name) + ": dtype " + dtype_label(dt) +
                            " is not one attn takes (float32, float16 or bfloat16; int32 for "
                            "offsets, lengths and block tables)");
    }
    size_t ndim = a.ndim();
    if (ndim > 4)
      fail(ATTN_ESHAPE, std::string(name) + ": " + std::to_string(ndim) +
                            " dimensions; attn's tensors have at most 4");
    t.ndim = static_cast<int>(ndim);
    int64_t contiguous = 1;
    for (size_t i = ndim; i-- > 0;) {
      t.shape[i] = static_cast<int64_t>(a.shape(i));
      /* DLPack allows no strides for a C-contiguous array. */
      t.stride[i] = a.stride_ptr() ? a.stride(i) : contiguous;
      contiguous *= t.shape[i];
    }
    place(t, a.device_type(), a.device_id(), first, name);
    tensors_.push_back(t);
    return &tensors_.back();
  }

  /* Host memory is given as data (a GPU backend stages it); memory on the
   * context's CUDA device is wrapped in a buffer of the context. */
  void place(attn_tensor &t, int device_type, int device_id, void *first, const char *name) {
    attn_context *ctx = use_.get();
    int backend = attn_context_backend(ctx);
    bool host = device_type == nb::device::cpu::value ||
                device_type == nb::device::cuda_host::value ||
                (device_type == nb::device::cuda_managed::value && backend != ATTN_BACKEND_CUDA);
    if (host) {
      t.data = first;
      return;
    }
    bool cuda =
        device_type == nb::device::cuda::value || device_type == nb::device::cuda_managed::value;
    int device = attn_context_device(ctx);
    if (!cuda || backend != ATTN_BACKEND_CUDA || device_id != device)
      fail(ATTN_EBUFFER, std::string(name) + ": the array is in the memory of " +
                             (cuda ? "cuda:" + std::to_string(device_id)
                                   : "DLPack device type " + std::to_string(device_type)) +
                             ", but the context is on " + device_label(backend, device) +
                             "; give arrays in host memory or on the context's device");
    /* The buffer spans every element; negative strides reach below the first
     * (the library then says they are not allowed, naming the tensor). */
    size_t esize = attn_dtype_size(t.dtype);
    int64_t low = 0, high = 0;
    for (int i = 0; i < t.ndim; i++) {
      if (t.shape[i] == 0)
        fail(ATTN_ESIZE, std::string(name) + ": dimension " + std::to_string(i) + " is 0");
      int64_t reach = (t.shape[i] - 1) * t.stride[i];
      (reach < 0 ? low : high) += reach;
    }
    char *base = static_cast<char *>(first) + low * static_cast<int64_t>(esize);
    size_t bytes = static_cast<size_t>(high - low + 1) * esize;
    attn_buffer *b = nullptr;
    use_.check(attn_buffer_wrap(ctx, base, bytes, &b));
    wraps_.push_back(b);
    t.buffer = b;
    t.offset = static_cast<size_t>(-low) * esize;
  }

  Use use_;
  std::deque<attn_tensor> tensors_; /* a deque: pointers into it stay valid */
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
  std::vector<attn_buffer *> wraps_;
};

/* The keywords python/attn/__init__.py passes down, already normalised. */
struct Options {
  attn_params p;
  nb::handle alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, k_new, v_new, block_table, bias,
      dbias, sinks, dsinks;
};

Options read_options(const nb::kwargs &kw) {
  Options o;
  attn_params_init(&o.p);
  nb::handle none = nb::none();
  o.alibi_slopes = o.cu_seqlens_q = o.cu_seqlens_k = o.seqused_k = o.k_new = o.v_new = none;
  o.block_table = o.bias = o.dbias = o.sinks = o.dsinks = none;
  struct Array {
    const char *name;
    nb::handle *slot;
  } arrays[] = {{"alibi_slopes", &o.alibi_slopes},
                {"cu_seqlens_q", &o.cu_seqlens_q},
                {"cu_seqlens_k", &o.cu_seqlens_k},
                {"seqused_k", &o.seqused_k},
                {"k_new", &o.k_new},
                {"v_new", &o.v_new},
                {"block_table", &o.block_table},
                {"bias", &o.bias},
                {"dbias", &o.dbias},
                {"sinks", &o.sinks},
                {"dsinks", &o.dsinks}};
  struct Flag {
    const char *name;
    unsigned bit;
  } flags[] = {{"causal", ATTN_CAUSAL},
               {"deterministic", ATTN_DETERMINISTIC},
               {"allow_tf32", ATTN_ALLOW_TF32},
               {"asynchronous", ATTN_ASYNC}};
  for (auto [key, value] : kw) {
    std::string k = nb::cast<std::string>(key);
    bool known = false;
    for (const Array &a : arrays)
      if (k == a.name) {
        *a.slot = value;
        known = true;
      }
    for (const Flag &f : flags)
      if (k == f.name) {
        if (nb::cast<bool>(value)) o.p.flags |= f.bit;
        known = true;
      }
    if (known) continue;
    if (k == "scale")
      o.p.scale = nb::cast<double>(value);
    else if (k == "softcap")
      o.p.softcap = nb::cast<double>(value);
    else if (k == "window_left")
      o.p.window_left = nb::cast<int64_t>(value);
    else if (k == "window_right")
      o.p.window_right = nb::cast<int64_t>(value);
    else if (k == "num_splits")
      o.p.num_splits = nb::cast<int>(value);
    else
      throw nb::type_error(("unexpected keyword argument '" + k + "'").c_str());
  }
  return o;
}

/* The tensors of the options, described for this call. */
void fill_params(Call &call, Options &o) {
  attn_params &p = o.p;
  p.alibi_slopes_tensor = call.tensor(o.alibi_slopes, "alibi_slopes", false);
  p.cu_seqlens_q_tensor = call.tensor(o.cu_seqlens_q, "cu_seqlens_q", false);
  p.cu_seqlens_k_tensor = call.tensor(o.cu_seqlens_k, "cu_seqlens_k", false);
  p.seqused_k = call.tensor(o.seqused_k, "seqused_k", false);
  p.k_new = call.tensor(o.k_new, "k_new", false);
  p.v_new = call.tensor(o.v_new, "v_new", false);
  p.block_table = call.tensor(o.block_table, "block_table", false);
  p.bias = call.tensor(o.bias, "bias", false);
  p.dbias = call.tensor(o.dbias, "dbias", true);
  p.sinks = call.tensor(o.sinks, "sinks", false);
  p.dsinks = call.tensor(o.dsinks, "dsinks", true);
  /* A varlen batch has as many sequences as cu_seqlens has gaps; the
   * library checks the other tensors against that count. */
  if (p.cu_seqlens_q_tensor && p.cu_seqlens_q_tensor->ndim == 1)
    p.batch = p.cu_seqlens_q_tensor->shape[0] - 1;
  else if (p.block_table && p.block_table->ndim == 2)
    p.batch = p.block_table->shape[0];
  else if (p.seqused_k && p.seqused_k->ndim == 1)
    p.batch = p.seqused_k->shape[0];
}

void forward(Context &c, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
             const nb::kwargs &kw) {
  Options opt = read_options(kw);
  Call call(c);
  /* Appended rows are written into the cache: k and v are outputs then. */
  bool append = !opt.k_new.is_none() || !opt.v_new.is_none();
  const attn_tensor *tq = call.tensor(q, "q", false);
  const attn_tensor *tk = call.tensor(k, "k", append);
  const attn_tensor *tv = call.tensor(v, "v", append);
  const attn_tensor *to = call.tensor(o, "o", true);
  const attn_tensor *tl = call.tensor(lse, "lse", true);
  fill_params(call, opt);
  int rc;
  {
    nb::gil_scoped_release nogil;
    rc = attn_forward(call.ctx(), &opt.p, tq, tk, tv, to, tl);
  }
  call.check(rc);
}

void backward(Context &c, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
              nb::handle dout, nb::handle dq, nb::handle dk, nb::handle dv, const nb::kwargs &kw) {
  Options opt = read_options(kw);
  Call call(c);
  const attn_tensor *tq = call.tensor(q, "q", false);
  const attn_tensor *tk = call.tensor(k, "k", false);
  const attn_tensor *tv = call.tensor(v, "v", false);
  const attn_tensor *to = call.tensor(o, "o", false);
  const attn_tensor *tl = call.tensor(lse, "lse", false);
  const attn_tensor *tdo = call.tensor(dout, "do", false);
  const attn_tensor *tdq = call.tensor(dq, "dq", true);
  const attn_tensor *tdk = call.tensor(dk, "dk", true);
  const attn_tensor *tdv = call.tensor(dv, "dv", true);
  fill_params(call, opt);
  int rc;
  {
    nb::gil_scoped_release nogil;
    rc = attn_backward(call.ctx(), &opt.p, tq, tk, tv, to, tl, tdo, tdq, tdk, tdv);
  }
  call.check(rc);
}

/* (status, message): ATTN_OK and "" when the backend runs the problem. */
nb::tuple supports(Context &c, nb::handle q, nb::handle k, nb::handle v, bool backward,
                   const nb::kwargs &kw) {
  Options opt = read_options(kw);
  Call call(c);
  const attn_tensor *tq = call.tensor(q, "q", false);
  const attn_tensor *tk = call.tensor(k, "k", false);
  const attn_tensor *tv = call.tensor(v, "v", false);
  fill_params(call, opt);
  int rc;
  {
    nb::gil_scoped_release nogil;
    rc = attn_supports(call.ctx(), &opt.p, tq, tk, tv, backward ? 1 : 0);
  }
  if (rc == ATTN_EBUSY) call.check(rc);
  return nb::make_tuple(rc, rc == ATTN_OK ? "" : attn_errmsg(call.ctx()));
}

void merge(Context &c, const std::vector<nb::handle> &o_parts,
           const std::vector<nb::handle> &lse_parts, nb::handle o, nb::handle lse) {
  if (o_parts.size() != lse_parts.size())
    fail(ATTN_ESHAPE, "lse_parts: " + std::to_string(lse_parts.size()) +
                          " parts, but o_parts has " + std::to_string(o_parts.size()));
  Call call(c);
  std::vector<attn_tensor> to_parts, tl_parts;
  for (size_t i = 0; i < o_parts.size(); i++) {
    std::string on = "o_parts[" + std::to_string(i) + "]";
    std::string ln = "lse_parts[" + std::to_string(i) + "]";
    to_parts.push_back(*call.tensor(o_parts[i], on.c_str(), false));
    tl_parts.push_back(*call.tensor(lse_parts[i], ln.c_str(), false));
  }
  const attn_tensor *to = call.tensor(o, "o", true);
  const attn_tensor *tl = call.tensor(lse, "lse", true);
  int n = static_cast<int>(o_parts.size());
  int rc;
  {
    nb::gil_scoped_release nogil;
    rc = attn_merge(call.ctx(), n, to_parts.data(), tl_parts.data(), to, tl);
  }
  call.check(rc);
}

nb::dict info() {
  nb::dict backends;
  const attn_backend all[] = {ATTN_BACKEND_CPU, ATTN_BACKEND_OPENCL, ATTN_BACKEND_CUDA};
  for (attn_backend b : all) {
    nb::list devices;
    int n = attn_device_count(b);
    for (int i = 0; i < n; i++) {
      attn_device_info d;
      if (attn_device_info_get(b, i, &d) == ATTN_OK) devices.append(device_dict(d));
    }
    nb::dict e;
    e["compiled"] = attn_backend_compiled(b) != 0;
    e["devices"] = devices;
    e["unavailable"] = attn_backend_unavailable_reason(b);
    backends[attn_backend_name(b)] = e;
  }
  nb::dict r;
  r["version"] = ATTN_VERSION_STRING;
  r["max_head_dim"] = ATTN_MAX_HEAD_DIM;
  r["backends"] = backends;
  return r;
}

nb::list statuses() {
  nb::list r;
#define ATTN_PY_STATUS(name, value, msg) r.append(nb::make_tuple(value, #name, msg));
  ATTN_STATUS_MAP(ATTN_PY_STATUS)
#undef ATTN_PY_STATUS
  return r;
}

attn_dtype dtype_from_name(const std::string &name) {
  const attn_dtype all[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  for (attn_dtype d : all)
    if (name == attn_dtype_name(d)) return d;
  fail(ATTN_EDTYPE, "dtype: '" + name + "' is not one of f32, f16, bf16");
}

}  // namespace

NB_MODULE(_attn, m) {
  m.doc() = "attn's C API over DLPack arrays (use the attn package, not this module)";
  /* Contexts that live to the interpreter's exit (the per-thread defaults,
   * one an autograd graph or a traceback still holds) are not leaks; the
   * operating system takes their memory back. */
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr &p, void *) {
    try {
      std::rethrow_exception(p);
    } catch (const Failure &f) {
      nb::object error = nb::module_::import_("attn._error").attr("Error");
      nb::object e = error(f.status, f.message);
      PyErr_SetObject(error.ptr(), e.ptr());
    }
  });

  nb::class_<Context>(m, "Context")
      .def(nb::init<std::optional<std::string>>(), "spec"_a = nb::none())
      .def_prop_ro("backend",
                   [](Context &c) {
                     Use u(c);
                     return std::string(attn_backend_name(attn_context_backend(u.get())));
                   })
      .def_prop_ro("device",
                   [](Context &c) {
                     Use u(c);
                     return attn_context_device(u.get());
                   })
      .def_prop_ro("device_info",
                   [](Context &c) {
                     Use u(c);
                     attn_device_info d;
                     u.check(attn_context_device_info(u.get(), &d));
                     return device_dict(d);
                   })
      .def_prop_ro("closed", &Context::closed)
      .def_prop_rw(
          "stream", [](Context &c) { return c.stream; },
          [](Context &c, std::optional<uintptr_t> s) {
            Use u(c);
            u.check(attn_context_set_stream(u.get(), s ? reinterpret_cast<void *>(*s) : nullptr));
            c.stream = s;
          },
          nb::arg("stream").none())
      .def("synchronize",
           [](Context &c) {
             Use u(c);
             int rc;
             {
               nb::gil_scoped_release nogil;
               rc = attn_context_synchronize(u.get());
             }
             u.check(rc);
           })
      .def("selftest",
           [](Context &c) {
             Use u(c);
             int rc;
             {
               nb::gil_scoped_release nogil;
               rc = attn_selftest(u.get());
             }
             u.check(rc);
           })
      .def(
          "tune",
          [](Context &c, const std::string &dtype, int64_t head_dim, int64_t seqlen) {
            attn_dtype d = dtype_from_name(dtype);
            Use u(c);
            int rc;
            {
              nb::gil_scoped_release nogil;
              rc = attn_tune(u.get(), d, head_dim, seqlen);
            }
            u.check(rc);
          },
          "dtype"_a, "head_dim"_a, "seqlen"_a = 0)
      .def("close", &Context::close);

  m.def("forward", &forward, "context"_a, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "kw"_a);
  m.def("backward", &backward, "context"_a, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "do"_a, "dq"_a,
        "dk"_a, "dv"_a, "kw"_a);
  m.def("supports", &supports, "context"_a, "q"_a, "k"_a, "v"_a, "backward"_a, "kw"_a);
  m.def("merge", &merge, "context"_a, "o_parts"_a, "lse_parts"_a, "o"_a, "lse"_a.none());
  m.def("info", &info);
  m.def("statuses", &statuses);
}
