// convert_weights / convert_weights_device from tensors: U, K, the dtype and
// each layout's ld read from them.
#include "calls.hpp"

namespace gatedmlp::py {

namespace {

struct WeightSide {
  int64_t rows = 0, k = 0, ld = 0;
};

// Rows (output features), K and row stride of one weight tensor in `l`'s
// storage. A 1-D tensor is a bias: K = 1.
WeightSide weight_side(const TensorView& t, const WeightLayout& l) {
  const bool in_out = l.storage == WeightStorage::in_out;
  WeightSide s;
  if (t.ndim == 1) {
    s.rows = t.size(0);
    s.k = 1;
    if (in_out) {
      if (s.rows > 1 && t.stride(0) != 1)
        raise_invalid("'" + t.name + "' must be contiguous (stride 1), got strides " + t.strides_str());
      s.ld = 0;
    } else {
      s.ld = s.rows > 1 ? t.stride(0) : 0;
    }
    return s;
  }
  if (t.ndim != 2)
    raise_invalid("'" + t.name + "' must be a 2-D weight (or a 1-D bias), got shape " + t.shape_str());
  s.rows = in_out ? t.size(1) : t.size(0);
  s.k = in_out ? t.size(0) : t.size(1);
  s.ld = row_stride(t);
  return s;
}

// Takes ld from the tensor; a layout that names another ld contradicts it.
WeightLayout with_tensor_ld(WeightLayout l, const WeightSide& s, const char* name) {
  if (l.ld != 0 && s.ld != 0 && l.ld != s.ld)
    raise_invalid(std::string(name) + ".ld = " + str(l.ld) + " contradicts the tensor's row stride of " + str(s.ld) +
                  " (leave ld at 0: it is read from the tensor)");
  if (s.ld != 0) l.ld = s.ld;
  return l;
}

}  // namespace

void convert(nb::handle from_w, nb::handle to_w, WeightLayout from, WeightLayout to, nb::handle from_w_up,
             nb::handle to_w_up, uintptr_t stream_handle, bool device_only) {
  const TensorView src = import_tensor(from_w, "from_w", false);
  const TensorView dst = import_tensor(to_w, "to_w", true);
  const std::optional<TensorView> src_up = import_optional(from_w_up, "from_w_up", false);
  const std::optional<TensorView> dst_up = import_optional(to_w_up, "to_w_up", true);

  const DType dtype = dtype_of(src, "weight");
  require_same_dtype(dst, src);
  const WeightSide fs = weight_side(src, from);
  const WeightSide ts = weight_side(dst, to);
  const bool from_sep = from.format == WeightFormat::separate;
  const bool to_sep = to.format == WeightFormat::separate;
  if (!from_sep && fs.rows % 2 != 0)
    raise_invalid("'from_w' holds fused weights (from.format = fused), so needs an even number of rows (2U); " +
                  std::string("got shape ") + src.shape_str());
  const int64_t u = from_sep ? fs.rows : fs.rows / 2;
  const int64_t k = fs.k;
  if (ts.k != k || ts.rows != (to_sep ? u : 2 * u))
    raise_invalid("'to_w' must hold " + str(to_sep ? u : 2 * u) + " rows of K = " + str(k) + " (U = " + str(u) +
                  " from 'from_w' " + src.shape_str() + "), got shape " + dst.shape_str() + " with to.storage = " +
                  to_string(to.storage));
  auto same_as = [&](const std::optional<TensorView>& t, const TensorView& ref, const WeightSide& rs,
                     const WeightLayout& l) {
    if (!t) return;
    require_same_dtype(*t, src);
    const WeightSide s = weight_side(*t, l);
    if (t->ndim != ref.ndim || s.rows != rs.rows || s.k != rs.k)
      raise_invalid("'" + t->name + "' must have the shape of '" + ref.name + "' " + ref.shape_str() + ", got " +
                    t->shape_str());
    if (s.ld != rs.ld)
      raise_invalid("'" + t->name + "' must have the row stride of '" + ref.name + "', got strides " +
                    t->strides_str() + " and " + ref.strides_str());
  };
  same_as(src_up, src, fs, from);
  same_as(dst_up, dst, ts, to);
  from = with_tensor_ld(from, fs, "from");
  to = with_tensor_ld(to, ts, "to");

  std::vector<const TensorView*> all = {&src, &dst};
  if (src_up) all.push_back(&*src_up);
  if (dst_up) all.push_back(&*dst_up);
  bool host = true, device = true;
  for (const TensorView* t : all) {
    host &= t->on_host();
    device &= t->on_device();
  }
  if (device_only && !device) {
    for (const TensorView* t : all)
      if (!t->on_device())
        raise_invalid("convert_weights_device: '" + t->name + "' is " + t->device_name() +
                      " memory; all tensors must be CUDA device memory");
  }
  if (!host && !device) {
    std::string where;
    for (const TensorView* t : all) where += (where.empty() ? "" : ", ") + t->name + " on " + t->device_name();
    raise_invalid("convert_weights: the tensors must all be host memory or all CUDA memory, got " + where);
  }

  Status s;
  if (host && !device_only) {
    nb::gil_scoped_release release;
    s = convert_weights(u, k, dtype, from, src.data, ptr(src_up), to, dst.data,
                        dst_up ? dst_up->data : nullptr);
  } else {
    DeviceGuard guard(src.device_type == kDeviceCUDA ? src.device_id : -1);
    const cudaStream_t stream = as_stream(stream_handle);
    wait_for_producers({&src, &dst, src_up ? &*src_up : nullptr, dst_up ? &*dst_up : nullptr}, stream);
    nb::gil_scoped_release release;
    s = convert_weights_device(u, k, dtype, from, src.data, ptr(src_up), to, dst.data,
                               dst_up ? dst_up->data : nullptr, stream);
  }
  check(s);
}

}  // namespace gatedmlp::py
