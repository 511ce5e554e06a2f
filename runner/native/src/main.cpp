// verify-runner: the native (C++) device-side runner. It follows docs/runner-contract.md as
// verify/runner/runner.py does, with no Python on the device:
//
//   verify-runner JOB.json      run the job; write the result file the job names; exit 0
//   verify-runner --describe    print this device's description as JSON; exit 0
//   verify-runner --describe --probe P[,P...]   the same, plus "probe": per provider, null if
//                               a session can be made with it, else why
//   verify-runner --version     print the runner's and onnxruntime's versions
//
// Exit 2 (no result file): usage, an unreadable job file, a job of another contract or a
// newer version. onnxruntime is loaded at run time from ../lib or beside the executable, else
// from LD_LIBRARY_PATH.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "common.hpp"
#include "dump.hpp"

namespace vr {
namespace {

using Clock = std::chrono::steady_clock;

json base_result() {
  return {{"contract", kContract}, {"version", kContractVersion}, {"status", "ok"},
          {"cases", json::array()}};
}

void write_profile(Ort::Session& sess, const json& job, const std::string& workdir, int warmup,
                   int iterations, json& result) {
  Ort::AllocatorWithDefaultOptions alloc;
  std::string raw = sess.EndProfilingAllocated(alloc).get();
  std::string raw_path = join_path(workdir, raw);
  json events = json::parse(read_file(raw_path));
  std::remove(raw_path.c_str());
  size_t n_cases = job["cases"].size();
  json warm = json::array();
  for (size_t ci = 0; ci < n_cases; ++ci)
    for (int k = 0; k < warmup; ++k) warm.push_back(ci * (warmup + iterations) + k);
  std::string name = job["profile"].get<std::string>();
  write_json_atomic(join_path(workdir, name),
                    {{"traceEvents", events}, {"displayTimeUnit", "ms"},
                     {"otherData", {{"verify_warmup_runs", warm},
                                    {"verify_timed_runs", n_cases * iterations},
                                    {"onnxruntime", load_runtime(nullptr).version}}}});
  result["profile"] = name;
  result["profile_warmup_runs"] = warmup;
}

json run_timed(json job, const std::string& workdir) {
  json result = base_result();
  if (job.contains("optimized_model_path") && job["optimized_model_path"].is_string())
    job["optimized_model_path"] = join_path(workdir, job["optimized_model_path"].get<std::string>());
  auto t0 = Clock::now();
  std::string model = read_file(join_path(workdir, job.at("model").get<std::string>()));
  result["load_ms"] = ms_since(t0);
  t0 = Clock::now();
  Ort::Session sess = make_session(job, model.data(), model.size());
  result["prepare_ms"] = ms_since(t0);
  std::string().swap(model);
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<std::string> output_names;
  for (size_t i = 0; i < sess.GetOutputCount(); ++i)
    output_names.push_back(sess.GetOutputNameAllocated(i, alloc).get());
  std::vector<const char*> out_ptrs;
  for (const auto& n : output_names) out_ptrs.push_back(n.c_str());
  std::string out_rel = job.value("outputs_dir", std::string(contract::kDefaultOutputsDir));
  make_dirs(join_path(workdir, out_rel));
  int warmup = job.value("warmup", contract::kDefaultWarmup);
  int iterations = std::max(1, job.value("iterations", contract::kDefaultIterations));
  bool control = job.contains("control_probe") && job["control_probe"] == true;  // else false
  size_t ci = 0;
  for (const json& c : job.at("cases")) {
    std::map<std::string, npy::Array> feeds = load_inputs(c, workdir);
    std::vector<const char*> in_names;
    std::vector<Ort::Value> in_values;
    for (auto& [name, arr] : feeds) {
      in_names.push_back(name.c_str());
      in_values.push_back(as_tensor(arr));
    }
    auto run = [&]() {
      try {
        return sess.Run(Ort::RunOptions{nullptr}, in_names.data(), in_values.data(),
                        in_values.size(), out_ptrs.data(), out_ptrs.size());
      } catch (const Ort::Exception& e) {
        throw run_error(e);
      }
    };
    json warm_ms = json::array(), iter_ms = json::array(), control_ms = json::array();
    for (int k = 0; k < warmup; ++k) {
      auto t = Clock::now();
      run();
      warm_ms.push_back(ms_since(t));
    }
    std::vector<Ort::Value> outputs;
    for (int k = 0; k < iterations; ++k) {
      if (control) {
        auto t = Clock::now();
        control_probe();
        control_ms.push_back(ms_since(t));
      }
      auto t = Clock::now();
      outputs = run();
      iter_ms.push_back(ms_since(t));
    }
    json files = json::object();
    for (size_t k = 0; k < output_names.size(); ++k) {
      std::string rel = out_rel + "/case" + std::to_string(ci) + "_out" + std::to_string(k) + ".npy";
      save_value(join_path(workdir, rel), output_names[k], outputs[k]);
      files[output_names[k]] = rel;
    }
    json record = {{"warmup_ms", warm_ms}, {"iter_ms", iter_ms}, {"outputs", files}};
    if (control) record["control_ms"] = control_ms;
    result["cases"].push_back(record);
    ++ci;
  }
  if (job.contains("profile") && job["profile"].is_string())
    write_profile(sess, job, workdir, warmup, iterations, result);
  return result;
}

json run_job(json job, const std::string& workdir) {
  const Runtime& rt = load_runtime(nullptr);
  if (!rt.loaded) throw JobError("runtime", rt.error);
  // the folder of the model's external data files, relative to the work directory
  if (job.contains("external_data") && job["external_data"].is_string())
    job["external_data"] = join_path(workdir, job["external_data"].get<std::string>());
  if (job.contains("dump") && job["dump"].is_object()) {
    json result = base_result();
    result["load_ms"] = 0.0;
    result["prepare_ms"] = 0.0;
    for (size_t i = 0; i < job.at("cases").size(); ++i)
      result["cases"].push_back(
          {{"warmup_ms", json::array()}, {"iter_ms", json::array()}, {"outputs", json::object()}});
    run_dump_segments(job, workdir, result);
    return result;
  }
  return run_timed(job, workdir);
}

json error_result(const std::string& kind, const std::string& message) {
  json r = {{"contract", kContract}, {"version", kContractVersion}, {"status", "error"},
            {"error", {{"kind", kind}, {"message", first_line(message)}}}};
  return r;
}

int execute_job(const json& job, const std::string& workdir) {
  std::string result_path =
      join_path(workdir, job.value("result", std::string(contract::kDefaultResult)));
  json result;
  try {
    result = run_job(job, workdir);
  } catch (const JobError& e) {
    result = error_result(e.kind, e.what());
  } catch (const npy::WriteError& e) {
    result = error_result("runtime", std::string("output file: ") + e.what());
  } catch (const npy::Error& e) {
    result = error_result("runtime", std::string("input file: ") + e.what());
  } catch (const Ort::Exception& e) {
    result = error_result("runtime", e.what());
  } catch (const json::exception& e) {
    result = error_result("runtime", std::string("bad job: ") + e.what());
  } catch (const std::exception& e) {
    result = error_result("runtime", e.what());
  }
  result["device"] = describe(load_runtime(nullptr));
  long long rss = peak_rss_bytes();
  result["peak_rss_bytes"] = rss >= 0 ? json(rss) : json(nullptr);
  try {
    write_json_atomic(result_path, result);
  } catch (const std::exception& e) {
    std::cerr << "verify-runner: " << e.what() << "\n";
    return 3;
  }
  return 0;
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char buf[4096];
  if (!getcwd(buf, sizeof buf)) return path;
  return join_path(buf, path);
}

std::string dirname_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace
}  // namespace vr

int main(int argc, char** argv) {
  using namespace vr;
  load_runtime(argv[0]);
  std::string arg = argc >= 2 ? argv[1] : "";
  if (arg == "--describe" && (argc == 2 || (argc == 4 && std::string(argv[2]) == "--probe"))) {
    json info = describe(load_runtime(argv[0]));
    if (argc == 4) {
      std::vector<std::string> names;
      std::stringstream list(argv[3]);
      std::string p;
      while (std::getline(list, p, ','))
        if (!p.empty()) names.push_back(p);
      info["probe"] = load_runtime(argv[0]).loaded ? probe_providers(names) : json(nullptr);
    }
    std::cout << info.dump() << "\n";
    return 0;
  }
  if (arg == "--version") {
    const Runtime& rt = load_runtime(argv[0]);
    std::cout << "verify-runner " << kRunnerVersion << " (contract " << kContractVersion
              << ", ONNX Runtime API " << ORT_API_VERSION << "); onnxruntime "
              << (rt.loaded ? rt.version : "not loaded: " + rt.error) << "\n";
    return 0;
  }
  if (argc != 2 || arg.empty() || arg[0] == '-') {
    std::cerr << "usage: verify-runner JOB.json | --describe [--probe P[,P...]] | --version\n";
    return 2;
  }
  std::string job_path = absolute(arg);
  json job;
  try {
    job = json::parse(read_file(job_path));
  } catch (const std::exception& e) {
    std::cerr << "verify-runner: cannot read the job " << job_path << ": " << first_line(e.what())
              << "\n";
    return 2;
  }
  int version = job.is_object() && job.contains("version") && job["version"].is_number_integer()
                    ? job["version"].get<int>() : 0;
  bool ours = job.is_object() && job.contains("contract") && job["contract"] == kContract;
  if (!ours || version > kContractVersion) {
    std::cerr << "runner speaks " << kContract << " version " << kContractVersion
              << "; the job is " << (job.is_object() && job.contains("contract") ? job["contract"].dump() : "null")
              << " version " << (job.is_object() && job.contains("version") ? job["version"].dump() : "null")
              << "\n";
    return 2;
  }
  return execute_job(job, dirname_of(job_path));
}
