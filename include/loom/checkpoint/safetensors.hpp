#pragma once
// safetensors files (Hugging Face's format for weights) read and written: an 8-byte
// little-endian header length N, N bytes of JSON ({"NAME": {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"KEY": "VALUE"}}, padded with spaces to
// a multiple of 8), then the tensors' bytes, little-endian, each [BEGIN, END) of that buffer.
// Also Hugging Face's sharded layout: model-00001-of-00003.safetensors ... and
// model.safetensors.index.json ({"metadata": {"total_size": BYTES}, "weight_map": {NAME:
// FILE}}).
//
//   auto weights = loom::safetensors::load("model.safetensors");    // mapped, no copy
//   loom::safetensors::load_into(*model, "model.safetensors");      // names and shapes checked
//   loom::safetensors::save("out.safetensors", loom::safetensors::named_tensors(*model),
//                           {{"format", "pt"}});
//
// Reading validates as safetensors' own reader does, strictly: the header length bounded
// (100 MB) and inside the file, the JSON an object of known dtypes, non-negative shapes and
// offsets, each tensor's bytes exactly its shape times its dtype's size, the tensors laid end to
// end from 0 to the end of the file (no gap, no overlap); anything else is a loom::Error
// naming the file and what is wrong. The JSON is parsed by nlohmann/json (Debian's
// nlohmann-json3-dev: a header-only library that parses and writes; the headers are a few
// kilobytes, so simdjson's speed buys nothing here). Declarations only;
// src/checkpoint/safetensors.cpp.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace loom::safetensors {

/// Named tensors, in the order of the file's bytes, and the header's "__metadata__".
struct Tensors {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  /// The tensor named `name`; a loom::Error naming it when there is none.
  const at::Tensor& at(std::string_view name) const;
};

/// The tensors of a safetensors file. Each is a view of the file mapped into memory (read-only
/// file, copy-on-write pages) where its bytes are aligned for its dtype, a copy otherwise; CPU,
/// contiguous. A mapped tensor reads the file as it is on disk: do not rewrite the file in place
/// while one lives (loom's saves write a new file and rename it).
Tensors load(const std::filesystem::path& path);

/// The tensors of a safetensors file held in memory (`bytes`), each a copy; `what` names it in
/// errors.
Tensors load_bytes(std::string_view bytes, const std::string& what = "safetensors bytes");

/// `tensors` written to `path` (atomically: a temporary file renamed over it) with `metadata`
/// as "__metadata__": each as a contiguous CPU copy, laid out as Python's safetensors lays
/// them out (by its dtype enumeration, U64 first, BOOL last, then by name), so that the same
/// tensors make the same bytes. Names must be distinct and not
/// "__metadata__"; dtypes those the format has.
void save(const std::filesystem::path& path,
          const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata = {});

/// The parameters and buffers of `module` by their state_dict names (Python's order).
std::vector<std::pair<std::string, at::Tensor>> named_tensors(const torch::nn::Module& module);

/// What load_into found.
struct LoadReport {
  std::vector<std::string> missing;     // in the module, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the module
  std::vector<std::string>
      mismatched;  // in both, of other shapes: "NAME: [2, 3] in the file, [3, 2] in the module"
};

/// The file's tensors copied into `module`'s parameters and buffers of the same names (cast to
/// their dtypes and moved to their devices). `path` is a .safetensors file or a sharded
/// layout's index (.json). With `strict`, any name missing on either side or any shape that
/// differs is one loom::Error listing them all, and nothing is copied; without it, what
/// matches is copied and the rest reported.
LoadReport load_into(torch::nn::Module& module, const std::filesystem::path& path,
                     bool strict = true);

/// The tensors of a sharded layout, through its index (model.safetensors.index.json): every
/// file it names, each mapped as load() maps it; every name of the index in its file, no file
/// outside the index's directory.
Tensors load_sharded(const std::filesystem::path& index);

/// `tensors` written as Hugging Face's sharded layout in `dir`: PREFIX-0000K-of-0000N.safetensors
/// files of at most `max_shard_bytes` of tensor data each (a larger tensor alone in its file),
/// in the given order, and PREFIX.safetensors.index.json; returns the index's path.
std::filesystem::path save_sharded(const std::filesystem::path& dir,
                                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                   std::size_t max_shard_bytes,
                                   const std::map<std::string, std::string>& metadata = {},
                                   const std::string& prefix = "model");

}  // namespace loom::safetensors
