// The runner contract's defaults (docs/runner-contract.md), generated from their one
// owner, verify/runner/contract.py, by scripts/gen_native_contract.py: do not edit.
// A job without a key means the default below, in every runner.
#pragma once

namespace contract {

constexpr const char* kContract = "verify-runner";
constexpr int kContractVersion = 1;
constexpr const char* kCpuProvider = "CPUExecutionProvider";
constexpr const char* kDefaultOptLevel = "all";
constexpr int kDefaultThreads = 0;
constexpr int kDefaultInterOpThreads = 0;
constexpr int kDefaultWarmup = 1;
constexpr int kDefaultIterations = 10;
constexpr const char* kDefaultOutputsDir = "out";
constexpr const char* kDefaultResult = "result.json";
constexpr bool kDefaultNoCpuArena = false;
constexpr int kDefaultOrtLogSeverity = 3;
constexpr bool kDefaultControlProbe = false;
constexpr const char* kDefaultDumpDir = "dump";
constexpr bool kDefaultDumpSave = true;
constexpr bool kDefaultDumpStats = true;
constexpr int kStatFirst = 8;
constexpr int kPackAlign = 64;

}  // namespace contract
