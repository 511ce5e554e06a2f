// Dump jobs in segments (docs/runner-contract.md, "Segments"): each node runs once; the graph
// is cut into segments whose live tensors fit the budget, each built at the protobuf wire
// level, fed the values held from earlier segments. Not done here: step 2's measuring run (a
// node with an output of unknown size simply runs alone, which the cut rule allows).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "dump.hpp"

namespace vr {
namespace {

struct Field {
  uint64_t num = 0;
  int wire = 0;
  size_t start = 0, end = 0;    // the whole record, tag included
  size_t vstart = 0, vend = 0;  // the value of a length-delimited field
};

uint64_t varint_at(const std::string& b, size_t& pos, size_t end) {
  uint64_t r = 0;
  int shift = 0;
  while (true) {
    if (pos >= end || shift > 63) throw JobError("model", "not an ONNX model (truncated protobuf)");
    unsigned char c = static_cast<unsigned char>(b[pos++]);
    r |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return r;
    shift += 7;
  }
}

std::vector<Field> fields(const std::string& b, size_t begin, size_t end) {
  std::vector<Field> out;
  size_t pos = begin;
  while (pos < end) {
    Field f;
    f.start = pos;
    uint64_t key = varint_at(b, pos, end);
    f.num = key >> 3;
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      varint_at(b, pos, end);
    } else if (f.wire == 1) {
      pos += 8;
    } else if (f.wire == 5) {
      pos += 4;
    } else if (f.wire == 2) {
      uint64_t n = varint_at(b, pos, end);
      if (n > end - pos) throw JobError("model", "not an ONNX model (truncated protobuf)");
      f.vstart = pos;
      f.vend = pos + n;
      pos += n;
    } else {
      throw JobError("model", "not an ONNX model (protobuf wire type " + std::to_string(f.wire) + ")");
    }
    if (pos > end) throw JobError("model", "not an ONNX model (truncated protobuf)");
    f.end = pos;
    out.push_back(f);
  }
  return out;
}

std::string str(const std::string& b, const Field& f) { return b.substr(f.vstart, f.vend - f.vstart); }

std::string varint(uint64_t n) {
  std::string out;
  do {
    unsigned char low = n & 0x7f;
    n >>= 7;
    out += static_cast<char>(low | (n ? 0x80 : 0));
  } while (n);
  return out;
}

std::string record(uint64_t num, const std::string& value) {
  return varint((num << 3) | 2) + varint(value.size()) + value;
}

struct Node {
  Field where;
  std::vector<std::string> inputs, outputs;
  std::string op, domain;
  std::set<std::string> reads;  // inputs and the free names of its subgraphs
};

// A Constant node's value never crosses a segment boundary: a later segment reading it gets a
// copy of the node, so onnxruntime sees an initializer there as in a plain run (fed as an input,
// MatMul's weight is not pre-packed and the product can differ by an ulp).
bool is_constant(const Node& n) {
  return n.op == "Constant" && (n.domain.empty() || n.domain == "ai.onnx") && n.reads.empty();
}

// Names a graph uses without defining, and how many node outputs it (and nested ones) holds.
void graph_free_names(const std::string& b, size_t begin, size_t end, std::set<std::string>& free,
                      size_t& body_tensors);

void node_reads(const std::string& b, const Field& nf, Node& node, size_t& body_tensors) {
  for (const Field& f : fields(b, nf.vstart, nf.vend)) {
    if (f.num == 1 && f.wire == 2) {
      std::string s = str(b, f);
      node.inputs.push_back(s);
      if (!s.empty()) node.reads.insert(s);
    } else if (f.num == 2 && f.wire == 2) {
      node.outputs.push_back(str(b, f));
    } else if (f.num == 4 && f.wire == 2) {
      node.op = str(b, f);
    } else if (f.num == 7 && f.wire == 2) {
      node.domain = str(b, f);
    } else if (f.num == 5 && f.wire == 2) {  // AttributeProto
      for (const Field& a : fields(b, f.vstart, f.vend))
        if ((a.num == 6 || a.num == 11) && a.wire == 2)
          graph_free_names(b, a.vstart, a.vend, node.reads, body_tensors);
    }
  }
}

void graph_free_names(const std::string& b, size_t begin, size_t end, std::set<std::string>& free,
                      size_t& body_tensors) {
  std::set<std::string> defined, used;
  for (const Field& f : fields(b, begin, end)) {
    if (f.wire != 2) continue;
    if (f.num == 11) {  // input ValueInfoProto: name = 1
      for (const Field& v : fields(b, f.vstart, f.vend))
        if (v.num == 1 && v.wire == 2) defined.insert(str(b, v));
    } else if (f.num == 5) {  // TensorProto: name = 8
      for (const Field& v : fields(b, f.vstart, f.vend))
        if (v.num == 8 && v.wire == 2) defined.insert(str(b, v));
    } else if (f.num == 1) {
      Node n;
      node_reads(b, f, n, body_tensors);
      for (const auto& o : n.outputs)
        if (!o.empty()) {
          defined.insert(o);
          ++body_tensors;
        }
      used.insert(n.reads.begin(), n.reads.end());
    }
  }
  for (const auto& u : used)
    if (!defined.count(u)) free.insert(u);
}

std::string name_of(const std::string& b, const Field& f, uint64_t name_field) {
  for (const Field& v : fields(b, f.vstart, f.vend))
    if (v.num == name_field && v.wire == 2) return str(b, v);
  return "";
}

struct Graph {
  std::string model;                       // the whole ModelProto
  Field graph;                             // field 7
  std::vector<Node> nodes;
  std::vector<Field> keep;                 // graph fields copied as they are
  std::map<std::string, Field> initializers, sparse, inputs;
  std::map<std::string, size_t> constants;  // output of a Constant node -> its index
  size_t body_tensors = 0;
};

// The nodes in the file's order where that is topological (ONNX requires it; onnxruntime's
// saved models keep it), else stably reordered so each node follows what it reads (runner.py's
// _topological): a segment cut from a graph stored out of order would read a value no earlier
// segment made.
std::vector<Node> topological(const std::string& model, std::vector<Node> nodes,
                              std::set<std::string> available) {
  available.insert("");
  std::set<std::string> produced;
  for (const Node& n : nodes) produced.insert(n.outputs.begin(), n.outputs.end());
  std::vector<Node> ordered, pending = std::move(nodes);
  ordered.reserve(pending.size());
  while (!pending.empty()) {
    std::vector<Node> later;
    for (Node& n : pending) {
      bool ready = true;
      for (const auto& r : n.reads)
        if (!available.count(r) && produced.count(r)) {
          ready = false;
          break;
        }
      if (ready) {
        available.insert(n.outputs.begin(), n.outputs.end());
        ordered.push_back(std::move(n));
      } else {
        later.push_back(std::move(n));
      }
    }
    if (later.size() == pending.size())
      throw JobError("model", "the graph has a cycle (node '" + name_of(model, later[0].where, 3) +
                                  "')");
    pending = std::move(later);
  }
  return ordered;
}

Graph parse_graph(const std::string& model) {
  Graph g;
  g.model = model;
  bool found = false;
  for (const Field& f : fields(model, 0, model.size()))
    if (f.num == 7 && f.wire == 2) {
      g.graph = f;
      found = true;
    }
  if (!found) throw JobError("model", "not an ONNX model (no graph)");
  for (const Field& f : fields(model, g.graph.vstart, g.graph.vend)) {
    if (f.num == 1 && f.wire == 2) {
      Node n;
      n.where = f;
      node_reads(model, f, n, g.body_tensors);
      g.nodes.push_back(std::move(n));
    } else if (f.num == 5 && f.wire == 2) {
      g.initializers[name_of(model, f, 8)] = f;
    } else if (f.num == 15 && f.wire == 2) {  // SparseTensorProto: values (1) is a TensorProto
      for (const Field& v : fields(model, f.vstart, f.vend))
        if (v.num == 1 && v.wire == 2) g.sparse[name_of(model, v, 8)] = f;
    } else if (f.num == 11 && f.wire == 2) {
      g.inputs[name_of(model, f, 1)] = f;
    } else if (f.num != 12 && f.num != 13) {
      g.keep.push_back(f);
    }
  }
  std::set<std::string> available;
  for (const auto& kv : g.initializers) available.insert(kv.first);
  for (const auto& kv : g.sparse) available.insert(kv.first);
  for (const auto& kv : g.inputs) available.insert(kv.first);
  g.nodes = topological(model, std::move(g.nodes), std::move(available));
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (is_constant(g.nodes[i]))
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty()) g.constants[o] = i;
  return g;
}

// The most bytes of node outputs a plain (unmarked) run holds at once: after each node, what
// it and earlier nodes made that a later node still reads (runner.py's plain_live_bytes).
int64_t plain_live_bytes(const Graph& g,
                         const std::map<std::string, std::optional<int64_t>>& size,
                         const std::map<std::string, size_t>& last_read) {
  std::map<size_t, int64_t> ends;
  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    int64_t passing = 0;  // made and not read later: held only while the node runs
    for (const auto& o : g.nodes[i].outputs) {
      if (o.empty()) continue;
      auto s = size.find(o);
      int64_t bytes = s != size.end() && s->second ? *s->second : 0;
      auto r = last_read.find(o);
      if (r != last_read.end() && r->second > i) {
        live += bytes;
        ends[r->second] += bytes;
      } else {
        passing += bytes;
      }
    }
    peak = std::max(peak, live + passing);
    auto e = ends.find(i);
    if (e != ends.end()) {
      live -= e->second;
      ends.erase(e);
    }
  }
  return peak;
}

std::string raw(const std::string& b, const Field& f) { return b.substr(f.start, f.end - f.start); }

// A serialized TypeProto of a value held for a later segment: a tensor of its element type,
// or a sequence of tensors (SequenceConstruct's); empty for what a segment cannot take (a map).
std::string value_type(const Ort::Value& v) {
  Ort::TypeInfo info = v.GetTypeInfo();
  auto tensor = [](ONNXTensorElementDataType elem) {
    return record(1, varint((1 << 3) | 0) + varint(static_cast<uint64_t>(elem)));
  };
  if (info.GetONNXType() == ONNX_TYPE_TENSOR)
    return tensor(info.GetTensorTypeAndShapeInfo().GetElementType());
  if (info.GetONNXType() == ONNX_TYPE_SEQUENCE) {
    Ort::TypeInfo elem = info.GetSequenceTypeInfo().GetSequenceElementType();
    if (elem.GetONNXType() == ONNX_TYPE_TENSOR)
      return record(4, record(1, tensor(elem.GetTensorTypeAndShapeInfo().GetElementType())));
  }
  return "";
}

// Step 4: the segment's model.
std::string segment_model(const Graph& g, size_t first, size_t last,
                          const std::map<std::string, std::string>& held_types,
                          const std::vector<std::string>& marked) {
  const std::string& b = g.model;
  std::string graph;
  for (const Field& f : g.keep) graph += raw(b, f);
  std::set<std::string> reads, made;
  std::string nodes;
  for (size_t i = first; i < last; ++i) {
    nodes += raw(b, g.nodes[i].where);
    for (const auto& r : g.nodes[i].reads)
      if (!made.count(r)) reads.insert(r);
    for (const auto& o : g.nodes[i].outputs) made.insert(o);
  }
  for (const auto& r : reads) {  // a Constant node made earlier: copied ahead of its readers
    auto c = g.constants.find(r);
    if (c != g.constants.end()) graph += raw(b, g.nodes[c->second].where);
  }
  graph += nodes;
  for (const auto& r : reads) {
    auto it = g.initializers.find(r);
    if (it != g.initializers.end()) graph += raw(b, it->second);
    auto sp = g.sparse.find(r);
    if (sp != g.sparse.end()) graph += raw(b, sp->second);
    auto in = g.inputs.find(r);
    if (in != g.inputs.end()) graph += raw(b, in->second);
    auto held = held_types.find(r);
    if (held != held_types.end() && in == g.inputs.end())
      graph += record(11, record(1, r) + record(2, held->second));
  }
  for (const auto& m : marked) graph += record(12, record(1, m));
  std::string out = b.substr(0, g.graph.start) + record(7, graph) + b.substr(g.graph.end);
  return out;
}

}  // namespace

void run_dump_segments(const json& job, const std::string& workdir, json& result) {
  const json& spec = job.at("dump");
  std::string out_rel = spec.value("dir", std::string(contract::kDefaultDumpDir));
  make_dirs(join_path(workdir, out_rel));
  std::string model_path = join_path(workdir, job.at("model").get<std::string>());
  json session_job = job;
  session_job["opt_level"] = "disable";
  session_job.erase("optimized_model_path");
  session_job["profile"] = nullptr;
  session_job["no_cpu_arena"] = true;
  std::vector<std::string> tensors = spec.at("tensors").get<std::vector<std::string>>();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i], i);
  bool save = spec.value("save", contract::kDefaultDumpSave);
  // the summaries only where asked (the text io-dump) or they are all there is
  bool summarize = spec.value("stats", contract::kDefaultDumpStats) || !save;
  int first_n = spec.value("first", kStatFirst);
  std::vector<std::map<std::string, npy::Array>> cases;
  for (const json& c : job.at("cases")) cases.push_back(load_inputs(c, workdir));
  Graph g = parse_graph(read_file(model_path));
  // a positive integer, or the default (null, or anything else); one beyond int64 (which
  // nlohmann keeps as a double: get<int64_t> on it was undefined) is no limit at all
  int64_t budget = 0;
  if (spec.contains("budget_bytes") && spec["budget_bytes"].is_number()) {
    double b = spec["budget_bytes"].get<double>();
    budget = b >= 9.2e18 ? std::numeric_limits<int64_t>::max()
                         : b >= 1 ? static_cast<int64_t>(b) : 0;
  }
  const size_t n = g.nodes.size();
  std::map<std::string, size_t> last_read;  // Constant outputs left out: never held (is_constant)
  for (size_t i = 0; i < n; ++i)
    for (const auto& r : g.nodes[i].reads)
      if (!g.constants.count(r)) last_read[r] = i;
  std::map<std::string, std::optional<int64_t>> size;
  std::vector<bool> unknown(n, false);
  int measured = 0;
  for (size_t i = 0; i < n; ++i) {
    for (const auto& o : g.nodes[i].outputs) {
      if (o.empty()) continue;
      std::optional<int64_t> s;
      if (spec.contains("sizes") && spec["sizes"].is_object() && spec["sizes"].contains(o) &&
          spec["sizes"][o].is_number_integer())
        s = spec["sizes"][o].get<int64_t>();
      size[o] = s;
      if (!s) unknown[i] = true;
    }
    if (unknown[i]) ++measured;
  }
  if (budget <= 0) {  // raised to half what a plain run holds at once, as runner.py's
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    budget = std::max(default_budget(static_cast<int64_t>(g.model.size()),
                                     pages > 0 && page > 0 ? int64_t(pages) * page : 0),
                      plain_live_bytes(g, size, last_read) / 2);
  }
  std::set<std::string> wanted(tensors.begin(), tensors.end());
  auto marked_of = [&](size_t first, size_t last) {  // [first, last)
    std::vector<std::string> m;
    for (size_t i = first; i < last; ++i)
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty() && (wanted.count(o) || (last_read.count(o) && last_read[o] >= last)))
          m.push_back(o);
    return m;
  };
  json records = json::array();
  for (size_t c = 0; c < cases.size(); ++c)
    records.push_back(json(std::vector<json>(tensors.size(), nullptr)));
  // one pack file per case, DIR/c<case>.npys: the tensors' .npy images at aligned offsets;
  // cases come one after the other, so one pack is open at a time
  std::unique_ptr<npy::Pack> pack;
  size_t pack_case = 0;
  auto emit = [&](size_t ci, const std::string& name, const npy::DType& dt,
                  const std::vector<int64_t>& shape, const void* data) {
    size_t ti = index[name];
    json rec = summarize ? tensor_stats(dt, shape, data, first_n) : tensor_head(dt, shape);
    rec["name"] = name;
    rec["file"] = nullptr;
    if (save) {
      std::string rel = out_rel + "/c" + std::to_string(ci) + ".npys";
      if (!pack || pack_case != ci) {
        if (pack) pack->close();
        pack = std::make_unique<npy::Pack>(join_path(workdir, rel), contract::kPackAlign);
        pack_case = ci;
      }
      size_t count = 1;
      for (int64_t d : shape) count *= static_cast<size_t>(d);
      rec["offset"] = pack->append(dt, shape, data, count * dt.itemsize);
      rec["file"] = rel;
    }
    records[ci][ti] = std::move(rec);
  };
  auto t0 = std::chrono::steady_clock::now();
  json spans = json::array();
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    for (auto& [name, arr] : cases[ci])
      if (wanted.count(name)) emit(ci, name, arr.dtype, arr.shape, arr.data());
    std::map<std::string, Ort::Value> held;
    size_t first = 0;
    while (first < n) {
      int64_t held_bytes = 0;
      for (auto& [name, v] : held) {
        if (!v.IsTensor()) continue;  // a sequence: its tensors are not counted
        auto info = v.GetTensorTypeAndShapeInfo();
        size_t item = 4;
        try {
          item = dtype_of(info.GetElementType()).itemsize;
        } catch (const npy::Error&) {
        }
        held_bytes += static_cast<int64_t>(info.GetElementCount() * item);
      }
      size_t last = first + 1;
      if (!unknown[first]) {
        while (last < n && !unknown[last]) {
          int64_t live = held_bytes;
          for (const auto& m : marked_of(first, last + 1)) live += size[m].value_or(0);
          if (live > budget) break;
          ++last;
        }
      }
      std::vector<std::string> marked = marked_of(first, last);
      if (marked.empty()) {  // nothing of it is wanted or read later
        if (ci == 0) spans.push_back({first, last});
        first = last;
        continue;
      }
      std::map<std::string, std::string> held_types;
      for (auto& [name, v] : held) {
        held_types[name] = value_type(v);
        if (held_types[name].empty())
          throw JobError("runtime", "value " + name + " (a map) cannot cross a segment boundary");
      }
      std::string seg = segment_model(g, first, last, held_types, marked);
      Ort::Session sess = make_session(session_job, seg.data(), seg.size());
      std::string().swap(seg);
      std::set<std::string> reads;
      for (size_t i = first; i < last; ++i) reads.insert(g.nodes[i].reads.begin(), g.nodes[i].reads.end());
      std::vector<const char*> in_names, out_names;
      // The held values are fed as they are (held keeps them: the C API takes unowned
      // pointers), so a tensor of any type crosses a boundary, bfloat16 and string included.
      std::vector<Ort::Value> owned;  // the case's inputs, wrapped for this run
      std::vector<const OrtValue*> in_values;
      Ort::AllocatorWithDefaultOptions alloc;
      std::vector<std::string> sess_inputs;
      for (size_t i = 0; i < sess.GetInputCount(); ++i)
        sess_inputs.push_back(sess.GetInputNameAllocated(i, alloc).get());
      owned.reserve(sess_inputs.size());
      for (const auto& name : sess_inputs) {
        auto h = held.find(name);
        auto c = cases[ci].find(name);
        if (h != held.end()) {
          in_names.push_back(h->first.c_str());
          in_values.push_back(h->second);
        } else if (c != cases[ci].end()) {
          in_names.push_back(c->first.c_str());
          owned.push_back(as_tensor(c->second));
          in_values.push_back(owned.back());
        }
      }
      for (const auto& m : marked) out_names.push_back(m.c_str());
      std::vector<Ort::Value> got;
      try {
        std::vector<OrtValue*> outs(out_names.size(), nullptr);
        Ort::ThrowOnError(Ort::GetApi().Run(sess, nullptr, in_names.data(), in_values.data(),
                                            in_values.size(), out_names.data(),
                                            out_names.size(), outs.data()));
        for (OrtValue* v : outs) got.emplace_back(v);
      } catch (const Ort::Exception& e) {
        throw run_error(e);
      }
      in_values.clear();
      owned.clear();
      for (size_t k = 0; k < marked.size(); ++k) {
        const std::string& name = marked[k];
        Ort::Value& v = got[k];
        if (wanted.count(name) && v.IsTensor()) {
          auto info = v.GetTensorTypeAndShapeInfo();
          std::optional<npy::DType> dt;
          try {
            dt = dtype_of(info.GetElementType());
          } catch (const npy::Error&) {
            // no .npy form: recorded as not captured
          }
          if (dt)  // a write that fails is the job's error, never a tensor quietly left out
            emit(ci, name, *dt, info.GetShape(),
                 info.GetElementCount() ? v.GetTensorRawData() : nullptr);
        }
        if (last_read.count(name) && last_read[name] >= last) held.emplace(name, std::move(v));
      }
      for (auto it = held.begin(); it != held.end();)
        it = last_read.count(it->first) && last_read[it->first] < last ? held.erase(it) : ++it;
      if (ci == 0) spans.push_back({first, last});
      first = last;
    }
  }
  if (pack) pack->close();
  result["dump"] = {{"budget_bytes", budget}, {"ms", ms_since(t0)}, {"cases", records},
                    {"segments", spans}, {"nodes", n}, {"measured", measured},
                    {"subgraph_tensors", g.body_tensors}};
}

}  // namespace vr
