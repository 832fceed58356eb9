// quantize_host / dequantize_host from tensors: host arrays of any framework,
// the outputs allocated by the Python wrapper (gatedmlp.quantize).
#include "calls.hpp"
#include "gatedmlp/quant.hpp"

namespace gatedmlp::py {

namespace {

// A C-contiguous host array: its rows (every axis but the last, flattened)
// and its last axis.
struct Rows {
  int64_t rows = 1, cols = 0;
};

Rows host_rows(const TensorView& t) {
  if (!t.on_host())
    raise_invalid("'" + t.name + "' is " + t.device_name() + " memory; the quantizer runs on the host " +
                  "(gatedmlp.quantize copies device tensors for it)");
  if (t.ndim < 1) raise_invalid("'" + t.name + "' must have at least one axis, got a scalar");
  int64_t expect = 1, elements = 1;
  for (int i = 0; i < t.ndim; ++i) elements *= t.size(i);
  for (int i = t.ndim - 1; i >= 0 && elements > 0; --i) {
    if (t.size(i) > 1 && t.stride(i) != expect)
      raise_invalid("'" + t.name + "' must be C-contiguous, got shape " + t.shape_str() + " and strides " +
                    t.strides_str());
    expect *= t.size(i);
  }
  Rows r;
  for (int i = 0; i < t.ndim - 1; ++i) r.rows *= t.size(i);
  r.cols = t.size(-1);
  return r;
}

void require_uint32(const TensorView& t) {
  if (t.code != 1 || t.bits != 32 || t.lanes != 1)  // DLPack kDLUInt
    raise_invalid("'" + t.name + "' must be uint32 (packed words), got " + t.dtype_name());
}

void require_uint8(const TensorView& t) {
  if (t.code != 1 || t.bits != 8 || t.lanes != 1)  // DLPack kDLUInt
    raise_invalid("'" + t.name + "' must be uint8 (e8m0 scale bytes), got " + t.dtype_name());
}

void require_no_biases(nb::handle biases, const QuantFormat& f) {
  if (!biases.is_none())
    raise_invalid(f.tiled ? "'biases' is given, but tiled weights keep their biases in 'scales' ((scale, bias) pairs)"
                          : "'biases' is given, but mxfp4 has no biases");
}

void require_shape(const TensorView& t, const TensorView& w, const Rows& wr, int64_t cols, const char* what) {
  const Rows r = host_rows(t);
  if (t.ndim != w.ndim || r.rows != wr.rows || r.cols != cols) {
    std::string want = "(";
    for (int i = 0; i < w.ndim - 1; ++i) want += str(w.size(i)) + ", ";
    want += str(cols) + ")";
    raise_invalid("'" + t.name + "' must have shape " + want + " (" + what + "), got " + t.shape_str());
  }
}

}  // namespace

void quantize(nb::handle w, nb::handle wq, nb::handle scales, nb::handle biases, const QuantFormat& f) {
  const bool mx = f.mode == QuantMode::mxfp4;
  const TensorView tw = import_tensor(w, "w", false);
  const TensorView tq = import_tensor(wq, "wq", true);
  const TensorView ts = import_tensor(scales, "scales", true);
  const bool no_biases = mx || f.tiled;  // tiled: (scale, bias) pairs in the scales
  if (no_biases) require_no_biases(biases, f);
  const std::optional<TensorView> tb =
      no_biases ? std::nullopt : std::optional(import_tensor(biases, "biases", true));
  const DType dtype = dtype_of(tw, "weight");
  const Rows wr = host_rows(tw);
  check(check_quant_format(f, wr.cols));
  require_uint32(tq);
  if (mx) {
    require_uint8(ts);
  } else {
    require_same_dtype(ts, tw);
    if (tb) require_same_dtype(*tb, tw);
  }
  require_shape(tq, tw, wr, quant_words_per_row(f, wr.cols), "K * bits / 32 words per row");
  require_shape(ts, tw, wr, quant_groups_per_row(f, wr.cols), "K / group_size per row");
  if (tb) require_shape(*tb, tw, wr, quant_groups_per_row(f, wr.cols), "K / group_size per row");
  nb::gil_scoped_release release;
  check(quantize_host(f, dtype, wr.rows, wr.cols, tw.data, static_cast<uint32_t*>(tq.data), ts.data,
                      tb ? tb->data : nullptr));
}

void dequantize(nb::handle wq, nb::handle scales, nb::handle biases, nb::handle w, const QuantFormat& f) {
  const bool mx = f.mode == QuantMode::mxfp4;
  const TensorView tq = import_tensor(wq, "wq", false);
  const TensorView ts = import_tensor(scales, "scales", false);
  const bool no_biases = mx || f.tiled;  // tiled: (scale, bias) pairs in the scales
  if (no_biases) require_no_biases(biases, f);
  const std::optional<TensorView> tb =
      no_biases ? std::nullopt : std::optional(import_tensor(biases, "biases", false));
  const TensorView tw = import_tensor(w, "w", true);
  const DType out_dtype = dtype_of(tw, "weight");
  const Rows wr = host_rows(tw);
  check(check_quant_format(f, wr.cols));
  require_uint32(tq);
  DType dtype = DType::fp32;  // mxfp4: the scales are bytes
  if (mx) {
    require_uint8(ts);
  } else {
    dtype = dtype_of(ts, "scale");
    if (tb) require_same_dtype(*tb, ts);
  }
  require_shape(tq, tw, wr, quant_words_per_row(f, wr.cols), "K * bits / 32 words per row");
  require_shape(ts, tw, wr, quant_groups_per_row(f, wr.cols), "K / group_size per row");
  if (tb) require_shape(*tb, tw, wr, quant_groups_per_row(f, wr.cols), "K / group_size per row");
  nb::gil_scoped_release release;
  check(dequantize_host(f, dtype, out_dtype, wr.rows, wr.cols, static_cast<const uint32_t*>(tq.data), ts.data,
                        ptr(tb), tw.data));
}

void repack(nb::handle src, nb::handle dst, const QuantFormat& from, const QuantFormat& to, int64_t k,
            uintptr_t stream_handle) {
  const TensorView ts = import_tensor(src, "src", false);
  const TensorView td = import_tensor(dst, "dst", true);
  require_uint32(ts);
  require_uint32(td);
  check(check_quant_format(from, k));
  check(check_quant_format(to, k));
  const bool host = ts.on_host() && td.on_host(), device = ts.on_device() && td.on_device();
  if (!host && !device)
    raise_invalid(std::string("repack: 'src' (") + ts.device_name() + ") and 'dst' (" + td.device_name() +
                  ") must both be host memory or both CUDA memory");
  // Dense rows: every axis but the last, and the words per row of each order.
  auto rows_of = [&](const TensorView& t, int64_t words) {
    if (t.ndim < 1 || t.size(-1) != words)
      raise_invalid("'" + t.name + "' must have " + str(words) + " words per row (K = " + str(k) + ", " +
                    to_string(t.name == "src" ? from : to) + "), got shape " + t.shape_str());
    int64_t rows = 1, expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.size(i) > 1 && t.stride(i) != expect)
        raise_invalid("'" + t.name + "' must be C-contiguous, got strides " + t.strides_str());
      expect *= t.size(i);
      if (i < t.ndim - 1) rows *= t.size(i);
    }
    return rows;
  };
  const int64_t rows = rows_of(ts, quant_words_per_row(from, k));
  if (rows_of(td, quant_words_per_row(to, k)) != rows)
    raise_invalid("'dst' " + td.shape_str() + " must hold the rows of 'src' " + ts.shape_str());
  Status s;
  if (host) {
    nb::gil_scoped_release release;
    s = repack_quantized(from, to, rows, k, static_cast<const uint32_t*>(ts.data), static_cast<uint32_t*>(td.data));
  } else {
    DeviceGuard guard(ts.device_id);
    const cudaStream_t stream = as_stream(stream_handle);
    wait_for_producers({&ts, &td}, stream);
    nb::gil_scoped_release release;
    s = repack_quantized_device(from, to, rows, k, static_cast<const uint32_t*>(ts.data),
                                static_cast<uint32_t*>(td.data), stream);
  }
  check(s);
}

}  // namespace gatedmlp::py
