// Dump jobs (docs/runner-contract.md, "Dump jobs" and "Segments"): segments.cpp cuts the
// graph into segments whose live tensors fit the budget and runs each node once; stats.cpp
// summarises each tensor. Kept apart from the timed job so the protocol can change on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"

namespace vr {

constexpr int kStatFirst = contract::kStatFirst;

// Bytes of live tensors a segment may hold when the job names no budget: 1.5x the model, at
// least 16 MiB, at most 1/16 of memory (runner.py's default_budget).
int64_t default_budget(int64_t model_bytes, int64_t memory);

// What every record of a tensor holds, summary or not: {"dtype", "shape", "size"}.
json tensor_head(const npy::DType& dtype, const std::vector<int64_t>& shape);

// The summary record of one tensor ({"dtype", "shape", "size", "min", "max", "mean", "std",
// "nan", "inf", "first"}), as runner.py's tensor_stats computes it.
json tensor_stats(const npy::DType& dtype, const std::vector<int64_t>& shape, const void* data,
                  int first = kStatFirst);

// Run job["dump"] in segments and put {"budget_bytes", "ms", "cases", "segments", "nodes",
// "measured", "subgraph_tensors"} into result["dump"].
void run_dump_segments(const json& job, const std::string& workdir, json& result);

}  // namespace vr
