#pragma once
// Catch2 for loom's tests. c10/util/Logging.h defines a glog-style CHECK macro that aborts;
// included after Catch it would silently replace Catch's CHECK. Including it first, then
// Catch, makes CHECK Catch's in every test file, whatever torch headers come after.
#include <c10/util/Logging.h>
#undef CHECK
#include <catch2/catch.hpp>
