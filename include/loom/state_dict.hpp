#pragma once
// Forwards to loom/state/state_dict.hpp, where StateDict and state::Dict are declared.
#include <loom/state/state_dict.hpp>
