// The loom side of tests/checkpoint/dcp_parity.py and of dist.fsdp's DCP checks:
//   loom_dcp_tool to-torch DIR OUT            the DCP checkpoint in DIR (Python's dcp.save) read
//                                             by loom::checkpoint::dcp::load and written to OUT
//                                             as one torch.save file (loom's save_value)
//   loom_dcp_tool rows DIR OUT RANK WORLD     the same, each tensor of one dimension or more
//                                             read as the rows rank RANK of WORLD holds under
//                                             FSDP2's cut (dcp::load with a RowsOf): prints
//                                             the items and bytes read against the directory's
// Prints what it read; a loom::Error is printed and exits 1.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/shards.hpp>

int main(int argc, char** argv) {
  namespace dcp = loom::checkpoint::dcp;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!((mode == "to-torch" && argc == 4) || (mode == "rows" && argc == 6) ||
        (mode == "from-torch" && argc == 4))) {
    std::fprintf(stderr,
                 "usage: loom_dcp_tool to-torch DIR OUT | rows DIR OUT RANK WORLD | "
                 "from-torch FILE DIR\n");
    return 2;
  }
  try {
    if (mode == "from-torch") {
      dcp::save(argv[3], loom::checkpoint::load_value(argv[2]));
      const dcp::Metadata m = dcp::read_metadata(argv[3]);
      std::printf("loom wrote %zu tensors and %zu objects of %s as the DCP directory %s\n",
                  m.tensors.size(), m.objects.size(), argv[2], argv[3]);
      return 0;
    }
    const dcp::Metadata m = dcp::read_metadata(argv[2]);
    dcp::ReadCount read;
    dcp::RowsOf rows;
    if (mode == "rows") {
      const int64_t rank = std::stoll(argv[4]), world = std::stoll(argv[5]);
      rows = [=](const std::vector<dcp::PathStep>&,
                 const std::vector<int64_t>& size) -> std::optional<std::pair<int64_t, int64_t>> {
        const auto r = loom::checkpoint::rows_of(size[0], rank, world);
        return std::pair{r.first, r.count};
      };
    }
    const c10::IValue value = dcp::load(argv[2], c10::kCPU, rows, &read);
    loom::checkpoint::save_value(argv[3], value);
    int64_t items = static_cast<int64_t>(m.objects.size()), bytes = 0;
    for (const auto& [key, where] : m.objects) bytes += static_cast<int64_t>(where.length);
    for (const auto& [key, t] : m.tensors) {
      items += static_cast<int64_t>(t.chunks.size());
      for (const auto& c : t.chunks) bytes += static_cast<int64_t>(c.where.length);
    }
    std::printf(
        "loom read %zu tensors and %zu objects (DCP version %s) from %s: %lld of %lld "
        "items, %lld of %lld bytes\n",
        m.tensors.size(), m.objects.size(), m.version.c_str(), argv[2],
        static_cast<long long>(read.items), static_cast<long long>(items),
        static_cast<long long>(read.bytes), static_cast<long long>(bytes));
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
