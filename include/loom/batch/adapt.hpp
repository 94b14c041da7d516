#pragma once
// How user types take part in batch walking.
//
// A struct whose members hold tensors is adapted with Boost.Hana, at global scope:
//
//   struct Pair { torch::Tensor image; std::vector<int64_t> ids; };
//   BOOST_HANA_ADAPT_STRUCT(Pair, image, ids);
//
// (or defined with BOOST_HANA_DEFINE_STRUCT). loom never reflects a struct it was not told
// about: an unadapted struct is a compile error, because it might hide tensors.
// A type that holds no tensors, or whose tensors must stay put, opts out with loom::opaque.
#include <type_traits>

#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/define_struct.hpp>

namespace loom {

/// Specialise as std::true_type for a type the batch walker passes through untouched.
template <class T>
struct opaque : std::false_type {};

}  // namespace loom
