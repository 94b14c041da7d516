// The model-side headers both compile-time TUs include (benchmarks/compile_time/README in
// docs/benchmarks.md): what any training step needs, loom or not.
#pragma once
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
