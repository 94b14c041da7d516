// The loom side of tests/checkpoint/safetensors_parity.py:
//   loom_safetensors_tool copy IN OUT            IN (a .safetensors file, or a sharded layout's
//                                                index .json) read, OUT written as one file
//   loom_safetensors_tool shard IN DIR BYTES     IN read, written as Hugging Face's sharded
//                                                layout in DIR, at most BYTES of data a file
// The tensors keep their names, dtypes, shapes and values; the metadata is kept. Prints what it
// read; a loom::Error is printed and exits 1.
#include <cstdio>
#include <exception>
#include <string>

#include <loom/checkpoint/safetensors.hpp>

int main(int argc, char** argv) {
  namespace st = loom::safetensors;
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if ((mode != "copy" || argc != 4) && (mode != "shard" || argc != 5)) {
      std::fprintf(stderr, "usage: loom_safetensors_tool copy IN OUT | shard IN DIR BYTES\n");
      return 2;
    }
    const std::string in = argv[2];
    const st::Tensors t = in.ends_with(".json") ? st::load_sharded(in) : st::load(in);
    std::printf("loom read %zu tensors and %zu metadata entries from %s\n", t.tensors.size(),
                t.metadata.size(), in.c_str());
    if (mode == "copy") {
      st::save(argv[3], t.tensors, t.metadata);
    } else {
      const auto index = st::save_sharded(argv[3], t.tensors, std::stoull(argv[4]), t.metadata);
      std::printf("loom wrote %s\n", index.string().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_safetensors_tool: %s\n", e.what());
    return 1;
  }
}
