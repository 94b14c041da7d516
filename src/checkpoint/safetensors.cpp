// safetensors files (include/loom/checkpoint/safetensors.hpp): the header parsed and checked
// with nlohmann/json, the tensors mapped (checkpoint/mapped.hpp) or copied, the writer, and
// Hugging Face's sharded layout.
#include <loom/checkpoint/safetensors.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <memory>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <loom/checkpoint/mapped.hpp>
#include <loom/error.hpp>

#include "temp_file.hpp"

namespace loom::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors files are little-endian; loom reads them on little-endian machines");

namespace {

// Read into nlohmann::json (its objects are std::maps: a header of many names parses in
// n log n; the order of the tensors is taken from their offsets); the header written in the
// order safetensors' writer gives it (ordered_json keeps insertion order).
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

/// safetensors' own bound on the header (MAX_HEADER_SIZE in its reader).
constexpr std::uint64_t max_header = 100'000'000;

struct Dtype {
  const char* name;
  c10::ScalarType type;
};
// The names safetensors writes and torch's types for them, in the order of safetensors' own
// Dtype enumeration, by which its writer lays the tensors out (the last first).
constexpr std::array<Dtype, 19> dtypes{{{"BOOL", c10::kBool},
                                        {"U8", c10::kByte},
                                        {"I8", c10::kChar},
                                        {"F8_E5M2", c10::kFloat8_e5m2},
                                        {"F8_E4M3", c10::kFloat8_e4m3fn},
                                        {"F8_E8M0", c10::kFloat8_e8m0fnu},
                                        {"F8_E4M3FNUZ", c10::kFloat8_e4m3fnuz},
                                        {"F8_E5M2FNUZ", c10::kFloat8_e5m2fnuz},
                                        {"I16", c10::kShort},
                                        {"U16", c10::kUInt16},
                                        {"F16", c10::kHalf},
                                        {"BF16", c10::kBFloat16},
                                        {"I32", c10::kInt},
                                        {"U32", c10::kUInt32},
                                        {"F32", c10::kFloat},
                                        {"C64", c10::kComplexFloat},
                                        {"F64", c10::kDouble},
                                        {"I64", c10::kLong},
                                        {"U64", c10::kUInt64}}};

/// The place of `type` in `dtypes`.
std::size_t rank_of(c10::ScalarType type) {
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i].type == type) return i;
  }
  return 0;
}

const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : dtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const char* name_of(c10::ScalarType type, const std::string& tensor) {
  for (const auto& d : dtypes) {
    if (d.type == type) return d.name;
  }
  throw Error("loom::safetensors: the tensor '" + tensor + "' is of dtype " +
              std::string(c10::toString(type)) + ", which safetensors files do not hold");
}

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw Error("loom::safetensors: " + what + " is not a valid safetensors file: " + why);
}

/// One tensor of a header: its name, dtype, shape and [begin, end) of the data buffer.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// Whether `value` is a non-negative integer that fits int64 (then in `out`).
bool count(const json& value, std::uint64_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<std::uint64_t>();
    return out <= static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = static_cast<std::uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

/// The header of a file of `size` bytes whose first bytes are `head` (at least 8), checked:
/// its entries in the order of their bytes, its metadata, and where the data buffer starts.
struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;
};

std::uint64_t header_length(const char* first8) {
  std::uint64_t n = 0;
  std::memcpy(&n, first8, 8);
  return n;
}

Header parse_header(std::string_view text, std::uint64_t buffer_size, const std::string& what) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    bad(what, std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!root.is_object()) bad(what, "its header is not a JSON object");
  Header h;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(what, "its __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          bad(what, "its __metadata__ value of '" + m.key() + "' is not a string");
        }
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "the tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || v.size() != 3) {
      bad(what, where + " is not {dtype, shape, data_offsets}");
    }
    Entry e;
    e.name = name;
    if (!v["dtype"].is_string() ||
        (e.dtype = dtype_named(v["dtype"].get<std::string>())) == nullptr) {
      bad(what, where + " has an unknown dtype " + v["dtype"].dump());
    }
    if (!v["shape"].is_array()) bad(what, where + " has a shape that is not a list");
    std::uint64_t elements = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      std::uint64_t n = 0;
      if (!count(d, n)) bad(what, where + " has a dimension that is not a non-negative integer");
      e.shape.push_back(static_cast<int64_t>(n));
      if (n != 0 && elements > std::numeric_limits<std::uint64_t>::max() / n) overflow = true;
      elements *= n;
    }
    const json& offsets = v["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !count(offsets[0], e.begin) ||
        !count(offsets[1], e.end) || e.end < e.begin) {
      bad(what, where + " has data_offsets that are not [begin, end] with begin <= end");
    }
    const auto item = static_cast<std::uint64_t>(c10::elementSize(e.dtype->type));
    if (overflow ||
        (elements != 0 && item > std::numeric_limits<std::uint64_t>::max() / elements) ||
        elements * item != e.end - e.begin) {
      bad(what, where + " holds " + std::to_string(e.end - e.begin) +
                    " bytes where its shape and dtype make " +
                    (overflow ? std::string("more than 2^64") : std::to_string(elements * item)));
    }
    h.entries.push_back(std::move(e));
  }
  // Laid end to end over the whole buffer, as safetensors' reader requires.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& e : h.entries) {
    if (e.begin != at) {
      bad(what, "the tensor '" + e.name + "' starts at byte " + std::to_string(e.begin) +
                    " of the data where " +
                    (e.begin < at ? "another tensor's bytes end at " : "the bytes before end at ") +
                    std::to_string(at) + (e.begin < at ? " (they overlap)" : " (a gap)"));
    }
    at = e.end;
  }
  if (at != buffer_size) {
    bad(what, "its tensors cover " + std::to_string(at) + " bytes of a data buffer of " +
                  std::to_string(buffer_size));
  }
  return h;
}

/// The checked header of the `size` bytes at `data` (the whole file).
Header read_header(const char* data, std::uint64_t size, const std::string& what) {
  if (size < 8) bad(what, "it is shorter than the 8 bytes of its header's length");
  const std::uint64_t n = header_length(data);
  if (n > max_header) {
    bad(what, "its header claims " + std::to_string(n) + " bytes (at most " +
                  std::to_string(max_header) + ")");
  }
  if (n > size - 8) {
    bad(what,
        "its header claims " + std::to_string(n) + " bytes of a file of " + std::to_string(size));
  }
  Header h = parse_header(std::string_view(data + 8, n), size - 8 - n, what);
  h.data_start = 8 + n;
  return h;
}

/// `bytes` (uint8, the tensor's) as a tensor of `e`'s dtype and shape: a view where aligned.
at::Tensor typed(const at::Tensor& bytes, const Entry& e) {
  const auto item = static_cast<std::uintptr_t>(c10::elementSize(e.dtype->type));
  const auto address = reinterpret_cast<std::uintptr_t>(bytes.data_ptr());
  const at::Tensor source = address % item == 0 ? bytes : bytes.clone();
  if (e.dtype->type == c10::kByte) return source.reshape(e.shape);
  if (source.numel() == 0) return at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
  return source.view(e.dtype->type).reshape(e.shape);
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

}  // namespace

const at::Tensor& Tensors::at(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw Error("loom::safetensors: no tensor named '" + std::string(name) + "'");
}

Tensors load(const std::filesystem::path& path) {
  const std::string what = path.string();
  auto file = checkpoint::MappedFile::open(path);
  if (!file) {  // empty, unreadable, or a file system without mmap: read it
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("loom::safetensors: cannot read " + what);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return load_bytes(bytes, what);
  }
  const Header h = read_header(file->data(), file->size(), what);
  Tensors out;
  out.metadata = h.metadata;
  for (const auto& e : h.entries) {
    const at::Tensor bytes = file->bytes(h.data_start + e.begin, e.end - e.begin, e.name);
    out.tensors.emplace_back(e.name, typed(bytes, e));
  }
  return out;
}

Tensors load_bytes(std::string_view bytes, const std::string& what) {
  const Header h = read_header(bytes.data(), bytes.size(), what);
  Tensors out;
  out.metadata = h.metadata;
  for (const auto& e : h.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    if (e.end > e.begin) {
      std::memcpy(t.data_ptr(), bytes.data() + h.data_start + e.begin, e.end - e.begin);
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save(const std::filesystem::path& path,
          const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  // Python's order: by safetensors' dtype enumeration, the last first (the wider dtypes come
  // first, so each tensor is aligned for its own), then by name.
  std::vector<std::pair<std::string, at::Tensor>> order;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw Error("loom::safetensors: a tensor cannot be named __metadata__");
    if (!names.insert(name).second) {
      throw Error("loom::safetensors: the name '" + name + "' is given twice");
    }
    (void)name_of(t.scalar_type(), name);
    order.emplace_back(name, t.detach().to(at::kCPU).contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    const auto ra = rank_of(a.second.scalar_type()), rb = rank_of(b.second.scalar_type());
    return ra != rb ? ra > rb : a.first < b.first;
  });
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::uint64_t at = 0;
  for (const auto& [name, t] : order) {
    const auto n = static_cast<std::uint64_t>(t.nbytes());
    header[name] = {{"dtype", name_of(t.scalar_type(), name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {at, at + n}}};
    at += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  checkpoint::detail::write_atomically(
      path, "loom::safetensors",
      [&](checkpoint::detail::TempFile& file) {
        const std::uint64_t length = text.size();
        file.write(&length, 8);
        file.write(text.data(), text.size());
        for (const auto& [name, t] : order) file.write(t.data_ptr(), t.nbytes());
      },
      /*sync=*/true);
}

std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

LoadReport load_into(torch::nn::Module& module, const std::filesystem::path& path, bool strict) {
  const Tensors file = path.extension() == ".json" ? load_sharded(path) : load(path);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : file.tensors) by_name.emplace(name, t);
  LoadReport report;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::set<std::string> seen;
  for (const auto& [name, target] : named_tensors(module)) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      report.missing.push_back(name);
      continue;
    }
    seen.insert(name);
    if (it->second.sizes() != target.sizes()) {
      report.mismatched.push_back(name + ": " + shape_text(it->second.sizes()) + " in the file, " +
                                  shape_text(target.sizes()) + " in the module");
      continue;
    }
    copies.emplace_back(target, it->second);
  }
  for (const auto& [name, t] : file.tensors) {
    if (seen.count(name) == 0) report.unexpected.push_back(name);
  }
  if (strict &&
      (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty())) {
    std::string text = "loom::safetensors: " + path.string() + " does not fit the module:";
    auto list = [&](const char* kind, const std::vector<std::string>& names) {
      if (names.empty()) return;
      text += std::string("\n  ") + kind + " (" + std::to_string(names.size()) + "): ";
      for (std::size_t i = 0; i < names.size() && i < 5; ++i) text += (i ? ", " : "") + names[i];
      if (names.size() > 5) text += ", ... and " + std::to_string(names.size() - 5) + " more";
    };
    list("missing", report.missing);
    list("unexpected", report.unexpected);
    list("of another shape", report.mismatched);
    text += "\n  (strict = false loads the tensors that match)";
    throw Error(text);
  }
  at::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.detach().copy_(source);
  return report;
}

Tensors load_sharded(const std::filesystem::path& index) {
  const std::string what = index.string();
  std::ifstream in(index);
  if (!in) throw Error("loom::safetensors: cannot read the index " + what);
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    throw Error("loom::safetensors: the index " + what + " is not JSON (" + e.what() + ")");
  }
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    throw Error("loom::safetensors: the index " + what + " has no object 'weight_map'");
  }
  std::map<std::string, std::vector<std::string>> by_file;  // file -> names, in the map's order
  for (auto it = root["weight_map"].begin(); it != root["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      throw Error("loom::safetensors: the index " + what + " names no file for '" + it.key() + "'");
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      throw Error("loom::safetensors: the index " + what + " names '" + file +
                  "', not a file beside it");
    }
    by_file[file].push_back(it.key());
  }
  Tensors out;
  if (root.contains("metadata") && root["metadata"].is_object()) {
    for (auto m = root["metadata"].begin(); m != root["metadata"].end(); ++m) {
      out.metadata[m.key()] =
          m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
    }
  }
  for (const auto& [file, names] : by_file) {
    const Tensors part = load(index.parent_path() / file);
    for (const auto& name : names) {
      try {
        out.tensors.emplace_back(name, part.at(name));
      } catch (const Error&) {
        throw Error("loom::safetensors: the index " + what + " puts '" + name + "' in " + file +
                    ", which does not hold it");
      }
    }
  }
  return out;
}

std::filesystem::path save_sharded(const std::filesystem::path& dir,
                                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                   std::size_t max_shard_bytes,
                                   const std::map<std::string, std::string>& metadata,
                                   const std::string& prefix) {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  std::size_t bytes = 0, total = 0;
  for (const auto& item : tensors) {
    const auto n = static_cast<std::size_t>(item.second.nbytes());
    if (!shards.back().empty() && bytes + n > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(item);
    bytes += n;
    total += n;
  }
  std::filesystem::create_directories(dir);
  json weight_map = json::object();
  const auto count_of = shards.size();
  for (std::size_t i = 0; i < count_of; ++i) {
    std::ostringstream name;
    name << prefix << "-" << std::setw(5) << std::setfill('0') << i + 1 << "-of-" << std::setw(5)
         << std::setfill('0') << count_of << ".safetensors";
    save(dir / name.str(), shards[i], metadata);
    for (const auto& [tensor, t] : shards[i]) weight_map[tensor] = name.str();
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const auto path = dir / (prefix + ".safetensors.index.json");
  const std::string text = index.dump(2) + "\n";
  checkpoint::detail::write_atomically(
      path, "loom::safetensors",
      [&](checkpoint::detail::TempFile& file) { file.write(text.data(), text.size()); },
      /*sync=*/true);
  return path;
}

}  // namespace loom::safetensors
