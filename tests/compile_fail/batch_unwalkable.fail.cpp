// expect-error: loom::batch: the batch holds a type loom cannot walk
#include <map>
#include <string>
#include <tuple>

#include <loom/batch/walk.hpp>
struct Boxes {  // holds a tensor, but is neither adapted nor opaque
  at::Tensor xyxy;
};
#ifndef LOOM_FAIL
BOOST_HANA_ADAPT_STRUCT(Boxes, xyxy);
#endif
at::Tensor identity(const at::Tensor& t) { return t; }
auto walk(const std::tuple<at::Tensor, std::map<std::string, Boxes>>& b) {
  return loom::batch::map(b, identity);
}
