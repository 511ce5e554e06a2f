#include "dump.hpp"

#include <algorithm>

namespace vr {

namespace {
constexpr int64_t kMiB = int64_t(1) << 20;
}  // namespace

int64_t default_budget(int64_t model_bytes, int64_t memory) {
  int64_t budget = std::max<int64_t>(16 * kMiB, model_bytes * 3 / 2);
  if (memory > 0) budget = std::min(budget, std::max(memory / 16, kMiB));
  return budget;
}

}  // namespace vr
