// tensor_stats: the per-tensor summary of a dump, computed as runner.py's tensor_stats does
// (blocks of 2^20 elements, float64 sums over finite values, merged block by block).
#include <cmath>
#include <cstring>

#include "dump.hpp"

namespace vr {
namespace {

constexpr size_t kBlock = size_t(1) << 20;

double half_to_double(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(static_cast<double>(mant), -24);
  else if (exp == 31)
    v = mant ? std::nan("") : INFINITY;
  else
    v = std::ldexp(static_cast<double>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// Element i as a double, and as the JSON value numpy's .item() would give.
enum Code { F32, F64, F16, I8, U8, BOOL, I16, U16, I32, U32, I64, U64 };

Code code_of(const std::string& name) {
  static const char* names[] = {"float32", "float64", "float16", "int8", "uint8", "bool",
                                "int16", "uint16", "int32", "uint32", "int64", "uint64"};
  for (int i = 0; i < 12; ++i)
    if (name == names[i]) return static_cast<Code>(i);
  return F32;
}

struct Reader {
  const unsigned char* p;
  Code code;
  size_t itemsize;

  template <typename T>
  T get(size_t i) const {
    T v;
    std::memcpy(&v, p + i * itemsize, sizeof v);
    return v;
  }

  double at(size_t i) const {
    switch (code) {
      case F32: return get<float>(i);
      case F64: return get<double>(i);
      case F16: return half_to_double(get<uint16_t>(i));
      case I8: return get<int8_t>(i);
      case U8: case BOOL: return get<uint8_t>(i);
      case I16: return get<int16_t>(i);
      case U16: return get<uint16_t>(i);
      case I32: return get<int32_t>(i);
      case U32: return get<uint32_t>(i);
      case I64: return static_cast<double>(get<int64_t>(i));
      case U64: return static_cast<double>(get<uint64_t>(i));
    }
    return 0;
  }

  json item(size_t i) const {
    switch (code) {
      case BOOL: return get<uint8_t>(i) != 0;
      case I8: case I16: case I32: return static_cast<int64_t>(at(i));
      case I64: return get<int64_t>(i);
      case U8: case U16: case U32: return static_cast<uint64_t>(at(i));
      case U64: return get<uint64_t>(i);
      default: {  // NaN and infinities as the strings "nan", "inf", "-inf" (the contract's
        double v = at(i);  // form; nlohmann would write null, and NaN could not be told
        if (std::isnan(v)) return "nan";  // from an infinity)
        if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
        return v;
      }
    }
  }
};

}  // namespace

json tensor_head(const npy::DType& dtype, const std::vector<int64_t>& shape) {
  size_t size = 1;
  for (int64_t d : shape) size *= static_cast<size_t>(d);
  return {{"dtype", dtype.name}, {"shape", shape}, {"size", size}};
}

json tensor_stats(const npy::DType& dtype, const std::vector<int64_t>& shape, const void* data,
                  int first) {
  json stats = tensor_head(dtype, shape);
  size_t size = stats["size"].get<size_t>();
  stats.update({{"nan", 0}, {"inf", 0}, {"min", nullptr}, {"max", nullptr}, {"mean", nullptr},
                {"std", nullptr}, {"first", json::array()}});
  if (std::string("biuf").find(dtype.kind) == std::string::npos) return stats;
  Reader r{static_cast<const unsigned char*>(data), code_of(dtype.name), dtype.itemsize};
  for (size_t i = 0; i < size && i < static_cast<size_t>(first); ++i)
    stats["first"].push_back(r.item(i));
  bool is_float = dtype.kind == 'f';
  long long nan = 0, inf = 0;
  double count = 0, total = 0, m2 = 0;
  size_t lo_i = 0, hi_i = 0;
  double lo = 0, hi = 0;
  bool have = false;
  std::vector<double> block;
  std::vector<size_t> where;
  for (size_t start = 0; start < size; start += kBlock) {
    size_t end = std::min(size, start + kBlock);
    block.clear();
    where.clear();
    for (size_t i = start; i < end; ++i) {
      double v = r.at(i);
      if (is_float && !std::isfinite(v)) {
        if (std::isnan(v)) ++nan; else ++inf;
        continue;
      }
      block.push_back(v);
      where.push_back(i);
    }
    if (block.empty()) continue;
    double n_b = static_cast<double>(block.size());
    double sum = 0;
    size_t bmin = 0, bmax = 0;
    for (size_t k = 0; k < block.size(); ++k) {
      sum += block[k];
      if (block[k] < block[bmin]) bmin = k;
      if (block[k] > block[bmax]) bmax = k;
    }
    double bmean = sum / n_b, bm2 = 0;
    for (double v : block) bm2 += (v - bmean) * (v - bmean);
    double n = count + n_b;
    double prev = count ? total / count : 0.0;
    double delta = bmean - prev;
    double mean = prev + delta * n_b / n;
    m2 = m2 + bm2 + delta * delta * count * n_b / n;
    total = mean * n;
    count = n;
    if (!have || block[bmin] < lo) { lo = block[bmin]; lo_i = where[bmin]; }
    if (!have || block[bmax] > hi) { hi = block[bmax]; hi_i = where[bmax]; }
    have = true;
  }
  stats["nan"] = nan;
  stats["inf"] = inf;
  if (count > 0) {
    stats["min"] = r.item(lo_i);
    stats["max"] = r.item(hi_i);
    double mean = total / count, std = std::sqrt(m2 / count);
    if (std::isfinite(mean)) stats["mean"] = mean;  // past float64's range: null
    if (std::isfinite(std)) stats["std"] = std;
  }
  return stats;
}

}  // namespace vr
