#include "dump.hpp"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <set>
#include <sys/stat.h>

namespace vr {
namespace {

constexpr int kGraphField = 7;
constexpr unsigned char kOutputTag = 0x62;  // field 12 (GraphProto.output), wire type 2
constexpr unsigned char kNameTag = 0x0a;    // field 1 (ValueInfoProto.name), wire type 2
constexpr int64_t kMiB = int64_t(1) << 20;

std::string varint(uint64_t n) {
  std::string out;
  do {
    unsigned char low = n & 0x7f;
    n >>= 7;
    out += static_cast<char>(low | (n ? 0x80 : 0));
  } while (n);
  return out;
}

uint64_t read_varint(const std::string& buf, size_t& pos) {
  uint64_t result = 0;
  int shift = 0;
  while (true) {
    if (pos >= buf.size() || shift > 63)
      throw JobError("model", "not an ONNX model (truncated protobuf)");
    unsigned char b = static_cast<unsigned char>(buf[pos++]);
    result |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return result;
    shift += 7;
  }
}

// (tag start, value start, value end) of ModelProto.graph.
void graph_span(const std::string& buf, size_t& start, size_t& vstart, size_t& vend) {
  size_t pos = 0;
  while (pos < buf.size()) {
    start = pos;
    uint64_t key = read_varint(buf, pos);
    uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      read_varint(buf, pos);
    } else if (wire == 1) {
      pos += 8;
    } else if (wire == 5) {
      pos += 4;
    } else if (wire == 2) {
      uint64_t length = read_varint(buf, pos);
      if (length > buf.size() - pos) throw JobError("model", "not an ONNX model (truncated protobuf)");
      if (field == kGraphField) {
        vstart = pos;
        vend = pos + length;
        return;
      }
      pos += length;
    } else {
      throw JobError("model", "not an ONNX model (protobuf wire type " + std::to_string(wire) + ")");
    }
  }
  throw JobError("model", "not an ONNX model (no graph)");
}

std::optional<int64_t> itemsize_of(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2: return 1;
    default: return std::nullopt;
  }
}

// Estimated bytes of each session output from its declared type and shape (symbolic dims
// resolved from the fed inputs); nullopt when unknown.
std::map<std::string, std::optional<int64_t>> output_sizes(
    Ort::Session& sess, const std::map<std::string, npy::Array>& feeds) {
  std::map<std::string, int64_t> symbols;
  Ort::AllocatorWithDefaultOptions alloc;
  for (size_t i = 0; i < sess.GetInputCount(); ++i) {
    std::string name = sess.GetInputNameAllocated(i, alloc).get();
    auto it = feeds.find(name);
    Ort::TypeInfo ti = sess.GetInputTypeInfo(i);
    if (it == feeds.end() || ti.GetONNXType() != ONNX_TYPE_TENSOR) continue;
    auto info = ti.GetTensorTypeAndShapeInfo();
    std::vector<const char*> syms(info.GetDimensionsCount());
    info.GetSymbolicDimensions(syms.data(), syms.size());
    std::vector<int64_t> dims = info.GetShape();
    for (size_t d = 0; d < dims.size() && d < it->second.shape.size(); ++d)
      if (dims[d] < 0 && syms[d] && *syms[d]) symbols[syms[d]] = it->second.shape[d];
  }
  std::map<std::string, std::optional<int64_t>> sizes;
  for (size_t i = 0; i < sess.GetOutputCount(); ++i) {
    std::string name = sess.GetOutputNameAllocated(i, alloc).get();
    Ort::TypeInfo ti = sess.GetOutputTypeInfo(i);
    sizes[name] = std::nullopt;
    if (ti.GetONNXType() != ONNX_TYPE_TENSOR) continue;
    auto info = ti.GetTensorTypeAndShapeInfo();
    std::optional<int64_t> n = itemsize_of(info.GetElementType());
    std::vector<const char*> syms(info.GetDimensionsCount());
    info.GetSymbolicDimensions(syms.data(), syms.size());
    std::vector<int64_t> dims = info.GetShape();
    for (size_t d = 0; n && d < dims.size(); ++d) {
      if (dims[d] >= 0)
        *n *= dims[d];
      else if (syms[d] && *syms[d] && symbols.count(syms[d]))
        *n *= symbols[syms[d]];
      else
        n = std::nullopt;
    }
    sizes[name] = n;
  }
  return sizes;
}

void write_bytes(const std::string& path, const std::string& data) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f && std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok) throw std::runtime_error("cannot write " + path);
}

// A session on `model` with `marked` appended as outputs (through a scratch file, removed).
Ort::Session marked_session(const json& session_job, const std::string& model,
                            const std::vector<std::string>& marked, const std::string& scratch) {
  std::string path = join_path(scratch, "_marked.onnx");
  write_bytes(path, model_with_outputs(read_file(model), marked));
  try {
    Ort::Session sess = make_session_file(session_job, path);
    std::remove(path.c_str());
    return sess;
  } catch (...) {
    std::remove(path.c_str());
    throw;
  }
}

int64_t total_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace

std::string model_with_outputs(const std::string& model, const std::vector<std::string>& names) {
  size_t start = 0, vstart = 0, vend = 0;
  graph_span(model, start, vstart, vend);
  std::string extra;
  for (const std::string& name : names) {
    std::string vi = static_cast<char>(kNameTag) + varint(name.size()) + name;
    extra += static_cast<char>(kOutputTag) + varint(vi.size()) + vi;
  }
  std::string head = varint((kGraphField << 3) | 2) + varint(vend - vstart + extra.size());
  std::string out;
  out.reserve(model.size() + head.size() + extra.size());
  out.append(model, 0, start);
  out += head;
  out.append(model, vstart, vend - vstart);
  out += extra;
  out.append(model, vend, std::string::npos);
  return out;
}

std::vector<std::vector<std::string>> plan_chunks(const std::vector<std::string>& names,
                                                  const std::vector<std::optional<int64_t>>& sizes,
                                                  int64_t budget) {
  std::optional<int64_t> largest;
  for (const auto& s : sizes)
    if (s && (!largest || *s > *largest)) largest = s;
  int64_t guess = largest ? *largest : budget;
  std::vector<std::vector<std::string>> chunks;
  std::vector<std::string> current;
  int64_t used = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    int64_t size = sizes[i] ? *sizes[i] : guess;
    if (!current.empty() && used + size > budget) {
      chunks.push_back(current);
      current.clear();
      used = 0;
    }
    current.push_back(names[i]);
    used += size;
  }
  if (!current.empty()) chunks.push_back(current);
  return chunks;
}

int64_t default_budget(int64_t model_bytes, int64_t memory) {
  int64_t budget = std::max<int64_t>(16 * kMiB, model_bytes * 3 / 2);
  if (memory > 0) budget = std::min(budget, std::max(memory / 16, kMiB));
  return budget;
}

void run_dump(const json& job, const std::string& workdir, json& result) {
  const json& spec = job.at("dump");
  std::string out_rel = spec.value("dir", std::string("dump"));
  std::string out_dir = join_path(workdir, out_rel);
  make_dirs(out_dir);
  std::string model = join_path(workdir, job.at("model").get<std::string>());
  // No arena, optimizations off: capture the graph as it is (see runner.py's run_dump).
  json session_job = job;
  session_job["opt_level"] = "disable";
  session_job.erase("optimized_model_path");
  session_job["profile"] = nullptr;
  session_job["no_cpu_arena"] = true;
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 4 << 20);  // freed tensors leave the process
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
#endif
  std::vector<std::string> tensors = spec.at("tensors").get<std::vector<std::string>>();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i], i);
  bool save = spec.value("save", true);
  int first = spec.value("first", kStatFirst);
  std::vector<std::map<std::string, npy::Array>> cases;
  for (const json& c : job.at("cases")) cases.push_back(load_inputs(c, workdir));
  struct stat st;
  if (stat(model.c_str(), &st) != 0) throw std::runtime_error("cannot open " + model);
  int64_t budget = spec.contains("budget_bytes") && spec["budget_bytes"].is_number()
                       ? spec["budget_bytes"].get<int64_t>() : 0;
  if (budget <= 0) budget = default_budget(st.st_size, total_memory());
  json records = json::array();
  for (size_t c = 0; c < cases.size(); ++c)
    records.push_back(json(std::vector<json>(tensors.size(), nullptr)));
  auto t0 = std::chrono::steady_clock::now();

  std::set<std::string> outputs;
  if (spec.contains("outputs")) for (const json& o : spec["outputs"]) outputs.insert(o.get<std::string>());
  std::set<std::string> fed;
  for (const auto& c : cases) for (const auto& kv : c) fed.insert(kv.first);
  std::vector<std::string> marked;
  for (const auto& n : tensors) if (!fed.count(n) && !outputs.count(n)) marked.push_back(n);
  std::optional<Ort::Session> sess;
  sess.emplace(marked_session(session_job, model, marked, out_dir));
  auto sizes = output_sizes(*sess, cases.empty() ? std::map<std::string, npy::Array>() : cases[0]);
  // The host's sizes (shape inference with the cases' concrete shapes) first; then what the
  // session's declared types and shapes give.
  const json* given = spec.contains("sizes") && spec["sizes"].is_object() ? &spec["sizes"] : nullptr;
  std::vector<std::optional<int64_t>> planned;
  for (const auto& n : tensors) {
    if (fed.count(n)) {
      planned.push_back(0);
    } else if (given && given->contains(n) && (*given)[n].is_number_integer()) {
      planned.push_back((*given)[n].get<int64_t>());
    } else {
      planned.push_back(sizes.count(n) ? sizes[n] : std::nullopt);
    }
  }
  auto chunks = plan_chunks(tensors, planned, budget);
  if (chunks.size() > 1) sess.reset();

  for (const auto& chunk : chunks) {
    std::vector<std::string> fetch;
    for (const auto& n : chunk) if (!fed.count(n)) fetch.push_back(n);
    if (!fetch.empty() && !sess) {
      std::vector<std::string> extra;
      for (const auto& n : fetch) if (!outputs.count(n)) extra.push_back(n);
      sess.emplace(marked_session(session_job, model, extra, out_dir));
    }
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      std::vector<Ort::Value> got;
      if (!fetch.empty()) {
        std::vector<const char*> in_names, out_names;
        std::vector<Ort::Value> in_values;
        for (auto& [name, arr] : cases[ci]) {
          in_names.push_back(name.c_str());
          in_values.push_back(as_tensor(arr));
        }
        for (const auto& n : fetch) out_names.push_back(n.c_str());
        try {
          got = sess->Run(Ort::RunOptions{nullptr}, in_names.data(), in_values.data(),
                          in_values.size(), out_names.data(), out_names.size());
        } catch (const Ort::Exception& e) {
          throw run_error(e);
        }
      }
      size_t k = 0;
      for (const auto& name : chunk) {
        size_t ti = index[name];
        npy::DType dt;
        std::vector<int64_t> shape;
        const void* data = nullptr;
        if (fed.count(name)) {
          auto it = cases[ci].find(name);
          if (it == cases[ci].end()) continue;  // another case's input
          dt = it->second.dtype;
          shape = it->second.shape;
          data = it->second.data();
        } else {
          Ort::Value& v = got[k++];
          if (!v.IsTensor()) continue;
          auto info = v.GetTensorTypeAndShapeInfo();
          try {
            dt = dtype_of(info.GetElementType());
          } catch (const npy::Error&) {
            continue;  // no .npy form: recorded as not captured
          }
          shape = info.GetShape();
          data = info.GetElementCount() ? v.GetTensorRawData() : nullptr;
        }
        json rec = tensor_stats(dt, shape, data, first);
        rec["name"] = name;
        rec["file"] = nullptr;
        if (save) {
          char file[64];
          std::snprintf(file, sizeof file, "/c%zu_t%05zu.npy", ci, ti);
          std::string rel = out_rel + file;
          size_t count = 1;
          for (int64_t d : shape) count *= static_cast<size_t>(d);
          npy::save(join_path(workdir, rel), dt, shape, data, count * dt.itemsize);
          rec["file"] = rel;
        }
        records[ci][ti] = std::move(rec);
      }
    }
    sess.reset();
  }
  result["dump"] = {{"budget_bytes", budget}, {"ms", ms_since(t0)}, {"cases", records}};
}

}  // namespace vr
