#pragma once
// loom::optim's learning-rate schedulers, all of them: one include per scheduler's header,
// below (the list of schedulers is this one); their base is optim/lr_scheduler_base.hpp
// (docs/optim.md, "Learning-rate schedulers").
#include <loom/optim/chained_scheduler.hpp>
#include <loom/optim/cosine_annealing_lr.hpp>
#include <loom/optim/cosine_annealing_warm_restarts.hpp>
#include <loom/optim/exponential_lr.hpp>
#include <loom/optim/lambda_lr.hpp>
#include <loom/optim/linear_lr.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/optim/multi_step_lr.hpp>
#include <loom/optim/one_cycle_lr.hpp>
#include <loom/optim/polynomial_lr.hpp>
#include <loom/optim/reduce_lr_on_plateau.hpp>
#include <loom/optim/step_lr.hpp>
#include <loom/optim/warmup_cosine_lr.hpp>
