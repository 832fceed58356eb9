// Weight-layout mapping and the host-side converter.
#include <cstring>

#include "core/layout_internal.hpp"

namespace gatedmlp {

using detail::err;

int64_t fused_row(int64_t j, Half half, int64_t u, int64_t group, Half first) {
  return detail::fused_row(j, static_cast<int>(half), group == 0 ? u : group, static_cast<int>(first));
}

void fused_row_inverse(int64_t f, int64_t u, int64_t group, Half first, Half* half, int64_t* j) {
  int h = 0;
  detail::fused_row_inverse(f, group == 0 ? u : group, static_cast<int>(first), &h, j);
  *half = static_cast<Half>(h);
}

namespace detail {

Status check_conv_layout(const char* side, const WeightLayout& l, int64_t u, int64_t k, const void* w,
                         const void* w_up, ConvLayout* out, int64_t* span) {
  const StatusCode inv = StatusCode::invalid_argument;
  const bool sep = l.format == WeightFormat::separate;
  if (!sep && l.format != WeightFormat::fused) return err(inv, side, ".format has invalid value ", int(l.format));
  if (l.storage != WeightStorage::out_in && l.storage != WeightStorage::in_out)
    return err(inv, side, ".storage has invalid value ", int(l.storage));
  if (l.first != Half::gate && l.first != Half::up) return err(inv, side, ".first has invalid value ", int(l.first));
  const int64_t g = l.group == 0 ? u : l.group;
  if (!sep && (l.group < 0 || g > u || u % g != 0))
    return err(inv, side, ".group=", l.group, " must be 0 (stacked) or a divisor of u=", u);
  const int64_t rows = sep ? u : 2 * u;
  const bool in_out = l.storage == WeightStorage::in_out;
  const int64_t min_ld = in_out ? rows : k;
  const int64_t ld = l.ld == 0 ? min_ld : l.ld;
  if (ld < min_ld) return err(inv, side, ".ld must be 0 (dense) or >= ", min_ld, ", got ", l.ld);
  if (w == nullptr) return err(inv, "argument '", side, "_w' is null");
  if (sep && w_up == nullptr) return err(inv, "argument '", side, "_w_up' is null but ", side, ".format is separate");
  if (!sep && w_up != nullptr) return err(inv, "argument '", side, "_w_up' must be null when ", side, ".format is fused");
  *out = ConvLayout{sep ? 1 : 0, in_out ? 1 : 0, static_cast<int>(l.first), g, ld};
  *span = in_out ? (k - 1) * ld + rows : (rows - 1) * ld + k;
  return Status::Ok();
}

Status check_convert(int64_t u, int64_t k, DType dtype, const WeightLayout& from, const void* from_w,
                     const void* from_w_up, const WeightLayout& to, const void* to_w, const void* to_w_up,
                     ConvLayout* cf, ConvLayout* ct) {
  const StatusCode inv = StatusCode::invalid_argument;
  if (u < 1) return err(inv, "u must be >= 1, got ", u);
  if (k < 1) return err(inv, "k must be >= 1, got ", k);
  if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::fp32)
    return err(inv, "dtype has invalid value ", int(dtype));
  int64_t sf = 0, st = 0;
  if (Status s = check_conv_layout("from", from, u, k, from_w, from_w_up, cf, &sf); !s) return s;
  if (Status s = check_conv_layout("to", to, u, k, to_w, to_w_up, ct, &st); !s) return s;
  const size_t es = dtype_size(dtype);
  const void* src[2] = {from_w, from_w_up};
  const void* dst[2] = {to_w, to_w_up};
  const char* sn[2] = {"from_w", "from_w_up"};
  const char* dn[2] = {"to_w", "to_w_up"};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      if (!src[i] || !dst[j]) continue;
      const auto a0 = reinterpret_cast<uintptr_t>(src[i]), a1 = a0 + uintptr_t(sf) * es;
      const auto b0 = reinterpret_cast<uintptr_t>(dst[j]), b1 = b0 + uintptr_t(st) * es;
      if (a0 < b1 && b0 < a1) return err(inv, "destination '", dn[j], "' overlaps source '", sn[i], "'");
    }
  if (to_w_up && to_w) {
    const auto a0 = reinterpret_cast<uintptr_t>(to_w), a1 = a0 + uintptr_t(st) * es;
    const auto b0 = reinterpret_cast<uintptr_t>(to_w_up), b1 = b0 + uintptr_t(st) * es;
    if (a0 < b1 && b0 < a1) return err(inv, "destination 'to_w' overlaps destination 'to_w_up'");
  }
  return Status::Ok();
}

}  // namespace detail

Status convert_weights(int64_t u, int64_t k, DType dtype, const WeightLayout& from, const void* from_w,
                       const void* from_w_up, const WeightLayout& to, void* to_w, void* to_w_up) {
  detail::ConvLayout cf, ct;
  if (Status s = detail::check_convert(u, k, dtype, from, from_w, from_w_up, to, to_w, to_w_up, &cf, &ct); !s)
    return s;
  const size_t es = dtype_size(dtype);
  const unsigned char* src[2] = {static_cast<const unsigned char*>(from_w), static_cast<const unsigned char*>(from_w_up)};
  unsigned char* dst[2] = {static_cast<unsigned char*>(to_w), static_cast<unsigned char*>(to_w_up)};
  const bool rows_contiguous = !cf.in_out && !ct.in_out;
  for (int half = 0; half < 2; ++half)
    for (int64_t j = 0; j < u; ++j) {
      if (rows_contiguous) {
        int ts, td;
        const int64_t os = detail::conv_offset(cf, half, j, 0, &ts);
        const int64_t od = detail::conv_offset(ct, half, j, 0, &td);
        std::memcpy(dst[td] + od * es, src[ts] + os * es, size_t(k) * es);
        continue;
      }
      for (int64_t kk = 0; kk < k; ++kk) {
        int ts, td;
        const int64_t os = detail::conv_offset(cf, half, j, kk, &ts);
        const int64_t od = detail::conv_offset(ct, half, j, kk, &td);
        std::memcpy(dst[td] + od * es, src[ts] + os * es, es);
      }
    }
  return Status::Ok();
}

}  // namespace gatedmlp
