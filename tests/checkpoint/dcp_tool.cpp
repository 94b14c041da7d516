// The loom side of tests/checkpoint/dcp_parity.py:
//   loom_dcp_tool to-torch DIR OUT   the DCP checkpoint in DIR (Python's dcp.save) read by
//                                    loom::checkpoint::dcp::load and written to OUT as one
//                                    torch.save file (loom's save_value)
// Prints what it read; a loom::Error is printed and exits 1.
#include <cstdio>
#include <exception>
#include <string>

#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/io.hpp>

int main(int argc, char** argv) {
  namespace dcp = loom::checkpoint::dcp;
  if (argc != 4 || std::string(argv[1]) != "to-torch") {
    std::fprintf(stderr, "usage: loom_dcp_tool to-torch DIR OUT\n");
    return 2;
  }
  try {
    const dcp::Metadata m = dcp::read_metadata(argv[2]);
    const c10::IValue value = dcp::load(argv[2]);
    loom::checkpoint::save_value(argv[3], value);
    std::printf("loom read %zu tensors and %zu objects (DCP version %s) from %s\n",
                m.tensors.size(), m.objects.size(), m.version.c_str(), argv[2]);
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
