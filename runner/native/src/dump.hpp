// Dump jobs (docs/runner-contract.md, "Dump jobs"): capture the job's tensors chunk by chunk
// (graph outputs appended to the model at the protobuf wire level; one whole run per chunk,
// the scheme runner.py used before segments, which the contract still accepts), chunks planned
// from the job's `sizes` where given, else from declared shapes; write each tensor as an .npy
// named by index, and summarise it. Kept apart from the timed job so it can move to segments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"

namespace vr {

constexpr int kStatFirst = 8;

// The serialized ModelProto `model` with graph outputs `names` appended (by name only);
// throws JobError(model) for bytes that are not a model.
std::string model_with_outputs(const std::string& model, const std::vector<std::string>& names);

// Split names (in order) into consecutive chunks whose sizes fit budget; an unknown size
// (nullopt) counts as the largest known one, a tensor over the budget goes alone.
std::vector<std::vector<std::string>> plan_chunks(const std::vector<std::string>& names,
                                                  const std::vector<std::optional<int64_t>>& sizes,
                                                  int64_t budget);

// Bytes one chunk may hold: 1.5x the model, at least 16 MiB, at most 1/16 of memory.
int64_t default_budget(int64_t model_bytes, int64_t memory);

// The summary record of one tensor ({"dtype", "shape", "size", "min", "max", "mean", "std",
// "nan", "inf", "first"}), as runner.py's tensor_stats computes it.
json tensor_stats(const npy::DType& dtype, const std::vector<int64_t>& shape, const void* data,
                  int first = kStatFirst);

// Run job["dump"] and put {"budget_bytes", "ms", "cases"} into result["dump"].
void run_dump(const json& job, const std::string& workdir, json& result);

}  // namespace vr
