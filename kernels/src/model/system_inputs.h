// model/system_inputs.h: the parts of a MACE plan that its per-system inputs (mace's
// embedding_specs: total charge, spin) change, computed for given values without copying
// the plan. Model::with_system_inputs folds them into a plan copy; Engine::set_system_inputs
// swaps them into a running engine, keeping everything that does not depend on them.
#pragma once

#include <vector>

#include "model/plan.h"

namespace e3fuse {

struct SystemInputFold {
  std::vector<double> embedding;  // [num_species][embedding_dim]: species embedding + v
  std::vector<double> e0;         // [num_species]: e0 + embedding readout (if any)
};

// For a plan with per-system inputs, folded or not (a folded plan is refolded from the
// embedding and e0 it had before folding). Throws Error on a wrong count or a value
// outside a categorical input's classes.
SystemInputFold fold_system_inputs(const ModelPlan& plan, const std::vector<double>& values);

}  // namespace e3fuse
